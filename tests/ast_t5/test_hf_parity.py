"""Parity of our T5 v1.1 family with Hugging Face T5ForConditionalGeneration (ast_t5/models/hf_conversion.py).

Models are built from configs with random weights (nothing is downloaded).
"""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from ast_t5.models import AstT5Model
from ast_t5.models.hf_conversion import (
    ast_t5_config_from_hf,
    hf_dropout_rate,
    hf_t5_config,
    hf_to_ours_state_dict,
    ours_to_hf_state_dict,
)
from ast_t5.models.presets import ARCH_PRESETS

from .test_model import PAD, make_batch, make_dictionary  # noqa: F401

transformers = pytest.importorskip("transformers")
MAX_ABS_DIFF = 1e-5  # fp32


def build_pair(backend="torch", seed=0, **overrides):
    torch.manual_seed(seed)
    ours = AstT5Model.from_dictionary(make_dictionary(), arch="t5_v11_tiny", attention_backend=backend,
                                      **overrides).eval()
    hf = transformers.T5ForConditionalGeneration(hf_t5_config(ours.cfg, len(ours.decoder.dictionary))).eval()
    hf.load_state_dict(ours_to_hf_state_dict(ours.state_dict()), strict=True)
    return ours, hf


def hf_logits(hf, src, prev):
    return hf(input_ids=src, attention_mask=src.ne(PAD).long(), decoder_input_ids=prev).logits


@pytest.mark.parametrize("backend", ["torch", "sdpa", "auto"])
def test_logits_match_hugging_face(backend):
    ours, hf = build_pair(backend, num_heads=3, head_dim=12, rel_pos_buckets=8, rel_pos_max_distance=12)
    src, prev, _ = make_batch(len(ours.decoder.dictionary), bsz=3, src_len=23, tgt_len=17)  # > max distance
    with torch.no_grad():
        diff = (ours(src, src.ne(PAD).sum(1), prev)[0] - hf_logits(hf, src, prev)).abs().max().item()
    assert diff < MAX_ABS_DIFF


def test_greedy_generation_matches_hugging_face():
    ours, hf = build_pair()
    d = ours.decoder.dictionary
    src, _, _ = make_batch(len(d), bsz=3)
    max_new = 12
    generator = SequenceGenerator([ours], d, beam_size=1, max_len_a=0, max_len_b=max_new, min_len=1)
    with torch.no_grad():
        fairseq_hyps = generator.generate([ours], {"net_input": {"src_tokens": src, "src_lengths": src.ne(PAD).sum(1)}})
        # fairseq never emits <pad> and forbids </s> at the first step: ask HF for the same
        hf_out = hf.generate(input_ids=src, attention_mask=src.ne(PAD).long(), do_sample=False, num_beams=1,
                             max_new_tokens=max_new, min_new_tokens=1, suppress_tokens=[PAD])
    compared = 0
    for hyps, hf_tokens in zip(fairseq_hyps, hf_out):
        ours_tokens = hyps[0]["tokens"]
        n = min(len(ours_tokens), max_new)  # fairseq forces </s> after max_new tokens
        assert hf_tokens[0].item() == d.eos()  # decoder start = </s>
        assert torch.equal(ours_tokens[:n], hf_tokens[1:1 + n])
        compared += n
    assert compared >= 6


def test_state_dict_round_trip_is_exact():
    ours, hf = build_pair()
    back = hf_to_ours_state_dict(hf.state_dict())
    original = ours.state_dict()
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)


def test_hugging_face_model_converts_to_ours():
    torch.manual_seed(1)
    config = hf_t5_config(AstT5Model.from_dictionary(make_dictionary(), arch="t5_v11_tiny").cfg, 60)
    hf = transformers.T5ForConditionalGeneration(config).eval()  # Hugging Face's own random init
    with torch.no_grad():  # one token table, as in Google's checkpoints (transformers 5 draws three)
        hf.encoder.embed_tokens.weight.copy_(hf.shared.weight)
        hf.decoder.embed_tokens.weight.copy_(hf.shared.weight)
    cfg = ast_t5_config_from_hf(hf.config)
    ours = AstT5Model.build(cfg, make_dictionary()).eval()
    ours.load_state_dict(hf_to_ours_state_dict(hf.state_dict()), strict=True)
    src, prev, _ = make_batch(60)
    with torch.no_grad():
        assert (ours(src, None, prev)[0] - hf_logits(hf, src, prev)).abs().max() < MAX_ABS_DIFF


@pytest.mark.parametrize("arch", ["t5_v11_small", "t5_v11_base", "t5_v11_large", "t5_v11_xl"])
def test_presets_have_the_real_t5_v11_shapes(arch):
    """Every tensor of our preset maps onto the tensor of the same shape in HF's T5 v1.1 of that size
    (32128-token vocabulary as in Google's checkpoints); built on the meta device, so nothing is allocated."""
    hf_sizes = {"t5_v11_small": (512, 1024, 8, 6), "t5_v11_base": (768, 2048, 12, 12),
                "t5_v11_large": (1024, 2816, 24, 16), "t5_v11_xl": (2048, 5120, 24, 32)}[arch]
    d_model, d_ff, layers, heads = hf_sizes
    config = transformers.T5Config(vocab_size=32128, d_model=d_model, d_ff=d_ff, num_layers=layers, num_heads=heads,
                                   d_kv=64, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    config.tie_word_embeddings = False
    with torch.device("meta"):
        ours = AstT5Model.from_dictionary(make_dictionary(32128), arch=arch)
        hf = transformers.T5ForConditionalGeneration(config)
    converted = ours_to_hf_state_dict(ours.state_dict())
    hf_shapes = {k: v.shape for k, v in hf.state_dict().items()}
    assert {k: v.shape for k, v in converted.items()} == hf_shapes
    assert ARCH_PRESETS[arch]["rel_pos_buckets"] == config.relative_attention_num_buckets


def test_different_encoder_and_decoder_tables_are_rejected():
    _, hf = build_pair()
    state = hf.state_dict()
    state["decoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] + 1.0
    with pytest.raises(ValueError, match="embeddings differ"):
        hf_to_ours_state_dict(state)


def test_only_the_t5_v11_family_converts():
    paper = AstT5Model.from_dictionary(make_dictionary(), arch="ast_t5_paper_tiny")
    with pytest.raises(KeyError, match="only the t5_v11 family"):
        ours_to_hf_state_dict(paper.state_dict())
    with pytest.raises(ValueError, match="t5_v11"):
        hf_t5_config(paper.cfg, 60)


def test_hf_dropout_rate_is_the_one_rate_or_a_clear_refusal():
    cfg = AstT5Model.from_dictionary(make_dictionary(), arch="t5_v11_tiny", dropout=0.1,
                                     attention_dropout=0.1, activation_dropout=0.1).cfg
    assert hf_dropout_rate(cfg) == pytest.approx(0.1)
    assert hf_t5_config(cfg, 100).dropout_rate == pytest.approx(0.1)
    cfg.attention_dropout = 0.0
    with pytest.raises(ValueError, match=r"one dropout_rate.*attention_dropout=0[^.]"):
        hf_dropout_rate(cfg)
