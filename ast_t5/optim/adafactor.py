"""Adafactor selectable from Hydra configs (Shazeer & Stern, 2018; T5's optimizer).

fairseq ships an Adafactor (``fairseq.optim.adafactor.Adafactor``), but registers it the legacy
argparse way, so a YAML ``optimizer: {_name: adafactor}`` reaches it without its defaults. This
registers the same algorithm under the name ``t5_adafactor`` with a dataclass config, which
fairseq-hydra-train validates and fills, and implements its step with torch's multi-tensor
(foreach) kernels:

- the element-wise parts (second moments of unfactored parameters, the update's RMS clip, the
  first moment, weight decay, the parameter update) run as one launch per group of tensors;
  the factored row/column moments need per-tensor reductions and stay a loop;
- every per-parameter scalar (the parameter RMS, the step size it scales, the clip factor) stays
  a device tensor, so a step reads nothing back to the host (fairseq's compares the RMS tensor
  with a float and passes it as ``alpha``: two synchronizations per parameter);
- the step size of each parameter is ``lr * max(eps2, RMS(p))``. fairseq's stores that product in
  ``group["lr"]`` and then reads it back as the base ``lr`` of the next parameter of the group, so
  with ``scale_parameter=True`` and a fixed ``lr`` the step sizes compound along the parameter
  list (the scheduler resets ``lr`` before the next update). Here ``group["lr"]`` is never
  written. With one parameter per group the two implementations agree (tests check it).

The optimizer state has fairseq's keys (``step``, ``exp_avg``, ``exp_avg_sq_row``,
``exp_avg_sq_col``, ``exp_avg_sq``, ``RMS``), so checkpoints move between the two.
"""
import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from .clipping import OwnClipMixin


