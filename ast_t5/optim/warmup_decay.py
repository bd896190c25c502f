"""``lr_scheduler._name=warmup_decay``: linear warm-up, then one cosine or linear decay to the end.

fairseq's ``cosine`` schedule restarts its cycle at ``max_update`` (the learning rate jumps back
up on the last update, and a resumed run continues on the restarted cycle) and divides by zero
when ``max_update == warmup_updates``; ``polynomial_decay`` counts warm-up only in updates. This
schedule is a pure function of the update number:

* updates ``0..W``: linear from ``warmup_init_lr`` to ``lr``, where ``W`` is ``warmup_updates``
  when it is > 0, else ``round(warmup_ratio * max_update)`` (so a short fine-tune gets a short
  warm-up);
* updates ``W..max_update``: ``decay=cosine`` (half a cosine) or ``linear`` from ``lr`` to
  ``final_lr``, or ``constant``;
* after ``max_update`` (a run resumed with a larger limit keeps the end value): ``final_lr``.
"""
import math
from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

DECAYS = ChoiceEnum(["cosine", "linear", "constant"])


@dataclass
class WarmupDecayConfig(FairseqDataclass):
    warmup_updates: int = field(default=0, metadata={"help": "linear warm-up over this many updates"})
    warmup_ratio: float = field(default=0.0, metadata={
        "help": "when warmup_updates is 0, warm up over round(warmup_ratio * max_update) updates"})
    warmup_init_lr: float = field(default=0.0, metadata={"help": "learning rate at update 0"})
    decay: DECAYS = field(default="cosine", metadata={"help": "shape after warm-up"})
    final_lr: float = field(default=0.0, metadata={"help": "learning rate at max_update"})
    lr: List[float] = II("optimization.lr")
    max_update: int = II("optimization.max_update")


def warmup_steps(cfg: WarmupDecayConfig) -> int:
    """The number of warm-up updates ``cfg`` asks for; ValueError (one line) on bad values."""
    if cfg.warmup_updates < 0 or not 0 <= cfg.warmup_ratio < 1:
        raise ValueError(f"lr_scheduler.warmup_updates={cfg.warmup_updates} must be >= 0 and "
                         f"lr_scheduler.warmup_ratio={cfg.warmup_ratio} in [0, 1)")
    if cfg.warmup_updates == 0 and cfg.warmup_ratio > 0:
        if cfg.max_update <= 0:
            raise ValueError("lr_scheduler.warmup_ratio needs optimization.max_update > 0")
        return int(round(cfg.warmup_ratio * cfg.max_update))
    return cfg.warmup_updates


def learning_rate(cfg: WarmupDecayConfig, num_updates: int) -> float:
    """The learning rate after ``num_updates`` updates."""
    peak, warmup = cfg.lr[0], warmup_steps(cfg)
    if num_updates < warmup:
        return cfg.warmup_init_lr + (peak - cfg.warmup_init_lr) * num_updates / warmup
    if str(cfg.decay) == "constant":
        return peak
    progress = min(1.0, (num_updates - warmup) / max(1, cfg.max_update - warmup))
    if str(cfg.decay) == "linear":
        return peak + (cfg.final_lr - peak) * progress
    return cfg.final_lr + (peak - cfg.final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@register_lr_scheduler("warmup_decay", dataclass=WarmupDecayConfig)
class WarmupDecaySchedule(FairseqLRScheduler):
    """See the module docstring."""

    def __init__(self, cfg: WarmupDecayConfig, optimizer):
        super().__init__(cfg, optimizer)
        if len(cfg.lr) != 1:
            raise ValueError(f"warmup_decay takes one learning rate, got optimization.lr={list(cfg.lr)}")
        if str(cfg.decay) != "constant" and cfg.max_update <= 0:
            raise ValueError(f"lr_scheduler.decay={cfg.decay} needs optimization.max_update > 0")
        warmup_steps(cfg)  # validates
        self.optimizer.set_lr(learning_rate(cfg, 0))

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        lr = learning_rate(self.cfg, num_updates)
        self.optimizer.set_lr(lr)
        return lr
