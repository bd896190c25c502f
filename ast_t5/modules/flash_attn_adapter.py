"""The optional flash-attn package (Dao et al.) behind `attention_backends` (imported only when used).

flash-attn takes (B, T, H, D) half-precision CUDA tensors. Without padded keys it runs
``flash_attn_func`` on the padded batch; with padded keys (cross-attention over a padded source)
it drops the padded keys and runs ``flash_attn_varlen_func`` with per-sequence key lengths, all
queries kept.
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
    keep = ~key_padding_mask
    k_lengths = keep.sum(dim=1, dtype=torch.int32)
    cu_k = F.pad(k_lengths.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = torch.arange(0, (bsz + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
    index = keep.flatten().nonzero().squeeze(1)
    k_unpad = kb.reshape(-1, heads, head_dim).index_select(0, index)
    v_unpad = vb.reshape(-1, heads, head_dim).index_select(0, index)
    out = flash_attn_varlen_func(qb.reshape(-1, heads, head_dim), k_unpad, v_unpad, cu_q, cu_k,
                                 q_len, int(k_lengths.max()), dropout_p=dropout_p, softmax_scale=scale,
                                 causal=causal)
    return out.view(bsz, q_len, heads, head_dim).transpose(1, 2)