class Adafactor(torch.optim.Optimizer):
    """Adafactor with fairseq's options and state layout, stepped with foreach kernels."""

    def __init__(self, params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=True,
                 warmup_init=False):
        if lr is not None and relative_step:
            raise ValueError("Adafactor: give lr or relative_step=True, not both")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init needs relative_step=True")
        if lr is None and not relative_step:
            raise ValueError("Adafactor: lr is required without relative_step")
        super().__init__(params, dict(lr=lr, eps=tuple(eps), clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1, weight_decay=weight_decay,
                                      scale_parameter=scale_parameter, relative_step=relative_step,
                                      warmup_init=warmup_init))

    @property
    def supports_memory_efficient_fp16(self):
        return True

    @property
    def supports_flat_params(self):
        return False

    @staticmethod
    def _base_lr(group, step: int) -> float:
        if not group["relative_step"]:
            return group["lr"]
        min_step = 1e-6 * step if group["warmup_init"] else 1e-2
        return min(min_step, 1.0 / math.sqrt(step))

    def _init_state(self, p, factored: bool, first_moment: bool):
        state = self.state[p]
        if not state:
            shape = p.shape
            state["step"] = 0
            if first_moment:
                state["exp_avg"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
            if factored:
                state["exp_avg_sq_row"] = torch.zeros(shape[:-1], dtype=torch.float32, device=p.device)
                state["exp_avg_sq_col"] = torch.zeros(shape[:-2] + shape[-1:], dtype=torch.float32,
                                                      device=p.device)
            else:
                state["exp_avg_sq"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
            state["RMS"] = 0
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            first_moment = group["beta1"] is not None
            buckets = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Adafactor does not support sparse gradients")
                factored = p.dim() >= 2
                state = self._init_state(p, factored, first_moment)
                state["step"] += 1
                buckets.setdefault((p.device, p.dtype, factored, state["step"]), []).append(p)
            for (_, dtype, factored, step), ps in buckets.items():
                self._update(group, ps, dtype, factored, step, first_moment)
        return loss

    def _update(self, group, ps, dtype, factored, step, first_moment):
        states = [self.state[p] for p in ps]
        low = dtype != torch.float32
        grads = [p.grad.float() if p.grad.dtype != torch.float32 else p.grad for p in ps]
        p32 = [p.float() for p in ps] if low else list(ps)
        inv_sqrt_n = [p.numel() ** -0.5 for p in ps]
        rms = list(torch._foreach_norm(p32, 2))
        torch._foreach_mul_(rms, inv_sqrt_n)
        for s, r in zip(states, rms):
            s["RMS"] = r
        base_lr = self._base_lr(group, step)
        if group["scale_parameter"]:
            lrs = torch._foreach_clamp_min(rms, group["eps"][1])
            torch._foreach_mul_(lrs, base_lr)
        else:
            lrs = base_lr
        beta2t = 1.0 - math.pow(step, group["decay_rate"])
        sq = torch._foreach_mul(grads, grads)
        torch._foreach_add_(sq, group["eps"][0])
        if factored:
            updates = []
            for s, u, g in zip(states, sq, grads):
                row, col = s["exp_avg_sq_row"], s["exp_avg_sq_col"]
                row.mul_(beta2t).add_(u.mean(dim=-1), alpha=1.0 - beta2t)
                col.mul_(beta2t).add_(u.mean(dim=-2), alpha=1.0 - beta2t)
                r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                c_factor = col.unsqueeze(-2).rsqrt()
                updates.append(torch.mul(r_factor, c_factor).mul_(g))
        else:
            v = [s["exp_avg_sq"] for s in states]
            torch._foreach_mul_(v, beta2t)
            torch._foreach_add_(v, sq, alpha=1.0 - beta2t)
            updates = torch._foreach_rsqrt(v)
            torch._foreach_mul_(updates, grads)
        clip = list(torch._foreach_norm(updates, 2))  # update /= max(1, RMS(update) / threshold)
        torch._foreach_mul_(clip, [n / group["clip_threshold"] for n in inv_sqrt_n])
        torch._foreach_clamp_min_(clip, 1.0)
        torch._foreach_div_(updates, clip)
        torch._foreach_mul_(updates, lrs)
        if first_moment:
            m = [s["exp_avg"] for s in states]
            torch._foreach_mul_(m, group["beta1"])
            torch._foreach_add_(m, updates, alpha=1 - group["beta1"])
            updates = m
        if group["weight_decay"] != 0:
            decay = torch._foreach_mul(p32, lrs)
            torch._foreach_add_(p32, decay, alpha=-group["weight_decay"])
        torch._foreach_sub_(p32, updates)
        if low:
            torch._foreach_copy_(list(ps), p32)


@dataclass
class T5AdafactorConfig(FairseqDataclass):
    adafactor_eps: Any = field(default=(1e-30, 1e-3), metadata={
        "help": "(eps1, eps2): regularizer of the squared gradient, floor of the parameter scale"})
    clip_threshold: float = field(default=1.0, metadata={"help": "threshold of the update's RMS"})
    decay_rate: float = field(default=-0.8, metadata={"help": "decay of the second moment"})
    beta1: Optional[float] = field(default=None, metadata={"help": "first moment (None: none)"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    scale_parameter: bool = field(default=True, metadata={"help": "scale the step by the parameter RMS"})
    relative_step: bool = field(default=False, metadata={
        "help": "T5's time-dependent step size instead of optimization.lr (then set lr to [0])"})
    warmup_init: bool = field(default=False, metadata={"help": "warm-up with relative_step"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("t5_adafactor", dataclass=T5AdafactorConfig)
class T5Adafactor(OwnClipMixin, FairseqOptimizer):
    def __init__(self, cfg: T5AdafactorConfig, params):
        super().__init__(cfg)
        self._optimizer = Adafactor(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        lr = None if self.cfg.relative_step else self.cfg.lr[0]
        return {"lr": lr, "eps": tuple(self.cfg.adafactor_eps), "clip_threshold": self.cfg.clip_threshold,
                "decay_rate": self.cfg.decay_rate, "beta1": self.cfg.beta1,
                "weight_decay": self.cfg.weight_decay, "scale_parameter": self.cfg.scale_parameter,
                "relative_step": self.cfg.relative_step, "warmup_init": self.cfg.warmup_init}
