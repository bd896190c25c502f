"""The optional flash-attn package (Dao et al.) behind `attention_backends` (imported only when used).

flash-attn takes (B, T, H, D) half-precision CUDA tensors. Without padded keys it runs
``flash_attn_func`` on the padded batch; with padded keys (cross-attention over a padded source)
it packs the real keys (static shapes, no host sync: see `_unpad_keys`) and runs
``flash_attn_varlen_func`` with per-sequence key lengths, all queries kept. `torch_varlen_bshd`
does the same with PyTorch's own varlen flash kernel (no dropout) when flash-attn is not installed.
"""
from typing import Optional

import torch
import torch.nn.functional as F


def flash_attn_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    key_padding_mask: Optional[torch.Tensor], causal: bool, dropout_p: float,
                    scale: float) -> torch.Tensor:
    """Bias-free attention. q: (B, H, T, D), k/v: (B, H, S, D) fp16/bf16 CUDA; key_padding_mask:
    (B, S) bool, True at padding. Returns (B, H, T, D)."""
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    bsz, heads, q_len, head_dim = q.shape
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, T|S, H, D)
    if key_padding_mask is None:
        out = flash_attn_func(qb, kb, vb, dropout_p=dropout_p, softmax_scale=scale, causal=causal)
        return out.transpose(1, 2)
    k_unpad, v_unpad, cu_k, max_k = _unpad_keys(kb, vb, key_padding_mask)
    cu_q = torch.arange(0, (bsz + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
    out = flash_attn_varlen_func(qb.reshape(-1, heads, head_dim), k_unpad, v_unpad, cu_q, cu_k,
                                 q_len, max_k, dropout_p=dropout_p, softmax_scale=scale, causal=causal)
    return out.view(bsz, q_len, heads, head_dim).transpose(1, 2)


def _unpad_keys(k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor):
    """(B, S, H, D) keys/values -> the real keys packed at the front of a (B * S, H, D) buffer, the
    cumulative key lengths, and S as the longest (an upper bound the kernels accept).

    Static shapes and no read on the host: the packing is a stable sort of the padding flags (real
    keys first, each sequence's in order), so torch.compile traces it into one graph and an eager
    step waits for nothing. The rows after the real keys belong to no sequence: the varlen kernels
    never read them, and their backward leaves those rows of the key and value gradients unwritten
    (uninitialized memory), so the packed rows go through ``torch.where``, whose backward selects
    the gradient (safe even for NaN garbage) instead of multiplying it.
    """
    heads, head_dim = k.shape[-2:]
    padded = key_padding_mask.reshape(-1)
    k_lengths = (~key_padding_mask).sum(dim=1, dtype=torch.int32)
    cu_k = F.pad(k_lengths.cumsum(0, dtype=torch.int32), (1, 0))
    order = torch.argsort(padded.to(torch.uint8), stable=True)
    real = ~padded.index_select(0, order).view(-1, 1, 1)

    def pack(t):
        return torch.where(real, t.reshape(-1, heads, head_dim).index_select(0, order), 0)

    return pack(k), pack(v), cu_k, key_padding_mask.size(1)


def torch_varlen_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor,
                      scale: float, varlen_attn=None) -> torch.Tensor:
    """Bias-free, non-causal attention over padded keys with PyTorch's varlen flash kernel
    (torch.nn.attention.varlen.varlen_attn: half precision CUDA, no dropout). The padded keys are
    dropped, every query kept. q: (B, H, T, D); k/v: (B, H, S, D); key_padding_mask: (B, S) bool,
    True at padding. ``varlen_attn`` replaces the kernel (tests). Returns (B, H, T, D).

    The kernel takes head sizes that are multiples of 8 only ("head_size must be a multiple of 8,
    this is ensured by padding!": SDPA pads before its flash kernel, the varlen entry point does not),
    so other head sizes are zero-padded to the next multiple of 8 here and the output sliced back:
    the zero columns add nothing to q k^T (the scale is passed explicitly) and give zero output
    columns."""
    if varlen_attn is None:
        from torch.nn.attention.varlen import varlen_attn
    bsz, heads, q_len, head_dim = q.shape
    width = -(-head_dim // 8) * 8
    qb, kb, vb = (F.pad(t.transpose(1, 2), (0, width - head_dim)) if width != head_dim
                  else t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, T|S, H, width)
    k_unpad, v_unpad, cu_k, max_k = _unpad_keys(kb, vb, key_padding_mask)
    cu_q = torch.arange(0, (bsz + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
    out = varlen_attn(qb.reshape(-1, heads, width), k_unpad, v_unpad, cu_q, cu_k, q_len, max_k, scale=scale)
    return out.view(bsz, q_len, heads, width)[..., :head_dim].transpose(1, 2)
