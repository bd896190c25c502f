"""ast_t5/config_checks.py (run before training by the Hydra callback of our configs),
hydra_plugins/ast_t5_hydra (config names from any directory) and the warmup_decay schedule."""
import logging
import math
import os

import pytest
import torch
from omegaconf import OmegaConf

import hydra_plugins.ast_t5_hydra as plugin
from ast_t5.config_checks import ConfigCheckError, TrainingComplete, run_checks
from ast_t5.optim.warmup_decay import WarmupDecayConfig, learning_rate

from ..conftest import build_tiny_checkpoint
from .test_compose import compose

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAIN = os.path.join(REPO, "config", "pretrain")
FINETUNE = os.path.join(REPO, "config", "finetune")


def tiny(tmp_path, *overrides):
    return compose(PRETRAIN, "tiny", [f"task.data={tmp_path}", f"checkpoint.save_dir={tmp_path / 'ck'}",
                                      *overrides])


@pytest.mark.parametrize("override,message", [
    ("+optimization.max_updates=5", "unknown key optimization.max_updates; did you mean max_update?"),
    ("+checkpoint.restore_fil=x", "unknown key checkpoint.restore_fil; did you mean restore_file?"),
    ("model._name=t5_v11_tinyy", "unknown model._name=t5_v11_tinyy; did you mean t5_v11_tiny"),
    ("lr_scheduler._name=cosin", "unknown lr_scheduler._name=cosin; did you mean cosine?"),
    ("+optimisation.lr=[1]", "unknown config group 'optimisation'; did you mean optimization?"),
])
def test_unknown_names_and_keys_are_refused_with_close_matches(tmp_path, override, message):
    with pytest.raises(ConfigCheckError) as err:
        run_checks(tiny(tmp_path, override))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_listed_keys_take_plain_overrides(tmp_path):
    """The README's overrides need no '+': the YAMLs list them."""
    for name in ("tiny", "base"):
        cfg = compose(PRETRAIN, name, ["task.data=/x", "model.attention_backend=torch",
                                       "model.checkpoint_activations=true", "task.objective=t5",
                                       "task.sampling_temperature=2.0", "task.audit_log=/tmp/a"])
        assert cfg.model.attention_backend == "torch" and cfg.task.sampling_temperature == 2.0
    cfg = compose(FINETUNE, "concode", ["task.data=/x", "model.attention_backend=sdpa",
                                        "lr_scheduler.warmup_updates=5"])
    assert cfg.model.attention_backend == "sdpa"


def test_missing_restore_file_is_refused(tmp_path):
    with pytest.raises(ConfigCheckError, match="restore_file=.*no such file .*train from scratch"):
        run_checks(tiny(tmp_path, f"checkpoint.restore_file={tmp_path / 'nope.pt'}"))
    with pytest.raises(ConfigCheckError, match="finetune_from_model=.*no such file"):
        run_checks(tiny(tmp_path, f"checkpoint.finetune_from_model={tmp_path / 'nope.pt'}"))


def fake_checkpoint(path, num_updates, seconds=0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"optimizer_history": [{"num_updates": num_updates}],
                "extra_state": {"previous_training_time": seconds}}, path)


def test_a_finished_run_says_it_is_done(tmp_path):
    fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", 300)
    with pytest.raises(TrainingComplete, match="at update 300 and optimization.max_update=300"):
        run_checks(tiny(tmp_path, "optimization.max_update=300"))
    run_checks(tiny(tmp_path, "optimization.max_update=301"))  # more to do: no complaint


def test_architecture_mismatch_with_the_finetune_start_says_what_to_pass(tmp_path, tokenizer_dir):
    start = build_tiny_checkpoint(tmp_path / "start", tokenizer_dir) / "checkpoint.pt"
    cfg = compose(FINETUNE, "concode", [f"task.data={tmp_path}", f"checkpoint.save_dir={tmp_path / 'ck'}",
                                        f"checkpoint.finetune_from_model={start}"])
    with pytest.raises(ConfigCheckError) as err:
        run_checks(cfg)  # the recipe's t5_v11_base against a t5_v11_tiny checkpoint
    assert "embed_dim 768 vs 32" in str(err.value) and str(err.value).endswith("pass model._name=t5_v11_tiny")
    run_checks(compose(FINETUNE, "concode", [f"task.data={tmp_path}", f"checkpoint.save_dir={tmp_path / 'ck'}",
                                             f"checkpoint.finetune_from_model={start}",
                                             "model._name=t5_v11_tiny"]))


def test_stop_time_with_finetune_from_model_gives_the_value_to_pass(tmp_path, caplog):
    start = tmp_path / "start" / "checkpoint.pt"
    fake_checkpoint(start, 1000, seconds=1800.0)
    cfg = tiny(tmp_path, f"checkpoint.finetune_from_model={start}", "optimization.stop_time_hours=1.0")
    with caplog.at_level(logging.WARNING, logger="ast_t5.config_checks"):
        run_checks(cfg)
    assert "optimization.stop_time_hours=1.5000" in caplog.text and "0.500 h" in caplog.text


def test_gpu_recipe_on_cpu_warns_with_the_estimated_memory(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="ast_t5.config_checks"):
        run_checks(compose(PRETRAIN, "base", [f"task.data={tmp_path}", f"checkpoint.save_dir={tmp_path}"]))
    assert "GPU recipe" in caplog.text and "GiB" in caplog.text
    gib = float(caplog.text.split("about ")[1].split(" GiB")[0])
    assert 5 < gib < 200  # T5 v1.1 base: ~250M parameters x 16 bytes + activations of 65536 tokens (fp32 on CPU)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ast_t5.config_checks"):
        run_checks(tiny(tmp_path))  # a CPU config: no warning
    assert "GPU recipe" not in caplog.text


def test_config_names_resolve_from_the_installed_package(tmp_path):
    dirs = plugin.config_dirs()
    assert [os.path.basename(d) for d in dirs] == ["pretrain", "finetune"]
    assert plugin.unknown_config_message("tiny", None) is None
    assert plugin.unknown_config_message("concode", None) is None
    message = plugin.unknown_config_message("tinyy", None)
    assert "unknown --config-name 'tinyy'" in message and "did you mean tiny" in message
    (tmp_path / "mine.yaml").write_text("common:\n  seed: 2\n")
    assert plugin.unknown_config_message("mine", str(tmp_path)) is None


def schedule(**kw):
    values = dict(warmup_updates=10, warmup_init_lr=0.0, decay="cosine", final_lr=0.0,
                  lr=[1.0], max_update=300)
    values.update(kw)
    return OmegaConf.structured(WarmupDecayConfig(**values))


def test_schedule_has_no_restart_and_no_division_by_zero():
    cfg = schedule()
    lrs = [learning_rate(cfg, n) for n in range(0, 400)]
    assert lrs[10] == pytest.approx(1.0) and lrs[300] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b - 1e-12 for a, b in zip(lrs[10:], lrs[11:]))  # never jumps back up
    assert max(lrs[300:]) == pytest.approx(0.0, abs=1e-12)
    same = schedule(warmup_updates=300)  # max_update == warmup_updates
    assert learning_rate(same, 300) == pytest.approx(1.0) and math.isfinite(learning_rate(same, 299))
    ratio = schedule(warmup_updates=0, warmup_ratio=0.1, decay="linear", max_update=50)
    assert learning_rate(ratio, 5) == pytest.approx(1.0) and learning_rate(ratio, 2) == pytest.approx(0.4)
    assert learning_rate(ratio, 50) == pytest.approx(0.0)
