"""Softmax + dropout over attention scores with an additive bias: fused CUDA kernel and reference.

    out = dropout(softmax(scores + bias + mask, dim=-1), p)

One public function, `softmax_dropout`, chooses between the CUDA kernel in ``csrc/`` (one pass over
each row, fp32 accumulation, a bit-packed keep mask saved for backward, the bias gradient) and
`softmax_dropout_reference`, plain PyTorch, which runs wherever the kernel cannot (CPU, no
extension). The kernel draws its dropout from PyTorch's CUDA generator (Philox seed and offset), so
``torch.manual_seed`` and activation-checkpoint recomputation reproduce it.

Measured on an H100 inside attention (B16 H12 T=S=1024 D64 bf16, fwd+bwd), explicit scores plus
this kernel take 4.53 ms (p=0) / 4.73 ms (p=0.1) against 2.62 ms for SDPA with the bias as a mask,
so the model's ``attention_backend=auto`` never picks it (ast_t5/modules/attention_backends.py);
it stays selectable as ``fused``. `benchmarks/bench_attention.py --device cuda` re-measures it.
"""
import logging
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _extension

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "fused")
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_FUSED_COLS = 16384  # longest key length in the kernel's launch table (kMaxCols in csrc/)
MASK_WORD_BITS = 32  # the kernel packs the keep mask as one int32 word per 32 keys
_LOGGED_CHOICES = set()  # (backend, reason) pairs already logged: `auto` says its choice once


def softmax_dropout(scores: torch.Tensor, p: float, training: bool = True, *,
                    bias: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
                    backend: str = "auto") -> torch.Tensor:
    """Dropout of the softmax over the last dimension of ``scores + bias + mask``.

    Args:
        scores: (..., Tq, Tk) attention logits, usually (B, H, Tq, Tk); float32, float16 or
            bfloat16 (float64 too on the reference path). Never modified.
        p: dropout probability in [0, 1); kept values are scaled by 1 / (1 - p).
        training: dropout is applied only when True (and p > 0).
        bias: optional additive term broadcastable to ``scores`` (e.g. a relative-position bias
            (1, H, Tq, Tk)); any float dtype. Receives a gradient.
        mask: optional additive mask broadcastable to ``scores`` (e.g. padding (B, 1, 1, Tk) with
            0 for kept keys and -inf or a large negative value for masked ones). No gradient.
        backend: "fused" (the CUDA kernel; raises if it cannot run), "torch" (the reference) or
            "auto" (the kernel when it can run, else the reference; logs its choice once).
    Returns:
        Tensor of the shape and dtype of ``scores``. The softmax is computed in float32 for
        half-precision inputs. A row whose every entry is -inf gives NaN, as in PyTorch.
    """
    out, _ = _dispatch(scores, p, training, bias, mask, backend, return_keep=False)
    return out


def softmax_dropout_with_mask(scores: torch.Tensor, p: float, training: bool = True, *,
                              bias: Optional[torch.Tensor] = None,
                              mask: Optional[torch.Tensor] = None,
                              backend: str = "auto") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """`softmax_dropout` that also returns its keep mask (for tests and debugging).

    Returns:
        (out, keep): ``out`` as in `softmax_dropout`; ``keep`` a bool tensor of the shape of
        ``out`` (True where the value was kept), or None when no dropout was applied.
    """
    return _dispatch(scores, p, training, bias, mask, backend, return_keep=True)


def softmax_dropout_reference(scores: torch.Tensor, p: float, training: bool = True, *,
                              bias: Optional[torch.Tensor] = None,
                              mask: Optional[torch.Tensor] = None,
                              return_keep: bool = False):
    """The PyTorch definition of `softmax_dropout` (same arguments); differentiable.

    With ``return_keep`` it returns ``(out, keep)`` like `softmax_dropout_with_mask`.
    """
    compute_dtype = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
    x = scores.to(compute_dtype)
    if bias is not None:
        x = x + bias.to(compute_dtype)
    if mask is not None:
        x = x + mask.to(compute_dtype)
    probs = torch.softmax(x, dim=-1)
    keep = None
    if not (training and p > 0.0):
        out = probs
    elif return_keep:
        keep = torch.rand(probs.shape, device=probs.device) >= p
        out = probs * keep / (1.0 - p)
    else:
        out = F.dropout(probs, p=p, training=True)
    out = out.to(scores.dtype)
    return (out, keep) if return_keep else out


def fused_backend_status(device: Optional[torch.device] = None) -> Tuple[bool, str]:
    """Whether the fused kernel can run (on ``device``, default: any GPU), and why not if not.

    May compile the extension on first use (see _extension.py); never runs at import.
    """
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    if device is not None and device.type != "cuda":
        return False, f"tensors are on {device.type}, the kernel runs on CUDA only"
    if _extension.load() is None:
        return False, _extension.error() or "the fused_ops extension could not be loaded"
    return True, "the fused_ops CUDA extension is loaded"


def fused_backend_available() -> bool:
    """True when the fused CUDA kernel can run in this process (a GPU and the extension)."""
    return fused_backend_status()[0]


def _unsupported_reason(scores, bias, mask) -> Optional[str]:
    """Why the kernel cannot take these inputs, or None. Cheap checks first: no CUDA init on CPU."""
    if not scores.is_cuda:
        return f"scores are on {scores.device.type}, the kernel runs on CUDA only"
    if scores.dtype not in SUPPORTED_DTYPES:
        return f"dtype {scores.dtype} is not one of {SUPPORTED_DTYPES}"
    if scores.dim() < 2 or not 1 <= scores.size(-1) <= MAX_FUSED_COLS:
        return f"key length {scores.size(-1)} is outside [1, MAX_FUSED_COLS={MAX_FUSED_COLS}]"
    if mask is not None and mask.requires_grad:
        return "mask requires grad: pass learnable additive terms as `bias`"
    ok, reason = fused_backend_status(scores.device)
    return None if ok else reason


def _choose(scores, bias, mask, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"softmax_dropout backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    reason = _unsupported_reason(scores, bias, mask)
    if backend == "fused" and reason is not None:
        raise RuntimeError(f"softmax_dropout(backend='fused') cannot run: {reason}")
    choice = "fused" if reason is None else "torch"
    key = (choice, reason)
    if backend == "auto" and key not in _LOGGED_CHOICES:
        _LOGGED_CHOICES.add(key)
        logger.info("softmax_dropout backend auto -> %s (%s)", choice,
                    reason or "fused CUDA kernel available")
    return choice


def _dispatch(scores, p, training, bias, mask, backend, return_keep):
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if _choose(scores, bias, mask, backend) == "torch":
        if return_keep:
            return softmax_dropout_reference(scores, p, training, bias=bias, mask=mask,
                                             return_keep=True)
        return softmax_dropout_reference(scores, p, training, bias=bias, mask=mask), None
    from ._fused_autograd import fused_softmax_dropout

    return fused_softmax_dropout(scores, p, training, bias, mask, _extension.load(), return_keep)
