"""Tests for the ast_t5 fairseq model (ast_t5/models): registration, presets, init, padding,
training through fairseq's Trainer, activation checkpointing. Tiny sizes, CPU."""
import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY

from ast_t5.models import AstT5Config, AstT5Model
from ast_t5.models.config import config_from
from ast_t5.models.presets import ARCH_PRESETS, apply_preset

FAMILIES = ["t5_v11_tiny", "ast_t5_paper_tiny"]
EXPECTED_ARCHS = ["ast_t5_paper_tiny", "ast_t5_paper_small", "ast_t5_paper_base", "ast_t5_paper_large",
                  "t5_v11_tiny", "t5_v11_small", "t5_v11_base", "t5_v11_large", "t5_v11_xl"]
PAD, EOS = 1, 2




def make_dictionary(size: int = 60) -> Dictionary:
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"tok{i}")
    return d


def make_batch(vocab: int, bsz=4, src_len=11, tgt_len=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (bsz, src_len), generator=g)
    tgt = torch.randint(4, vocab, (bsz, tgt_len), generator=g)
    src[1, -3:] = PAD
    tgt[:, -1] = EOS
    prev = torch.cat([torch.full((bsz, 1), EOS), tgt[:, :-1]], dim=1)
    return src, prev, tgt


def test_model_and_architectures_are_registered():
    assert MODEL_REGISTRY["ast_t5"] is AstT5Model
    assert MODEL_DATACLASS_REGISTRY["ast_t5"] is AstT5Config
    for arch in EXPECTED_ARCHS:
        assert ARCH_MODEL_REGISTRY[arch] is AstT5Model, arch
    assert set(ARCH_PRESETS) == set(EXPECTED_ARCHS)


def test_presets_fill_only_fields_the_user_left_unset():
    args = argparse.Namespace(embed_dim=96, dropout=0.0)
    apply_preset(args, "t5_v11_small")
    cfg = config_from(args)
    assert cfg.embed_dim == 96 and cfg.dropout == 0.0  # the user's values win
    assert (cfg.ffn_dim, cfg.num_heads, cfg.head_dim, cfg.encoder_layers) == (1024, 6, 64, 8)
    assert str(cfg.family) == "t5_v11" and cfg.rel_pos_buckets == 32


def test_hydra_config_gets_the_preset_sizes_and_keeps_user_values():
    """fairseq-hydra-train merges dataclass defaults into model._name=<arch> before the preset runs."""
    from fairseq.dataclass.initialize import add_defaults
    from fairseq.models import build_model
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_name": "t5_v11_tiny", "dropout": 0.0, "ffn_dim": 48}})
    add_defaults(cfg)
    d = make_dictionary()
    model = build_model(cfg.model, argparse.Namespace(source_dictionary=d, target_dictionary=d))
    assert (model.cfg.embed_dim, model.cfg.encoder_layers, model.cfg.ffn_dim, model.cfg.dropout) == (32, 2, 48, 0.0)
    plain = OmegaConf.create({"model": {"_name": "ast_t5"}})
    add_defaults(plain)
    with torch.device("meta"):
        base = build_model(plain.model, argparse.Namespace(source_dictionary=d, target_dictionary=d))
    assert (base.cfg.embed_dim, base.cfg.encoder_layers, str(base.cfg.family)) == (768, 12, "t5_v11")


@pytest.mark.parametrize("field,value,message", [
    ("attention_backend", "magic", "attention_backend"), ("rel_pos_buckets", 7, "rel_pos_buckets"),
    ("family", "t5_v2", "family"), ("dropout", 1.0, "dropout"), ("embed_dim", 0, "embed_dim"),
    ("compile_scope", "stack", "compile_scope")])
def test_invalid_config_values_are_rejected_in_one_line(field, value, message):
    with pytest.raises(ValueError, match=message):
        AstT5Model.from_dictionary(make_dictionary(), arch="t5_v11_tiny", **{field: value})


def test_source_and_target_must_share_one_dictionary():
    task = argparse.Namespace(source_dictionary=make_dictionary(60), target_dictionary=make_dictionary(70))
    with pytest.raises(ValueError, match="shared source/target dictionary"):
        AstT5Model.build_model(argparse.Namespace(_name="t5_v11_tiny", **ARCH_PRESETS["t5_v11_tiny"]), task)


@pytest.mark.parametrize("arch", FAMILIES)
def test_initial_loss_is_near_ln_vocab(arch):
    """Unit-variance logits give ln(V) + 1/2; a std-1 untied head (Hugging Face's init) gives ~ln(V) + d/2."""
    d = make_dictionary(2000)
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch=arch).eval()
    src, prev, tgt = make_batch(len(d), bsz=8, src_len=40, tgt_len=20)
    loss = F.cross_entropy(model(src, None, prev)[0].view(-1, len(d)), tgt.view(-1)).item()
    assert math.log(len(d)) - 0.1 < loss < math.log(len(d)) + 1.0


