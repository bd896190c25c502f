"""Scaled dot-product attention behind one switch (`AstT5Config.attention_backend`).

    out = dropout(softmax(scale * q k^T + bias + masks)) v

- ``torch``: the eager reference, written out (fused_ops' PyTorch reference for softmax-dropout).
- ``fused``: the same, with softmax + dropout + bias in the fused_ops CUDA kernel. Raises where it
  cannot run (CPU, extension missing).
- ``sdpa``: torch.nn.functional.scaled_dot_product_attention, the bias and masks as one float mask.
- ``flash``: FlashAttention for bias-free calls (the paper decoder's self-attention, all cross
  attention): the flash-attn package when installed and the inputs are half precision on a GPU,
  else PyTorch's built-in flash SDPA kernel. Calls with a bias, or with padding that the chosen
  kernel cannot mask, go to ``sdpa``, logged once.
- ``auto``: biased calls use ``fused`` on a GPU when the kernel can run, else ``sdpa``; bias-free
  calls use ``sdpa`` (which picks flash kernels itself). Each distinct choice is logged once.

Masks: ``key_padding_mask`` (B, S) bool, True at padded keys; ``causal`` lets query i see keys
j <= i (queries and keys aligned at the start; used only when T == S).
"""
import importlib.util
import logging
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

import fused_ops

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "torch", "fused", "sdpa", "flash")
_LOGGED = set()  # texts already logged by log_once


def log_once(message: str, *args) -> None:
    """Log ``message % args`` at INFO the first time this exact text is seen in the process."""
    text = message % args if args else message
    if text not in _LOGGED:
        _LOGGED.add(text)
        logger.info(text)


def flash_attn_installed() -> bool:
    """Whether the optional flash-attn package can be imported (checked without importing it)."""
    return importlib.util.find_spec("flash_attn") is not None


def _mask_value(dtype: torch.dtype) -> float:
    """A large finite negative for masked logits: fully masked rows stay finite (no NaN)."""
    return torch.finfo(dtype).min


def _boolean_mask(key_padding_mask, causal, q_len, k_len, device) -> Optional[torch.Tensor]:
    """True where attention is forbidden: (B, 1, 1, S), (1, 1, T, S) or (B, 1, T, S); or None."""
    masked = None
    if key_padding_mask is not None:
        masked = key_padding_mask[:, None, None, :]
    if causal:
        future = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)[None, None]
        masked = future if masked is None else masked | future
    return masked


def _additive_mask(masked: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if masked is None:
        return None
    return torch.zeros(masked.shape, dtype=dtype, device=masked.device).masked_fill_(masked, _mask_value(dtype))


def _softmax_attention(q, k, v, bias, masked, dropout_p, scale, backend):
    """Explicit scores -> fused_ops.softmax_dropout (``torch`` or ``fused``) -> weighted sum."""
    scores = torch.matmul(q * scale if scale != 1.0 else q, k.transpose(-1, -2))  # (B, H, T, S)
    mask = _additive_mask(masked, torch.float32 if scores.dtype != torch.float64 else scores.dtype)
    probs = fused_ops.softmax_dropout(scores, dropout_p, training=dropout_p > 0.0, bias=bias,
                                      mask=mask, backend=backend)
    return torch.matmul(probs, v)


def _sdpa(q, k, v, bias, masked, dropout_p, scale, causal):
    """PyTorch SDPA; bias and masks folded into one float mask (bool when there is no bias)."""
    if bias is None and masked is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=False)
    if bias is None:
        if causal and masked.size(0) == 1:  # causal only: let SDPA pick its causal kernels
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=True)
        attn_mask = ~masked
    else:
        attn_mask = bias.to(q.dtype)
        if masked is not None:
            attn_mask = attn_mask.masked_fill(masked, _mask_value(q.dtype))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def _flash(q, k, v, key_padding_mask, causal, dropout_p, scale):
    """Bias-free attention with FlashAttention; None when no flash kernel can take these inputs."""
    half = q.dtype in (torch.float16, torch.bfloat16)
    if q.is_cuda and half and flash_attn_installed():
        from .flash_attn_adapter import flash_attn_bshd

        log_once("attention backend flash: using the flash-attn package")
        return flash_attn_bshd(q, k, v, key_padding_mask, causal, dropout_p, scale)
    if key_padding_mask is not None:
        return None  # PyTorch's flash kernel takes no mask
    from torch.nn.attention import SDPBackend, sdpa_kernel

    log_once("attention backend flash: using PyTorch's built-in flash SDPA kernel")
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=causal)
    except RuntimeError as e:
        raise RuntimeError(f"attention_backend='flash' cannot run on these inputs ({q.device.type}, {q.dtype}): "
                           f"{e}; use 'auto' or 'sdpa'") from e


