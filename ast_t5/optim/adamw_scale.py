"""AdamW whose step is scaled by the RMS of each parameter (the optimizer nanoT5 found best for
T5 pre-training, after Adafactor's relative step size).

Update for a parameter ``p`` with Adam moments ``m``, ``v``::

    step = lr * max(eps_scale, rms(p)) * m_hat / (sqrt(v_hat) + eps)
    p   -= step + lr * weight_decay * p        (decoupled weight decay)

so the effective learning rate is relative to the parameter's scale, which makes one ``lr`` fit
matrices of very different initial scales (T5 initialises embeddings and projections differently).

Three implementations of the same update, none of which reads a value back to the host but the
reference loop:

- ``foreach=True`` (the default) updates all parameters of a device and dtype with torch's
  multi-tensor kernels and keeps each parameter's RMS as a device tensor: ten passes (the two
  moments, the norm, the denominator, the update and its scaling, the sum), 23 reads or writes of
  a tensor the size of the parameters, about 23 GB per step for T5-base's 248M fp32 master weights;
- ``fused`` (with foreach; default: on CUDA and CPU): fp32 parameters with fp32 gradients take
  torch's fused AdamW kernel (``torch._fused_adamw_``, what ``torch.optim.AdamW(fused=True)``
  runs), one call per parameter whose learning rate is a device tensor, lr x max(rms_floor,
  RMS(p)), computed for all parameters by foreach ops first: one read of the parameters for the
  norms, then one pass that reads parameter, gradient and moments and writes parameter and
  moments, about 8 GB per step for T5-base (`benchmarks/bench_optimizer.py` times both side by
  side: 7.6-9.4x on a 2-core CPU). The same algebra, lr s m / (1 - beta1^t) / (sqrt(v / (1 -
  beta2^t)) + eps), with the decay applied by a foreach multiply before it;
- ``compiled`` (with foreach; default off until measured on a GPU): fp32 parameters with fp32
  gradients take the foreach update traced by torch.compile (`_scaled_adam_update`) into a few
  multi-tensor kernels: inductor fuses each parameter's chain (moments, norm, update) and groups
  the parameters into horizontal kernels, 12 kernels for T5-base's 198 tensors in its GPU code
  (`scripts/check_gpu_codegen.py`'s lowering on the CPU), where the fused path makes a call, of a
  few thread blocks for most tensors, per parameter. The learning rate and the step count are
  device tensors, so the graph compiles once per run (T5-base: about 50 s on a CPU core);
- ``foreach=False``: the per-parameter loop the others are tested against.

Clipping goes through ast_t5.optim.clipping (device-safe, foreach).

``step(grad_factor=f)`` multiplies every gradient by ``f`` (a number or a 0-dim tensor) before using
it. Under ``common.bf16`` fairseq's mixed-precision wrapper keeps such a factor (the sample-size
normalization times the clip coefficient) and multiplies the fp32 gradients by it in a pass of its
own before the step: one read and one write of the gradients, 2 GB per update for T5-base. Our
tasks' step (`ast_t5.optim.mixed_precision.fp16_optimizer_step`) hands it to this optimizer
instead (`folds_gradient_factor`), and the compiled update multiplies inside its kernels, where it
reads each gradient anyway: no pass of its own. The other paths make the same multiply fairseq
would (one foreach multiply), so every path gives bit for bit the update of fairseq's own step.
(Not through fairseq's ``supports_step_with_scale``: under bf16 fairseq's wrapper never resets its
factor on that path, so it would compound over the updates.)
"""
import ast
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from .clipping import OwnClipMixin

logger = logging.getLogger(__name__)

RMS_FLOOR = 1e-3  # Adafactor's epsilon2: parameters near zero still move (Shazeer & Stern, 2018)


