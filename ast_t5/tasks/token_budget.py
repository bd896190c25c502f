"""Stopping pre-training by training tokens instead of updates (``task.max_train_tokens``).

Arms of an ablation must see the same number of training tokens, but their batches hold
different numbers of tokens (segments of other lengths), so equal updates would not be equal
compute. The pre-training task counts the tokens of the segments it trains on (the segments'
own tokens, before corruption: the unit the budget is stated in), keeps from the batch that
would cross the budget the items that bring the total closest to it, and ends training after
that update by lowering ``optimization.max_update`` to it: fairseq's own loop then stops and
saves ``checkpoint_last.pt``. The counters live in the task state, which fairseq writes into
every checkpoint (``task_state``); a resumed run reads them back from the checkpoint it resumed
from, so a killed run continues to the same total.

With one process the total lands within ``tolerance`` of the budget as long as no segment is
longer than the tolerance (``ast-t5-ablate`` checks this before training). With several
processes no batch is trimmed (ranks would have to agree on a selection): training stops after
the first update whose global total reaches the budget, overshooting by less than one update.
"""
import logging
import os
from typing import Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)

STATE_KEYS = ("train_tokens", "train_source_tokens", "train_target_tokens")


class TokenBudgetError(RuntimeError):
    """The token counters of a resumed run cannot be recovered (one-line message)."""


def select_items(sizes, remaining: int, tolerance: int) -> np.ndarray:
    """Which items of a batch to train on, as a boolean mask.

    All of them when they fit into ``remaining + tolerance``; otherwise the largest-first greedy
    choice of items that fit, so the total never passes the budget by more than ``tolerance``.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if int(sizes.sum()) <= remaining + tolerance:
        return np.ones(len(sizes), dtype=bool)
    keep = np.zeros(len(sizes), dtype=bool)
    left = remaining + tolerance
    for i in np.argsort(-sizes, kind="stable"):
        if sizes[i] <= left:
            keep[i] = True
            left -= int(sizes[i])
    return keep


def subset_sample(sample: dict, keep: np.ndarray, pad: int) -> dict:
    """The batch restricted to the items in ``keep`` (same layout, padding columns kept)."""
    idx = torch.from_numpy(np.flatnonzero(keep))
    n = len(keep)
    out = {}
    for key, value in sample.items():
        if key == "host":  # the collater's numpy copies (ast_t5.data.span_corruption_dataset)
            out[key] = {k: v[keep] if isinstance(v, np.ndarray) and len(v) == n else v
                        for k, v in value.items()}
        elif key == "net_input":
            out[key] = {k: v.index_select(0, idx.to(v.device)) if torch.is_tensor(v) and v.dim() > 0
                        else v for k, v in value.items()}
        elif torch.is_tensor(value) and value.dim() > 0 and value.size(0) == n:
            out[key] = value.index_select(0, idx.to(value.device))
        else:
            out[key] = value
    out["nsentences"] = int(keep.sum())
    if torch.is_tensor(out.get("target")):
        out["ntokens"] = int((out["target"] != pad).sum())
    return out


class TokenBudget:
    """Counters of consumed training tokens against a budget.

    Args:
        budget: tokens to train on; tolerance: allowed distance from the budget at the end.
    """

    def __init__(self, budget: int, tolerance: int):
        self.budget, self.tolerance = int(budget), int(tolerance)
        self.tokens = self.source_tokens = self.target_tokens = 0

    @property
    def remaining(self) -> int:
        return self.budget - self.tokens

    @property
    def done(self) -> bool:
        return self.remaining <= self.tolerance

    def state(self) -> dict:
        return {"train_tokens": self.tokens, "train_source_tokens": self.source_tokens,
                "train_target_tokens": self.target_tokens}

    def load(self, state: dict) -> None:
        self.tokens = int(state.get("train_tokens", 0))
        self.source_tokens = int(state.get("train_source_tokens", 0))
        self.target_tokens = int(state.get("train_target_tokens", 0))


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_counts(counts):
    """Sum a few integers over all ranks (identity with one process)."""
    if world_size() == 1:
        return [int(c) for c in counts]
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    t = torch.tensor([int(c) for c in counts], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return [int(x) for x in t.tolist()]


def restored_counters(root_cfg, update_num: int) -> dict:
    """The counters stored in the checkpoint this run resumed from (at ``update_num``).

    Raises:
        TokenBudgetError: no such checkpoint, or it was written at another update.
    """
    if root_cfg is None or "checkpoint" not in root_cfg:
        raise TokenBudgetError("resumed run: the checkpoint config is not reachable to recover "
                               "the training-token count (task.max_train_tokens)")
    ckpt = root_cfg.checkpoint
    path = ckpt.restore_file
    if path == "checkpoint_last.pt":
        path = os.path.join(ckpt.save_dir, path)
    if not os.path.exists(path):
        raise TokenBudgetError(f"resumed at update {update_num} but {path} is missing: cannot "
                               "recover the training-token count (task.max_train_tokens)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved_at = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    counters = state.get("task_state") or {}
    if saved_at != update_num or "train_tokens" not in counters:
        raise TokenBudgetError(f"{path} (update {saved_at}) holds no training-token count for "
                               f"update {update_num}: was it trained without task.max_train_tokens?")
    return {k: counters.get(k, 0) for k in STATE_KEYS}


def root_config(task_cfg):
    """The whole training config a task config belongs to (fairseq keeps the parent link)."""
    getter = getattr(task_cfg, "_get_parent", None)
    root = getter() if getter else None
    return root if root is not None and "optimization" in root else None


def stop_after_update(task_cfg, update_num: int) -> Optional[int]:
    """Make fairseq's loop stop and save after the update now running (``update_num + 1``)."""
    from omegaconf import open_dict

    root = root_config(task_cfg)
    if root is None:
        logger.warning("token budget reached but the training config is not reachable; "
                       "training continues to optimization.max_update")
        return None
    with open_dict(root.optimization):
        root.optimization.max_update = int(update_num) + 1
    return int(update_num) + 1
