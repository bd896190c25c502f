"""Gradient norm and clipping on the parameters' own device, with torch's foreach kernels.

fairseq's ``utils.clip_grad_norm_`` moves every per-tensor norm to ``torch.cuda.current_device()``
whenever CUDA is available, even when the gradients are on the CPU (``common.cpu=true`` on a GPU
host), which then fails in ``_foreach_mul_`` ("scalar tensor is expected to be on cpu but is on
cuda:0"); without NVIDIA apex it also warns "amp_C fused kernels unavailable" on every GPU run.
Here the norms are computed per device with ``torch._foreach_norm`` (fp32 accumulation, one
launch per device and dtype where torch has a fused kernel), combined on the first gradient's
device, and the clip factor is applied with ``torch._foreach_mul_``. Nothing is read back to the
host: the norm stays a tensor, so the clip costs no device synchronization.

Semantics are fairseq's: ``total = ||(||g_1||, ..., ||g_n||)||_2``, optionally reduced by
``aggregate_norm_fn`` (model parallel), and for ``max_norm > 0`` every gradient is multiplied by
``min(1, max_norm / (total + 1e-6))``. The norm is returned either way (``max_norm=0`` only
measures).
"""
from collections import defaultdict
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor

CLIP_EPS = 1e-6  # fairseq's and torch's guard against a zero norm


def _grads_by_device_and_dtype(params: Iterable) -> Dict[Tuple[torch.device, torch.dtype], List[Tensor]]:
    if isinstance(params, Tensor):
        params = [params]
    groups: Dict[Tuple[torch.device, torch.dtype], List[Tensor]] = defaultdict(list)
    for p in params:
        g = getattr(p, "grad", None)
        if g is not None:
            groups[(g.device, g.dtype)].append(g.detach())
    return groups


def _norms(grads: List[Tensor]) -> List[Tensor]:
    """fp32 L2 norm of each gradient (foreach kernel; a loop for types foreach lacks)."""
    try:
        return list(torch._foreach_norm(grads, 2, dtype=torch.float32))
    except (RuntimeError, TypeError):  # e.g. sparse gradients, older torch without dtype=
        return [torch.linalg.vector_norm(g, 2, dtype=torch.float32) for g in grads]


def clip_grad_norm_(params: Iterable, max_norm: float,
                    aggregate_norm_fn: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """Total L2 norm of the gradients of ``params`` (fp32, on the first gradient's device), and
    clip them in place to ``max_norm`` when it is > 0. Same contract as fairseq's function."""
    groups = _grads_by_device_and_dtype(params)
    if not groups:
        params = list(params) if not isinstance(params, Tensor) else [params]
        return params[0].new_tensor(0.0, dtype=torch.float32) if params else torch.tensor(0.0)
    home = next(iter(groups))[0]
    per_device = []
    for grads in groups.values():
        norms = _norms(grads)
        per_device.append(torch.linalg.vector_norm(torch.stack(norms), 2).to(home))
    total = per_device[0] if len(per_device) == 1 else torch.linalg.vector_norm(torch.stack(per_device), 2)
    if aggregate_norm_fn is not None:
        total = aggregate_norm_fn(total)
    if max_norm > 0:
        coef = (max_norm / (total + CLIP_EPS)).clamp_(max=1.0)
        for (device, _), grads in groups.items():
            c = coef.to(device)
            try:
                torch._foreach_mul_(grads, c)
            except (RuntimeError, TypeError):
                for g in grads:
                    g.mul_(c)
    return total


class OwnClipMixin:
    """For FairseqOptimizer subclasses: fairseq's Trainer (and its FP16Optimizer wrapper, which
    calls the wrapped fp32 optimizer) clips through ``optimizer.clip_grad_norm``; this routes it to
    the device-safe foreach implementation above."""

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        return clip_grad_norm_(self.params, max_norm, aggregate_norm_fn)