class AdamWScale(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 rms_floor=RMS_FLOOR, foreach=True, fused=None, compiled=False):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamWScale settings lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      rms_floor=rms_floor, foreach=foreach, fused=fused, compiled=compiled))

    @property
    def supports_memory_efficient_fp16(self):
        return False

    @property
    def supports_flat_params(self):
        return True

    folds_gradient_factor = True  # step takes grad_factor (module docstring)

    @torch.no_grad()
    def step(self, closure=None, grad_factor=None):
        """One update, every gradient multiplied by ``grad_factor`` first (None: by 1; a number or a
        0-dim tensor; the gradients may be left multiplied or not)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("AdamWScale does not support sparse gradients")
            if group.get("foreach", True):
                self._foreach_update(params, group, grad_factor)
            else:
                beta1, beta2 = group["betas"]
                for p in params:
                    self._update(p, group, beta1, beta2, grad_factor)
        return loss

    def _state(self, p):
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        return state

    def _foreach_update(self, params, group, grad_factor=None):
        """The update of ``_update`` for many parameters at once, without host synchronization."""
        beta1, beta2 = group["betas"]
        by_key = {}
        for p in params:
            state = self._state(p)
            state["step"] += 1
            by_key.setdefault((p.device, p.dtype, state["step"]), []).append(p)
        for (device, dtype, t), ps in by_key.items():
            if group.get("compiled") and dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in ps):
                self._compiled_update(ps, group, t, grad_factor)
                continue
            if grad_factor is not None:  # the multiply fairseq's wrapper would have made
                _multiply([p.grad for p in ps], grad_factor)
            if _takes_fused(group.get("fused"), device, dtype, ps):
                self._fused_update(ps, group, t)
                continue
            states = [self.state[p] for p in ps]
            m = [s["exp_avg"] for s in states]
            v = [s["exp_avg_sq"] for s in states]
            grads = [p.grad if p.grad.dtype == torch.float32 else p.grad.float() for p in ps]
            p32 = ps if dtype == torch.float32 else [p.float() for p in ps]
            torch._foreach_mul_(m, beta1)
            torch._foreach_add_(m, grads, alpha=1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
            # per-parameter step scale as device tensors: -lr * max(floor, ||p|| / sqrt(numel)) * bias terms
            bc1, bc2 = 1 - beta1 ** t, 1 - beta2 ** t
            scales = list(torch._foreach_norm(p32, 2))
            torch._foreach_mul_(scales, [p.numel() ** -0.5 for p in ps])
            torch._foreach_clamp_min_(scales, group["rms_floor"])
            torch._foreach_mul_(scales, -group["lr"] * math.sqrt(bc2) / bc1)
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, group["eps"] * math.sqrt(bc2))
            update = torch._foreach_div(m, denom)
            torch._foreach_mul_(update, scales)
            if group["weight_decay"]:
                torch._foreach_mul_(p32, 1 - group["lr"] * group["weight_decay"])
            torch._foreach_add_(p32, update)
            if dtype != torch.float32:
                torch._foreach_copy_(ps, p32)

    def _fused_update(self, ps, group, t):
        """The update of ``_update`` by torch's fused AdamW kernel, one parameter per call with its
        own learning rate (fp32 parameters and gradients on one device; module docstring)."""
        beta1, beta2 = group["betas"]
        lrs = list(torch._foreach_norm(ps, 2))
        torch._foreach_mul_(lrs, [p.numel() ** -0.5 for p in ps])
        torch._foreach_clamp_min_(lrs, group["rms_floor"])
        torch._foreach_mul_(lrs, group["lr"])
        if group["weight_decay"]:
            torch._foreach_mul_(ps, 1 - group["lr"] * group["weight_decay"])
        # the kernels read the step count from a device tensor (no host value inside the kernel)
        step = torch.full((), float(t), dtype=torch.float32, device=ps[0].device)
        for p, lr in zip(ps, lrs):
            state = self.state[p]
            torch._fused_adamw_([p], [p.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [step], lr=lr,
                                beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False,
                                maximize=False)

    def _compiled_update(self, ps, group, t, grad_factor=None):
        """The update of ``_update`` by `_scaled_adam_update` under torch.compile (fp32 parameters and
        gradients on one device; module docstring). The learning rate (which the schedule changes
        every update), the step count and the gradient factor go in as device tensors, so that no
        value of theirs is a guard and the graph compiles once."""
        global _COMPILED_UPDATE, _EAGER_UNDER_MODE_LOGGED
        update = _COMPILED_UPDATE
        if _user_dispatch_mode_active():
            # torch.compile refuses to run under a user's TorchDispatchMode (an op counter, a flop
            # counter, a debugging mode): fullgraph would raise. The same function runs eagerly.
            if not _EAGER_UNDER_MODE_LOGGED:
                logger.info("adamw_scale (compiled=true): a TorchDispatchMode is active, which torch.compile "
                            "cannot run under: the update runs its foreach ops eagerly while it is")
                _EAGER_UNDER_MODE_LOGGED = True
            update = _scaled_adam_update
        first = update is None
        if first:
            logger.info("adamw_scale (compiled=true): compiling the update of %d tensors with torch.compile "
                        "(once per run; T5-base: about a minute)", len(ps))
            # no size asserts: the generated code would check each of the ~800 tensors' sizes and strides
            # on every call (0.3 ms of host time per T5-base update on a 2-core CPU, in the window after
            # fairseq's sync where the GPU waits for the host), which dynamo's guards on these static
            # shapes have checked already
            _COMPILED_UPDATE = update = torch.compile(_scaled_adam_update, fullgraph=True, dynamic=False,
                                                      options={"size_asserts": False})
            start = time.perf_counter()
        beta1, beta2 = group["betas"]
        device = ps[0].device
        states = [self.state[p] for p in ps]
        lr = torch.full((), group["lr"], dtype=torch.float32, device=device)
        step = torch.full((), float(t), dtype=torch.float32, device=device)
        factor = _device_scalar(1.0 if grad_factor is None else grad_factor, device)  # always a tensor: one graph
        update(ps, [p.grad for p in ps], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
               [p.numel() ** -0.5 for p in ps], lr, step, factor, beta1, beta2, group["eps"],
               group["rms_floor"], group["weight_decay"])
        if first:
            logger.info("adamw_scale (compiled=true): the update compiled and ran in %.1f s",
                        time.perf_counter() - start)

    def _update(self, p, group, beta1, beta2, grad_factor=None):
        """Reference: one parameter at a time (reads the RMS back to the host)."""
        if grad_factor is not None:
            p.grad.mul_(grad_factor)
        grad = p.grad.float()
        state = self._state(p)
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


_COMPILED_UPDATE = None  # torch.compile(_scaled_adam_update), made at the first compiled step
_EAGER_UNDER_MODE_LOGGED = False


def _user_dispatch_mode_active() -> bool:
    """Whether a TorchDispatchMode of the user's (not one of torch's own infrastructure modes) is
    active: torch.compile does not run under one."""
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    return is_in_torch_dispatch_mode(include_infra_modes=False)


def _device_scalar(value, device: torch.device) -> torch.Tensor:
    """``value`` (a number or a one-element tensor) as a 0-dim fp32 tensor on ``device``."""
    if torch.is_tensor(value):
        return value.detach().reshape(()).to(device=device, dtype=torch.float32)
    return torch.full((), float(value), dtype=torch.float32, device=device)


def _multiply(grads, factor) -> None:
    """``grads`` (one device) multiplied in place by ``factor``, as fairseq's ``multiply_grads`` does."""
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        torch._foreach_mul_(group, factor.to(group[0].device) if torch.is_tensor(factor) else factor)


