"""Training the arms through ``fairseq-hydra-train`` (``python -m fairseq_cli.hydra_train``).

Every arm runs the preset's config with the same seed, optimizer, schedule and token budget
(``task.max_train_tokens``: the task stops by tokens, not updates). The schedule is stated in
updates, so it is sized once for all arms from the arm that needs the most updates to reach the
budget (estimated from each corpus' batches) and passed to every arm. A run directory holds
fairseq's checkpoints (one every ``save_every`` updates, for the curves) and, once finished,
``done.json``; a killed arm is resumed by running the same command again (fairseq resumes from
``checkpoint_last.pt`` and the task restores its token counters), a finished one is not rerun.
"""
import glob
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import yaml

from .arms import Arm

logger = logging.getLogger(__name__)

TOLERANCE = 0.001  # arms agree in training tokens within 0.1%


class AblationError(RuntimeError):
    """A run that cannot go on (one-line message)."""


def repo_config_dir(kind: str) -> str:
    """The ``pretrain`` or ``finetune`` folder of our configs: the installed ones (as the Hydra
    plugin finds them), else ``config/`` of a source checkout beside the package."""
    from hydra_plugins.ast_t5_hydra import config_root

    root = config_root()
    if root is None:
        root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "config")
    return os.path.join(root, kind)


def atomic_write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def load_preset(config_dir: str, preset: str, overrides: Sequence[str] = ()):
    """The preset's YAML as an OmegaConf tree, with simple ``key=value`` overrides applied."""
    from omegaconf import OmegaConf

    path = os.path.join(config_dir, f"{preset}.yaml")
    if not os.path.isdir(config_dir):
        raise AblationError(f"config folder {config_dir} does not exist (--config-dir)")
    if not os.path.exists(path):
        names = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".yaml"))
        raise AblationError(f"unknown preset {preset!r} in {config_dir} (known: {', '.join(names)})")
    cfg = OmegaConf.load(path)
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if o.startswith("~") or not value:
            continue
        try:
            OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
        except Exception:  # noqa: BLE001 - a value Hydra parses but YAML does not: keep the YAML's
            pass
    return cfg


def train_sizes(data_dir: str) -> np.ndarray:
    """Token counts of every training segment of a preprocessed directory."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    sizes = []
    for idx in sorted(glob.glob(os.path.join(data_dir, "*", "train.idx"))):
        ds = MMapIndexedDataset(idx[:-4])
        sizes.append(np.array(ds.sizes, dtype=np.int64, copy=True))  # a copy: the map closes with ds
        del ds
    if not sizes:
        raise AblationError(f"{data_dir} has no training data (*/train.idx)")
    return np.concatenate(sizes)


def tokens_per_update(sizes: np.ndarray, max_tokens: Optional[int], batch_size: Optional[int],
                      update_freq: int = 1) -> float:
    """Mean segment tokens per update under fairseq's own length-bucketed batching."""
    from fairseq.data import data_utils

    order = np.argsort(sizes, kind="stable")
    batches = data_utils.batch_by_size(order, lambda i: int(sizes[i]),
                                       max_tokens=int(max_tokens) if max_tokens else None,
                                       max_sentences=int(batch_size) if batch_size else None,
                                       num_tokens_vec=sizes[order])
    return float(sizes.sum()) / max(1, len(batches)) * update_freq


@dataclass
class Schedule:
    updates: int  # schedule length (cosine period / polynomial total) shared by all arms
    cap: int  # optimization.max_update: a safety cap; arms stop by tokens before it
    warmup: int
    save_every: int
    tokens_per_update: Dict[str, float]

    def overrides(self, scheduler: str) -> List[str]:
        out = [f"optimization.max_update={self.cap}", f"lr_scheduler.warmup_updates={self.warmup}",
               f"checkpoint.save_interval_updates={self.save_every}",
               "checkpoint.keep_interval_updates=-1"]
        if scheduler == "cosine":
            out.append(f"++lr_scheduler.max_update={self.updates}")
        elif scheduler == "polynomial_decay":
            out.append(f"++lr_scheduler.total_num_update={self.updates}")
        return out


