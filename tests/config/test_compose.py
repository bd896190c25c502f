"""Every YAML in config/ composes under fairseq's config schema in strict mode, as
`fairseq-hydra-train --config-dir ... --config-name ...` would compose it."""
import os
import shutil

import pytest
from omegaconf import OmegaConf

import ast_t5  # noqa: F401  (registers the task, model, criterion and optimizer)
import hydra_plugins.ast_t5_hydra  # noqa: F401  (the ${ast_t5_user_dir:} resolver)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIRS = [os.path.join(REPO, "config", d) for d in ("pretrain", "finetune")]


def configs():
    for d in CONFIG_DIRS:
        if os.path.isdir(d):
            for name in sorted(os.listdir(d)):
                if name.endswith(".yaml"):
                    yield d, name[:-5]


def run_configs(config_dir):
    rc = os.path.join(config_dir, "run_config")
    return sorted(n[:-5] for n in os.listdir(rc) if n.endswith(".yaml")) if os.path.isdir(rc) else []


def compose(config_dir, name, overrides=()):
    """Compose like fairseq_cli.hydra_train (Hydra 1.1 semantics, schema stored under `name`),
    then merge the registered dataclasses of task/model/criterion/... in struct mode."""
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    hydra_init(name)
    with initialize_config_dir(config_dir=config_dir, version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    add_defaults(cfg)
    OmegaConf.set_struct(cfg, True)
    return cfg


def checks_pass(cfg, save_dir):
    """ast_t5.config_checks (the pre-training callback of our configs) accepts the config."""
    from ast_t5.config_checks import run_checks

    cfg.checkpoint.save_dir = str(save_dir)  # not a checkpoints/ folder of the repository
    run_checks(cfg)


@pytest.mark.parametrize("config_dir,name", list(configs()))
def test_config_composes_strictly(config_dir, name, monkeypatch, tmp_path):
    for var, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(var, value)  # what torchrun sets (read by run_config/torchrun_cpu)
    required = ["task.data=/nonexistent/data"]
    cfg = compose(config_dir, name, required)
    assert cfg.common.user_dir == os.path.dirname(ast_t5.__file__)
    container = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    assert container["task"]["_name"]
    checks_pass(cfg, tmp_path)
    for rc in run_configs(config_dir):
        extra = ["distributed_training.distributed_world_size=16"] if rc == "nodes_n" else []
        composed = compose(config_dir, name, required + [f"+run_config={rc}"] + extra)
        assert composed.distributed_training.distributed_world_size >= 1
        checks_pass(composed, tmp_path)
        if rc == "torchrun_cpu":
            dt = OmegaConf.to_container(composed.distributed_training, resolve=True)
            assert (dt["distributed_world_size"], dt["distributed_rank"], dt["device_id"]) == (2, 1, 1)


def test_misspelled_keys_fail(tmp_path):
    src = os.path.join(REPO, "config", "pretrain")
    with pytest.raises(Exception, match="mask_prb"):
        compose(src, "tiny", ["task.data=/x", "task.mask_prb=0.3"])
    shutil.copyfile(os.path.join(src, "tiny.yaml"), tmp_path / "typo.yaml")
    with open(tmp_path / "typo.yaml", "a") as f:
        f.write("optimisation:\n  lr: [0.1]\n")
    with pytest.raises(Exception) as err:
        compose(str(tmp_path), "typo", ["task.data=/x"])
    assert "optimisation" in _chain(err.value)


def _chain(exc):
    """Messages of an exception and of everything that caused it."""
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def test_switching_optimizer_and_schedule_from_the_command_line():
    """The README's override for Adafactor with an inverse square-root schedule composes."""
    src = os.path.join(REPO, "config", "pretrain")
    cfg = compose(src, "base", ["task.data=/x", "optimizer._name=t5_adafactor", "~optimizer.adam_betas",
                                "lr_scheduler._name=inverse_sqrt", "~lr_scheduler.warmup_init_lr",
                                "~lr_scheduler.decay"])
    assert cfg.optimizer._name == "t5_adafactor" and cfg.optimizer.scale_parameter is True
    assert cfg.lr_scheduler._name == "inverse_sqrt"


@pytest.mark.parametrize("name", ["base", "small", "t5_span_base", "tiny"])
def test_t5_v11_recipes_train_without_any_dropout(name):
    """nanoT5's recipe (Hugging Face's one dropout_rate = 0) has no attention dropout either. With
    `dropout: 0.0` alone, attention_dropout stayed at its default 0.1: every biased attention call
    then took the dropout path (SDPA with a dense bias, not the dropout-free flex/flash kernels),
    and bench_train compared it with a Hugging Face model that had no dropout."""
    from ast_t5.models.config import config_from
    from ast_t5.models.hf_conversion import hf_dropout_rate

    cfg = compose(os.path.join(REPO, "config", "pretrain"), name, ["task.data=/x"])
    model_cfg = config_from(cfg.model)
    assert (model_cfg.dropout, model_cfg.attention_dropout, model_cfg.activation_dropout) == (0.0, 0.0, 0.0)
    assert hf_dropout_rate(model_cfg) == 0.0