def _scaled_adam_update(ps, grads, exp_avgs, exp_avg_sqs, inv_sqrt_numels, lr, step, grad_factor, beta1, beta2, eps,
                        rms_floor, weight_decay):
    """`AdamWScale._update`'s algebra for many fp32 parameters in foreach ops, traced by torch.compile
    (``compiled``): ``lr``, ``step`` and ``grad_factor`` (what every gradient is multiplied by) are
    0-dim device tensors, the rest constants of the run. The gradients are read, never written."""
    grads = torch._foreach_mul(grads, grad_factor)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    bc1, bc2_sqrt = 1 - beta1 ** step, torch.sqrt(1 - beta2 ** step)
    scales = torch._foreach_mul(torch._foreach_norm(ps, 2), inv_sqrt_numels)
    scales = torch._foreach_mul(torch._foreach_clamp_min(scales, rms_floor), -lr * bc2_sqrt / bc1)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps * bc2_sqrt)
    update = torch._foreach_div(exp_avgs, denom)
    torch._foreach_mul_(update, scales)
    if weight_decay:
        torch._foreach_mul_(ps, 1 - lr * weight_decay)
    torch._foreach_add_(ps, update)


def _takes_fused(fused, device: torch.device, dtype: torch.dtype, ps) -> bool:
    """Whether parameters ``ps`` (one device and dtype) take the fused kernel: ``fused`` True, or None
    (auto) on CUDA and CPU (torch's two fused AdamW kernels); fp32 parameters and gradients only (the
    kernel wants one dtype for all four tensors, and the moments are fp32), all contiguous (it wants
    the same strides for the four, and a gradient may be laid out otherwise than its parameter)."""
    if fused is False or (fused is None and device.type not in ("cuda", "cpu")):
        return False
    return dtype == torch.float32 and all(p.grad.dtype == torch.float32 and p.is_contiguous()
                                          and p.grad.is_contiguous() for p in ps)


@dataclass
class AdamWScaleConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    rms_floor: float = field(default=RMS_FLOOR, metadata={"help": "smallest parameter RMS used for scaling"})
    foreach: bool = field(default=True, metadata={
        "help": "multi-tensor (foreach) update without host syncs; false: the per-parameter loop"})
    fused: Optional[bool] = field(default=None, metadata={
        "help": "with foreach: fp32 parameters take torch's fused AdamW kernel, one call per parameter "
                "with its RMS-scaled learning rate as a device tensor (a third of the foreach update's "
                "memory traffic); null (default): on CUDA and CPU"})
    compiled: bool = field(default=False, metadata={
        "help": "with foreach: fp32 parameters take the update compiled by torch.compile into a few "
                "multi-tensor kernels (12 for T5-base on a GPU, against a fused-kernel call per parameter); "
                "compiles once per run (about a minute for T5-base); off until measured on a GPU "
                "(benchmarks/bench_optimizer.py's compiled row)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("adamw_scale", dataclass=AdamWScaleConfig)
class FairseqAdamWScale(OwnClipMixin, FairseqOptimizer):
    def __init__(self, cfg: AdamWScaleConfig, params):
        super().__init__(cfg)
        betas = ast.literal_eval(cfg.adam_betas) if isinstance(cfg.adam_betas, str) else tuple(cfg.adam_betas)
        self._optimizer = AdamWScale(params, **self.optimizer_config, betas=betas)

    @property
    def optimizer_config(self):
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Sequence) else self.cfg.lr
        return {"lr": lr, "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay,
                "rms_floor": self.cfg.rms_floor, "foreach": self.cfg.foreach, "fused": self.cfg.fused,
                "compiled": self.cfg.compiled}