def _auto_choice(device: torch.device, has_bias: bool) -> str:
    if not has_bias:
        log_once("attention backend auto: bias-free attention -> sdpa")
        return "sdpa"
    ok, reason = fused_ops.fused_backend_status(device) if device.type == "cuda" else (False, f"{device.type} tensors")
    choice = "fused" if ok else "sdpa"
    log_once("attention backend auto: biased attention -> %s (%s)", choice,
             "fused softmax-dropout kernel available" if ok else f"fused kernel unavailable: {reason}")
    return choice


def resolve_backend(backend: str, device: torch.device, has_bias: bool) -> str:
    """The backend a call will start from: ``auto`` resolved, ``flash`` with a bias -> ``sdpa``."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return _auto_choice(device, has_bias)
    if backend == "flash" and has_bias:
        log_once("attention backend flash: biased attention (relative positions) -> sdpa")
        return "sdpa"
    return backend


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention runs in for activations like ``x``: autocast's when it is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def fold_masks(backend: str, bias: Optional[torch.Tensor], key_padding_mask: Optional[torch.Tensor],
               causal: bool, dtype: Optional[torch.dtype] = None
               ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], bool]:
    """Fold padding and causal masks into the bias once, for kernels that take one float mask.

    A stack calls this once and passes the result to every layer, instead of each layer building
    a (B, H, T, S) mask. The fused kernel broadcasts bias and masks itself, so for it (and when
    there is no bias) the inputs come back unchanged.

    Args:
        dtype: the attention's compute dtype (see `compute_dtype`); the folded bias is cast to it
            once, with masked entries at that dtype's lowest finite value.
    Returns:
        (bias, key_padding_mask, causal) to pass to `attention`.
    """
    if bias is None or resolve_backend(backend, bias.device, True) == "fused":
        return bias, key_padding_mask, causal
    if dtype is not None:
        bias = bias.to(dtype)
    masked = _boolean_mask(key_padding_mask, causal, bias.size(-2), bias.size(-1), bias.device)
    if masked is not None:
        bias = bias.masked_fill(masked, _mask_value(bias.dtype))
    return bias, None, False


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              bias: Optional[torch.Tensor] = None,
              key_padding_mask: Optional[torch.Tensor] = None, causal: bool = False,
              dropout_p: float = 0.0, scale: float = 1.0, backend: str = "auto") -> torch.Tensor:
    """Multi-head attention core.

    Args:
        q: (B, H, T, D) queries; k, v: (B, H, S, D). float32/float16/bfloat16 (float64: torch/sdpa).
        bias: optional additive (1 or B, H, T, S) logits bias, e.g. a relative position bias.
        key_padding_mask: optional (B, S) bool, True at padded keys.
        causal: forbid keys after the query (requires T == S).
        dropout_p: attention-probability dropout (pass 0.0 in eval mode).
        scale: multiplier of q k^T (T5 uses 1.0; the paper's model head_dim ** -0.5).
        backend: one of ATTENTION_BACKENDS.
    Returns:
        (B, H, T, D) tensor in q's dtype.
    """
    if causal and q.size(2) != k.size(2):
        raise ValueError(f"causal attention needs as many queries as keys, got {q.size(2)} and {k.size(2)}")
    requested, backend = backend, resolve_backend(backend, q.device, bias is not None)
    if backend == "flash":
        out = _flash(q, k, v, key_padding_mask, causal, dropout_p, scale)
        if out is not None:
            return out
        log_once("attention backend flash: padded keys need a mask -> sdpa for those calls")
        backend = "sdpa"
    masked = _boolean_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
    if backend == "sdpa":
        return _sdpa(q, k, v, bias, masked, dropout_p, scale, causal)
    # auto -> fused: softmax_dropout itself falls back (and says so) for inputs the kernel does not
    # take (float64, rows longer than MAX_FUSED_COLS); an explicit "fused" raises instead
    return _softmax_attention(q, k, v, bias, masked, dropout_p, scale, "auto" if requested == "auto" else backend)
