"""AdamW whose step is scaled by the RMS of each parameter (the optimizer nanoT5 found best for
T5 pre-training, after Adafactor's relative step size).

Update for a parameter ``p`` with Adam moments ``m``, ``v``::

    step = lr * max(eps_scale, rms(p)) * m_hat / (sqrt(v_hat) + eps)
    p   -= step + lr * weight_decay * p        (decoupled weight decay)

so the effective learning rate is relative to the parameter's scale, which makes one ``lr`` fit
matrices of very different initial scales (T5 initialises embeddings and projections differently).
"""
import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

RMS_FLOOR = 1e-3  # Adafactor's epsilon2: parameters near zero still move (Shazeer & Stern, 2018)


class AdamWScale(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 rms_floor=RMS_FLOOR):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamWScale settings lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      rms_floor=rms_floor))

    @property
    def supports_memory_efficient_fp16(self):
        return False

    @property
    def supports_flat_params(self):
        return True

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamWScale does not support sparse gradients")
                self._update(p, group, beta1, beta2)
        return loss

    def _update(self, p, group, beta1, beta2):
        grad = p.grad.float()
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        p32 = p.float()
        rms = p32.pow(2).mean().sqrt().clamp_min(group["rms_floor"]).item()
        step_size = group["lr"] * rms * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        denom = v.sqrt().add_(group["eps"] * math.sqrt(1 - beta2 ** t))
        if group["weight_decay"]:
            p32.mul_(1 - group["lr"] * group["weight_decay"])
        p32.addcdiv_(m, denom, value=-step_size)
        if p32.data_ptr() != p.data_ptr():
            p.copy_(p32)


@dataclass
class AdamWScaleConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    rms_floor: float = field(default=RMS_FLOOR, metadata={"help": "smallest parameter RMS used for scaling"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("adamw_scale", dataclass=AdamWScaleConfig)
class FairseqAdamWScale(FairseqOptimizer):
    def __init__(self, cfg: AdamWScaleConfig, params):
        super().__init__(cfg)
        betas = ast.literal_eval(cfg.adam_betas) if isinstance(cfg.adam_betas, str) else tuple(cfg.adam_betas)
        self._optimizer = AdamWScale(params, **self.optimizer_config, betas=betas)

    @property
    def optimizer_config(self):
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Sequence) else self.cfg.lr
        return {"lr": lr, "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay,
                "rms_floor": self.cfg.rms_floor}
