"""ast-t5-import-hf refusals (one line, exit 2), decoder-output scaling carried over, and the
logits parity check at the end of every import and export."""
import json
import shutil

import pytest
import torch

from ast_t5.hf import export as export_module
from ast_t5.hf import importer
from ast_t5.hf.export import export_to_hf, load_exported
from ast_t5.hf.importer import HFImportError, import_from_hf
from ast_t5.hf.parity import logits_difference

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_checkpoint_dir):
    out = tmp_path_factory.mktemp("hf_refusals") / "model"
    export_to_hf(str(tiny_checkpoint_dir), str(out))
    return out


def variant(exported, tmp_path, name, drop=(), **changes):
    d = tmp_path / name
    shutil.copytree(exported, d)
    config = json.loads((d / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    config.update(changes)
    (d / "config.json").write_text(json.dumps(config))
    return d


def run_main(args, capsys):
    rc = importer.main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("name,drop,changes,message", [
    ("relu", ("dense_act_fn", "is_gated_act"), {"feed_forward_proj": "relu"}, "feed_forward_proj='relu'"),
    ("google", ("decoder_start_token_id",), {"pad_token_id": 0, "eos_token_id": 1},
     "Google's T5 vocabulary layout is not supported"),
    ("epsilon", (), {"layer_norm_epsilon": 1e-5}, "layer_norm_epsilon=1e-05"),
])
def test_config_refusals_are_one_line_with_exit_2(exported, tmp_path, capsys, name, drop, changes, message):
    d = variant(exported, tmp_path, name, drop, **changes)
    if name == "google":  # Google's layout: decoder start = pad = 0, kept only in generation_config
        gen = json.loads((d / "generation_config.json").read_text())
        gen.update(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        (d / "generation_config.json").write_text(json.dumps(gen))
    rc, err = run_main([d, tmp_path / "out"], capsys)
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_config_without_decoder_start_attribute_is_read_from_generation_config(exported, tmp_path):
    d = variant(exported, tmp_path, "no_start", drop=("decoder_start_token_id",))
    config = transformers.AutoConfig.from_pretrained(str(d))
    assert importer.decoder_start_id(config, str(d)) == 2


def test_separate_encoder_and_decoder_tables_are_refused(exported, tmp_path, capsys):
    d = variant(exported, tmp_path, "separate")
    state = safetensors_torch.load_file(str(d / "model.safetensors"))
    state["decoder.embed_tokens.weight"] = state["shared.weight"] + 0.5
    state.setdefault("encoder.embed_tokens.weight", state["shared.weight"].clone())
    safetensors_torch.save_file({k: v.contiguous().clone() for k, v in state.items()},
                                str(d / "model.safetensors"))
    rc, err = run_main([d, tmp_path / "out"], capsys)
    assert rc == 2 and "encoder and decoder token embeddings differ" in err and "\n" not in err


def test_scaled_decoder_outputs_are_carried_and_checked(exported, tmp_path, monkeypatch):
    """An untied head with T5's d_model ** -0.5 output scaling: the import folds the factor into
    our head; without the fold the parity check refuses (logits sqrt(d_model) times too big)."""
    d = variant(exported, tmp_path, "scaled", tie_word_embeddings=True, scale_decoder_outputs=True)
    hf = load_exported(str(d))
    assert hf.config.scale_decoder_outputs
    import_from_hf(str(d), str(tmp_path / "ok"))
    from ast_t5.generation.checkpoints import load_checkpoint

    loaded = load_checkpoint(str(tmp_path / "ok"), attention_backend="torch")
    codec = loaded.codec
    assert logits_difference(loaded.model, hf, codec.vocab_size, codec.pad, codec.eos) < 1e-5
    monkeypatch.setattr(importer, "scales_decoder_outputs", lambda config: False)
    with pytest.raises(HFImportError, match="logits differ"):
        import_from_hf(str(d), str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()


def test_export_reload_check_fails_loudly_on_a_config_that_loads_differently(
        tiny_checkpoint_dir, tmp_path, monkeypatch):
    """As if the written config.json loaded with the decoder-output scaling switched on."""
    def reload_scaled(path):
        model = load_exported(path)
        model.config.scale_decoder_outputs = True
        return model

    monkeypatch.setattr(export_module, "load_exported", reload_scaled)
    with pytest.raises(export_module.ExportError, match="reloaded with from_pretrained"):
        export_to_hf(str(tiny_checkpoint_dir), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_loading_an_export_keeps_the_untied_head(exported, caplog):
    """Transformers warns that shared and lm_head are not tied; the export is right not to tie
    them (T5 v1.1), and the reloaded model computes what was exported."""
    model = load_exported(str(exported))
    assert not torch.equal(model.lm_head.weight, model.shared.weight)
    assert model.config.scale_decoder_outputs is False
