"""Checks of a composed ``fairseq-hydra-train`` config, run before fairseq starts.

Our configs register :class:`hydra_plugins.ast_t5_hydra.ConfigChecks` as a Hydra callback, which
calls :func:`run_checks` on the composed config before fairseq's ``main``. A problem a user can
fix ends the run with one line (exit 2) saying what to pass; a finished run (its
``checkpoint_last.pt`` already at ``optimization.max_update``) ends with one line and exit 0:

* unknown component names (``model._name``, ``task._name``, ...) and unknown keys in any group
  (``+optimization.max_updates=...`` is otherwise accepted and ignored), with close matches;
* ``checkpoint.restore_file`` or ``checkpoint.finetune_from_model`` pointing at no file (fairseq
  would train from scratch without a word);
* an architecture that differs from the ``finetune_from_model`` checkpoint's;
* a GPU recipe (bf16/fp16) started without a GPU: a warning with the estimated memory;
* ``optimization.stop_time_hours`` with ``finetune_from_model``: fairseq carries the pre-training
  run's clock over, so a warning gives the value to pass.
"""
import dataclasses
import difflib
import logging
import os
import sys
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

PROG = "fairseq-hydra-train"
DEFAULT_RESTORE = "checkpoint_last.pt"
ROOT_EXTRAS = {"job_logging_cfg", "hydra"}  # added by fairseq_cli.hydra_train / Hydra
SIZE_FIELDS = ("family", "embed_dim", "ffn_dim", "num_heads", "head_dim", "encoder_layers",
               "decoder_layers", "rel_pos_buckets", "rel_pos_max_distance")


class ConfigCheckError(ValueError):
    """A config that cannot train as meant (one-line message)."""


class TrainingComplete(Exception):
    """The run's checkpoint is already at max_update (one-line message)."""