def test_paper_init_reads_fan_in_and_fan_out_from_their_own_dimensions():
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(make_dictionary(), arch="ast_t5_paper_tiny", embed_dim=64, ffn_dim=512,
                                       num_heads=4, head_dim=16)
    wi = model.encoder.layers[0].ffn.wi.weight  # (512, 64)
    assert abs(wi.std().item() - (512 + 64) ** -0.5) < 0.002  # the original's bug: (2 * 512) ** -0.5
    assert (model.encoder.layers[0].rel_pos_bias.embedding.weight == 0).all()
    assert (model.encoder.embed_tokens.weight[PAD] == 0).all()


def test_t5_v11_init_follows_t5():
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(make_dictionary(500), arch="t5_v11_tiny", embed_dim=64, ffn_dim=256,
                                       num_heads=4, head_dim=16)
    qkv = model.encoder.layers[0].self_attn.qkv_proj.weight  # rows: q (64), k (64), v (64)
    assert abs(qkv[:64].std().item() - (64 * 16) ** -0.5) < 0.004
    assert abs(qkv[64:].std().item() - 64 ** -0.5) < 0.006
    assert abs(model.decoder.output_projection.weight.std().item() - 64 ** -0.5) < 0.005
    assert abs(model.encoder.embed_tokens.weight.std().item() - 1.0) < 0.03


@pytest.mark.parametrize("arch", FAMILIES)
def test_padding_does_not_change_real_positions(arch):
    """Extra source padding (right, and left for learned positions) leaves every output unchanged."""
    d = make_dictionary()
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch=arch).eval()
    src, prev, _ = make_batch(len(d), bsz=2)
    src[1, -3:] = src[1, :3]  # no padding in the baseline
    base = model(src, None, prev)[0]
    right = torch.cat([src, torch.full((2, 5), PAD)], dim=1)
    left = torch.cat([torch.full((2, 4), PAD), src], dim=1)
    assert (model(right, None, prev)[0] - base).abs().max() < 1e-5
    if arch.startswith("ast_t5_paper"):
        assert (model(left, None, prev)[0] - base).abs().max() < 1e-5


def fairseq_cli_cfg(arch: str, extra=()):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ["/nonexistent-data", "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
            "--arch", arch, "--attention-backend", "torch", "--dropout", "0.0", "--optimizer", "adamw_torch",
            "--lr", "1e-2", "--lr-scheduler", "fixed", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--max-tokens", "1000", "--cpu", "--seed", "1", *extra]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


@pytest.mark.parametrize("arch", FAMILIES)
def test_trains_through_fairseq_trainer(arch):
    """The legacy CLI path: --arch preset + field override -> task.build_model -> Trainer.train_step."""
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    cfg = fairseq_cli_cfg(arch, ["--ffn-dim", "48"])
    d = make_dictionary()
    task = TranslationTask(cfg.task, d, d)
    model = task.build_model(cfg.model)
    assert isinstance(model, AstT5Model) and model.cfg.ffn_dim == 48 and model.cfg.embed_dim == 32
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    src, prev, tgt = make_batch(len(d))
    sample = {"id": torch.arange(4), "nsentences": 4, "ntokens": int(tgt.ne(PAD).sum()), "target": tgt,
              "net_input": {"src_tokens": src, "src_lengths": src.ne(PAD).sum(1), "prev_output_tokens": prev}}
    losses = [trainer.train_step([sample])["loss"] for _ in range(10)]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.parametrize("arch", FAMILIES)
def test_activation_checkpointing_gives_the_same_loss_and_gradients(arch):
    d = make_dictionary()
    src, prev, tgt = make_batch(len(d))
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = AstT5Model.from_dictionary(d, arch=arch, checkpoint_activations=ckpt, attention_backend="torch",
                                           dropout=0.1, attention_dropout=0.1, activation_dropout=0.1).train()
        torch.manual_seed(1)  # the same dropout masks in both runs
        loss = F.cross_entropy(model(src, None, prev)[0].view(-1, len(d)), tgt.view(-1), ignore_index=PAD)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    assert all(torch.allclose(grads_a[n], grads_b[n], atol=1e-6) for n in grads_a)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour of attention_backend=fused")
def test_fused_backend_without_a_gpu_warns_at_build_and_raises_at_forward(caplog):
    d = make_dictionary()
    with caplog.at_level("WARNING", logger="ast_t5.models.ast_t5_model"):
        model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", attention_backend="fused")
    assert "attention_backend=fused cannot run" in caplog.text
    src, prev, _ = make_batch(len(d))
    with pytest.raises(RuntimeError, match="backend='fused'.* cannot run"):
        model(src, None, prev)
