"""liger-kernel's RMSNorm and gated-GELU kernels behind ``model.fused_norm_ffn`` (optional import).

T5 v1.1's RMSNorm and gated GELU have Triton kernels in liger-kernel (``pip install liger-kernel``,
the ``[gpu]`` extra); we call its autograd functions and keep our own parameters, so the state_dict,
checkpoints and the Hugging Face export are the same on both paths.

- RMSNorm: ``LigerRMSNormFunction`` with offset 0 and casting mode ``gemma`` (x and the weight in
  fp32, the result cast back to x's dtype), which is what our eager ``F.rms_norm`` computes; the
  weight is first cast to x's dtype as on the eager path. ``in_place=False``: the kernel must not
  write dx into the incoming gradient, which autograd may share with a residual branch.
- Gated GELU: ``LigerGELUMulFunction(gate, value)`` = gelu_tanh(gate) * value, T5 v1.1's
  ``gelu_new``. Our one ``wi`` matrix (gate rows, then value rows) is applied as two matmuls over
  its row halves (contiguous views of the same parameter), since the kernel takes contiguous
  gate and value tensors; the feed-forward dropout stays after the product, before ``wo``.

Choices (``model.fused_norm_ffn``):

- ``eager``: PyTorch ops (the only path on CPU).
- ``auto`` (default): follows `AUTO_USES_LIGER`, which is False until a GPU measurement
  (``benchmarks/bench_model.py --device cuda --skip-cpu --norm-ffn``) shows liger faster; under
  ``model.compile`` inductor fuses these element-wise ops itself.
- ``liger``: demands the kernels. The ``ast_t5_paper`` family (LayerNorm, ReLU) refuses it at
  build. A t5_v11 model on a machine that cannot run them (no liger-kernel, no CUDA) still
  builds, with a warning, so a CPU machine can load the checkpoint to convert or inspect it; its
  first forward then fails with a one-line error. Use ``model.fused_norm_ffn=eager`` there.

liger's kernels do not run under ``TRITON_INTERPRET=1`` (triton 3.9's interpreter implements
neither libdevice's ``rsqrt``/``tanh`` nor float scalar arguments), so the CPU tests cover the
wiring with reference functions and the CUDA tests (``-m cuda``) the kernels themselves.
"""
import logging
from typing import Optional, Tuple

import torch

logger = logging.getLogger(__name__)

FUSED_NORM_FFN_CHOICES = ("auto", "eager", "liger")
# Whether ``auto`` picks liger on CUDA. No GPU measurement yet (BENCHMARKS.md, issue 11, "RMSNorm
# and gated GELU"): eager until `bench_model.py --norm-ffn` says otherwise.
AUTO_USES_LIGER = False
LIGER_RMS_CASTING_MODE = "gemma"  # fp32 math, result in x's dtype: what F.rms_norm computes
LIGER_DEVICE_TYPES = ("cuda",)  # where the kernels run (the CPU wiring tests widen it)

_ops = None  # (rms_norm_function, gelu_mul_function) once imported


def liger_norm_ffn_ops() -> Tuple[Optional[tuple], str]:
    """((LigerRMSNormFunction, LigerGELUMulFunction), "") or (None, the reason they cannot load)."""
    global _ops
    if _ops is None:
        try:
            from liger_kernel.ops import LigerGELUMulFunction, LigerRMSNormFunction
        except Exception as e:  # ImportError, or triton failing to initialize
            return None, f"liger-kernel is not importable ({type(e).__name__}: {e})"
        _ops = (LigerRMSNormFunction, LigerGELUMulFunction)
    return _ops, ""


def liger_unavailable_reason(family: str, device: Optional[torch.device] = None) -> str:
    """Why the liger path cannot run for ``family`` (on ``device``, default: is CUDA present), or ""."""
    if family != "t5_v11":
        return f"family {family} has no RMSNorm or gated GELU (liger's kernels are for t5_v11)"
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    if not cuda:
        return "liger's kernels are CUDA only" + ("" if device is None else f" (input on {device})")
    ops, reason = liger_norm_ffn_ops()
    return reason if ops is None else ""


def resolve_fused_norm_ffn(choice: str, family: str) -> str:
    """The implementation a model built now gets: "eager" or "liger". Logs the choice once."""
    choice = str(choice)
    if choice not in FUSED_NORM_FFN_CHOICES:
        raise ValueError(f"model.fused_norm_ffn must be one of {FUSED_NORM_FFN_CHOICES}, got {choice!r}")
    if choice == "eager":
        return "eager"
    if choice == "auto":
        if AUTO_USES_LIGER and family == "t5_v11" and not liger_unavailable_reason(family):
            logger.info("RMSNorm / gated GELU: liger-kernel (auto)")
            return "liger"
        logger.info("RMSNorm / gated GELU: eager (auto: %s)",
                    "no GPU measurement shows liger faster yet" if not AUTO_USES_LIGER else
                    liger_unavailable_reason(family) or "not a t5_v11 model")
        return "eager"
    if family != "t5_v11":  # a configuration mistake on any machine
        raise ValueError(f"model.fused_norm_ffn=liger: {liger_unavailable_reason(family)}; use eager or auto")
    reason = liger_unavailable_reason(family)
    if reason:  # a CPU machine may build the model only to load and convert a checkpoint
        logger.warning("model.fused_norm_ffn=liger cannot run in this process (%s); the first forward "
                       "will raise. Use model.fused_norm_ffn=eager here.", reason)
    else:
        logger.info("RMSNorm / gated GELU: liger-kernel")
    return "liger"


def _ops_for(x: torch.Tensor, what: str):
    ops, reason = liger_norm_ffn_ops()
    if ops is None or x.device.type not in LIGER_DEVICE_TYPES:
        reason = reason or f"liger's kernels are CUDA only (input on {x.device})"
        raise RuntimeError(f"model.fused_norm_ffn=liger cannot run the {what}: {reason}; "
                           "use model.fused_norm_ffn=eager")
    return ops


def liger_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """T5 RMSNorm of x (..., dim) with liger's kernel; same math and dtypes as norms.RMSNorm."""
    rms_norm, _ = _ops_for(x, "RMSNorm")
    return rms_norm.apply(x, weight.to(x.dtype), eps, 0.0, LIGER_RMS_CASTING_MODE, False, None)


def liger_gelu_mul(gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * value with liger's kernel (same shapes; made contiguous by liger)."""
    _, gelu_mul = _ops_for(gate, "gated GELU")
    return gelu_mul.apply(gate, value)