def _close(name: str, known) -> str:
    close = difflib.get_close_matches(str(name), sorted(map(str, known)), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _registries() -> Dict[str, Any]:
    """Group name -> (name -> dataclass) for the groups fairseq chooses by ``_name``."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    groups = {"task": dict(TASK_DATACLASS_REGISTRY)}
    models = dict(MODEL_DATACLASS_REGISTRY)
    for arch, model in ARCH_MODEL_NAME_REGISTRY.items():
        if model in MODEL_DATACLASS_REGISTRY:
            models[arch] = MODEL_DATACLASS_REGISTRY[model]
    groups["model"] = models
    for group, reg in REGISTRIES.items():
        groups[group] = dict(reg["dataclass_registry"])
    return groups


def check_names_and_keys(cfg: DictConfig) -> None:
    """ConfigCheckError for an unknown component name or key, with the close matches."""
    from fairseq.dataclass.configs import FairseqConfig

    top = {f.name: f for f in dataclasses.fields(FairseqConfig)}
    for key in cfg.keys():
        if key not in top and key not in ROOT_EXTRAS:
            raise ConfigCheckError(f"unknown config group {key!r}{_close(key, top)}")
    registries = _registries()
    for group, f in top.items():
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            continue
        if group in registries:
            name = node.get("_name")
            if name is None:
                continue
            if name not in registries[group]:
                raise ConfigCheckError(f"unknown {group}._name={name}{_close(name, registries[group])}")
            schema = registries[group][name]
        elif isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
            schema = f.type
        else:
            continue
        fields = {x.name for x in dataclasses.fields(schema)} | {"_name"}
        for key in node.keys():
            if key not in fields:
                raise ConfigCheckError(f"unknown key {group}.{key}{_close(key, fields)} "
                                       f"(not a field of {schema.__name__})")


def _load_checkpoint_meta(path: str) -> Dict[str, Any]:
    """The config, update count and training time stored in a fairseq checkpoint (memory-mapped)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # not a zip checkpoint: mmap is unsupported
        state = torch.load(path, map_location="cpu", weights_only=False)
    history = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    cfg = state.get("cfg")
    return {"cfg": cfg, "num_updates": history[-1].get("num_updates"),
            "previous_training_time": extra.get("previous_training_time")}


def model_sizes(model_cfg) -> Dict[str, Any]:
    """The architecture-defining fields of an ``ast_t5`` model config, presets applied."""
    from .models.config import config_from
    from .models.presets import ARCH_PRESETS

    values = {k: model_cfg.get(k) for k in SIZE_FIELDS}
    for k, v in ARCH_PRESETS.get(str(model_cfg.get("_name")), {}).items():
        if values.get(k) is None:
            values[k] = v
    resolved = config_from({k: v for k, v in values.items() if v is not None})
    return {k: str(getattr(resolved, k)) if k == "family" else getattr(resolved, k) for k in SIZE_FIELDS}


def arch_for_sizes(sizes: Dict[str, Any]) -> Optional[str]:
    from .models.presets import ARCH_PRESETS

    for arch, preset in ARCH_PRESETS.items():
        if all(sizes.get(k) == v for k, v in preset.items()):
            return arch
    return None


def check_finetune_architecture(cfg: DictConfig, meta: Dict[str, Any], path: str) -> None:
    """ConfigCheckError naming what to pass when ``model`` differs from the checkpoint's."""
    saved = meta.get("cfg")
    saved_model = saved.get("model") if saved is not None else None
    if saved_model is None or str(cfg.model.get("_name", "")) not in _ast_t5_arch_names():
        return
    if str(saved_model.get("_name", "")) not in _ast_t5_arch_names():
        raise ConfigCheckError(f"checkpoint.finetune_from_model={path} holds a "
                               f"{saved_model.get('_name')} model, not an ast_t5 one")
    ours, theirs = model_sizes(cfg.model), model_sizes(saved_model)
    if ours == theirs:
        return
    differ = ", ".join(f"{k} {ours[k]} vs {theirs[k]}" for k in SIZE_FIELDS if ours[k] != theirs[k])
    arch = arch_for_sizes(theirs)
    fix = (f"model._name={arch}" if arch else "model._name=ast_t5 " +
           " ".join(f"++model.{k}={theirs[k]}" for k in SIZE_FIELDS))
    raise ConfigCheckError(f"model._name={cfg.model.get('_name')} does not match the architecture "
                           f"of checkpoint.finetune_from_model ({differ}); pass {fix}")


def _ast_t5_arch_names():
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return {a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m == "ast_t5"} | {"ast_t5"}


def check_checkpoints(cfg: DictConfig) -> None:
    """Restore and fine-tune paths, the architecture of the fine-tune start, a finished run."""
    ck = cfg.checkpoint
    save_dir = str(ck.get("save_dir") or "checkpoints")
    restore = str(ck.get("restore_file") or DEFAULT_RESTORE)
    if restore == DEFAULT_RESTORE:
        to_load = os.path.join(save_dir, DEFAULT_RESTORE)
        if ck.get("checkpoint_suffix"):
            to_load = to_load.replace(".pt", str(ck.checkpoint_suffix) + ".pt")
        explicit = False
    else:
        to_load, explicit = restore, True
        if not os.path.isfile(restore):
            raise ConfigCheckError(
                f"checkpoint.restore_file={restore}: no such file (fairseq would train from "
                "scratch); fix the path, or drop restore_file to start fresh (weights of another "
                "run: checkpoint.finetune_from_model=PATH)")
    finetune = ck.get("finetune_from_model")
    first_launch = not os.path.isfile(to_load)
    if finetune:
        if not os.path.isfile(str(finetune)):
            raise ConfigCheckError(f"checkpoint.finetune_from_model={finetune}: no such file")
        if first_launch and not explicit:
            meta = _load_checkpoint_meta(str(finetune))
            check_finetune_architecture(cfg, meta, str(finetune))
            _warn_stop_time(cfg, meta)
    if not first_launch and not ck.get("reset_optimizer") and not ck.get("reset_lr_scheduler"):
        max_update = int(cfg.optimization.get("max_update") or 0)
        if max_update > 0:
            done = _load_checkpoint_meta(to_load).get("num_updates")
            if done is not None and done >= max_update:
                raise TrainingComplete(
                    f"training is complete: {to_load} is at update {done} and "
                    f"optimization.max_update={max_update}; raise optimization.max_update to "
                    "train further")


def _warn_stop_time(cfg: DictConfig, meta: Dict[str, Any]) -> None:
    hours = float(cfg.optimization.get("stop_time_hours") or 0)
    previous = meta.get("previous_training_time")
    if hours > 0 and previous:
        before = previous / 3600
        logger.warning("optimization.stop_time_hours=%g counts the %.3f h the pre-training run "
                       "already trained (fairseq carries its clock over with finetune_from_model): "
                       "this fine-tune gets %.3f h; for %g h of fine-tuning pass "
                       "optimization.stop_time_hours=%.4f", hours, before, max(0.0, hours - before),
                       hours, hours + before)


def estimated_training_gib(cfg: DictConfig, vocab_size: int) -> Optional[float]:
    """Rough memory of training an ``ast_t5`` model in fp32 with Adam: weights, gradients and two
    moments (16 bytes a parameter) plus activations of one batch of ``dataset.max_tokens``."""
    try:
        s = model_sizes(cfg.model)
    except Exception:  # noqa: BLE001  (not our model: no estimate)
        return None
    d, ff, inner = s["embed_dim"], s["ffn_dim"], s["num_heads"] * (s["head_dim"] or s["embed_dim"] // s["num_heads"])
    gated = 3 if s["family"] == "t5_v11" else 2
    enc = s["encoder_layers"] * (4 * d * inner + gated * d * ff)
    dec = s["decoder_layers"] * (8 * d * inner + gated * d * ff)
    params = enc + dec + vocab_size * d * (2 if s["family"] == "t5_v11" else 1)
    tokens = int(cfg.dataset.get("max_tokens") or 4096)
    layers = s["encoder_layers"] + s["decoder_layers"]
    activations = tokens * layers * (12 * d + 3 * ff) * 4 + tokens * vocab_size * 4 * 3
    return (params * 16 + activations) / 2 ** 30


def _vocab_size(cfg: DictConfig) -> int:
    data = cfg.task.get("tokenizer") or cfg.task.get("data")
    try:
        with open(os.path.join(str(data), "dict.txt"), encoding="utf-8") as f:
            return sum(1 for _ in f) + 4
    except (OSError, TypeError):
        return 32000


def check_device(cfg: DictConfig) -> None:
    """Warn once when a GPU recipe (bf16/fp16) starts on a machine without CUDA."""
    import torch

    common = cfg.common
    if torch.cuda.is_available() or not (common.get("bf16") or common.get("fp16")):
        return
    gib = estimated_training_gib(cfg, _vocab_size(cfg))
    estimate = f"about {gib:.1f} GiB of memory and " if gib is not None else ""
    total = ""
    try:
        total = f" (this machine has {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB)"
    except (ValueError, OSError, AttributeError):
        pass
    logger.warning("this config is a GPU recipe (common.%s=true) but no GPU is visible: on the CPU "
                   "it needs %smany hours%s; for a CPU run use --config-name tiny",
                   "bf16" if common.get("bf16") else "fp16", estimate, total)


def run_checks(cfg: DictConfig) -> None:
    """All checks; raises ConfigCheckError / TrainingComplete (see the module docstring)."""
    import ast_t5  # noqa: F401  (registers our components, as common.user_dir will)

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.set_struct(cfg, False)
    check_names_and_keys(cfg)
    if isinstance(cfg.get("checkpoint"), DictConfig) and isinstance(cfg.get("optimization"), DictConfig):
        check_checkpoints(cfg)
    if isinstance(cfg.get("common"), DictConfig) and isinstance(cfg.get("model"), DictConfig):
        check_device(cfg)


def run_checks_or_exit(cfg: DictConfig) -> None:
    """:func:`run_checks` for the command line: one line and exit 2 (0 when already done)."""
    try:
        run_checks(cfg)
    except ConfigCheckError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except TrainingComplete as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        sys.exit(0)