def plan_schedule(preset_cfg, corpora: Dict[str, str], arms: Sequence[Arm], budget: int,
                  curve_points: int, warmup: int = 0, world_size: int = 1) -> Schedule:
    ds = preset_cfg.get("dataset", {})
    freq = preset_cfg.get("optimization", {}).get("update_freq", [1])
    freq = int(freq[0] if hasattr(freq, "__len__") else freq)
    per_update = {}
    for kind in sorted({a.corpus for a in arms}):
        per_update[kind] = tokens_per_update(train_sizes(corpora[kind]), ds.get("max_tokens"),
                                             ds.get("batch_size"), freq) * world_size
    updates = int(math.ceil(1.02 * budget / min(per_update.values())))
    preset_warmup = int(preset_cfg.get("lr_scheduler", {}).get("warmup_updates", 0) or 0)
    warm = warmup if warmup > 0 else min(preset_warmup, max(1, updates // 10))
    save_every = max(1, updates // max(1, curve_points))
    return Schedule(updates, 2 * updates + 10, warm, save_every, per_update)


def check_budget(budget: int, corpora: Dict[str, str], arms: Sequence[Arm]) -> None:
    """The budget must be large enough for the 0.1% agreement to be reachable."""
    longest = max(int(train_sizes(corpora[a.corpus]).max()) for a in arms)
    if budget * TOLERANCE < longest:
        raise AblationError(f"--tokens {budget} is too small for arms to agree within 0.1%: a "
                            f"segment has {longest} tokens, so the budget must be >= "
                            f"{int(math.ceil(longest / TOLERANCE))}")


def arm_dir(out: str, arm: Arm, seed: int) -> str:
    return os.path.join(out, "runs", arm.slug, f"seed{seed}")


def train_command(config_dir: str, preset: str, data: str, save_dir: str, seed: int, budget: int,
                  schedule_overrides: Sequence[str], arm: Arm, overrides: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", config_dir,
            "--config-name", preset, f"task.data={data}", f"checkpoint.save_dir={save_dir}",
            f"common.seed={seed}", f"++task.max_train_tokens={budget}",
            f"++task.max_train_tokens_tolerance={TOLERANCE}", "checkpoint.no_epoch_checkpoints=true",
            "dataset.disable_validation=true", "common.log_format=json",
            "++common.tensorboard_logdir=", *schedule_overrides, *arm.task_overrides(), *overrides]


def fingerprint(cmd: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(cmd[1:])).encode()).hexdigest()[:16]


def checkpoint_counters(path: str) -> dict:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    ts = state.get("task_state") or {}
    upd = (state.get("optimizer_history") or [{}])[-1].get("num_updates", 0)
    return {"updates": int(upd), "tokens": int(ts.get("train_tokens", 0)),
            "source_tokens": int(ts.get("train_source_tokens", 0)),
            "target_tokens": int(ts.get("train_target_tokens", 0))}


def run_arm(run_dir: str, arm: Arm, seed: int, cmd: List[str], budget: int, env=None) -> dict:
    """Train one arm in ``run_dir`` (its checkpoint.save_dir), resuming a killed run; a finished
    one is read back. Returns the content of done.json."""
    os.makedirs(run_dir, exist_ok=True)
    done_path = os.path.join(run_dir, "done.json")
    fp = fingerprint(cmd)
    if os.path.exists(done_path):
        with open(done_path, encoding="utf-8") as f:
            done = json.load(f)
        if done.get("fingerprint") != fp:
            raise AblationError(f"{run_dir} holds a finished arm trained with other settings; "
                                "use another output directory")
        logger.info("%s seed %d: finished already (%d tokens)", arm.name, seed, done["tokens"])
        return done
    resumed = os.path.exists(os.path.join(run_dir, "checkpoint_last.pt"))
    logger.info("%s seed %d: %s training -> %s", arm.name, seed, "resuming" if resumed else "starting",
                run_dir)
    with open(os.path.join(run_dir, "command.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
    with open(os.path.join(run_dir, "train.log"), "a", encoding="utf-8") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir, env=env)
    if rc != 0:
        raise AblationError(f"training {arm.name} (seed {seed}) failed with exit code {rc}; see "
                            f"{os.path.join(run_dir, 'train.log')}")
    last = checkpoint_counters(os.path.join(run_dir, "checkpoint_last.pt"))
    points = []
    for p in glob.glob(os.path.join(run_dir, "checkpoint_*_*.pt")):
        m = re.search(r"checkpoint_\d+_(\d+)\.pt$", p)
        if m:
            points.append(dict(checkpoint_counters(p), path=os.path.basename(p)))
    points.append(dict(last, path="checkpoint_last.pt"))
    points = sorted({p["updates"]: p for p in points}.values(), key=lambda p: p["updates"])
    done = dict(last, arm=arm.name, seed=seed, budget=budget, fingerprint=fp, resumed=resumed,
                checkpoints=points,
                within_tolerance=abs(last["tokens"] - budget) <= TOLERANCE * budget)
    if not done["within_tolerance"]:
        raise AblationError(f"{arm.name} (seed {seed}) stopped at {last['tokens']} tokens, not "
                            f"within 0.1% of {budget} (cap optimization.max_update reached?)")
    atomic_write_json(done_path, done)
    return done


def train_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
