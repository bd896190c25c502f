"""Multi-head attention for the AST-T5 / T5 encoder-decoder, with fairseq incremental decoding.

Self-attention projects queries, keys and values with one matmul (``qkv_proj``: q rows, then k,
then v); cross-attention projects queries from the decoder (``q_proj``) and keys and values from
the encoder output with one matmul (``kv_proj``). Additive biases (relative positions) are passed
in by the caller; the attention core is `attention_backends.attention`.

Incremental decoding (fairseq's convention, used by SequenceGenerator): self-attention appends the
new step's keys/values to a per-module cache; cross-attention projects the encoder output once and
keeps it. `reorder_incremental_state` reorders both for beam search.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from .attention_backends import ATTENTION_BACKENDS, attention
from .projections import linear

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
_CACHE_KEY = "attn_state"


@with_incremental_state
class T5MultiheadAttention(nn.Module):
    """Attention with separate head_dim (T5 v1.1 small has 6 heads x 64 = 384 != d_model 512).

    Args:
        embed_dim: model width (input and output features).
        num_heads, head_dim: heads and per-head width; inner width = num_heads * head_dim.
        dropout: dropout on attention probabilities (training only).
        bias: projection biases (paper: yes; T5: no).
        scale: multiplier of q k^T (T5: 1.0, folded into the initialization; paper: head_dim^-0.5).
        self_attention: True for self-attention, False for encoder-decoder attention.
        backend: one of ATTENTION_BACKENDS.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, dropout: float, bias: bool,
                 scale: float, self_attention: bool, backend: str = "auto"):
        super().__init__()
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.inner_dim = num_heads * head_dim
        self.dropout = dropout
        self.scale = scale
        self.self_attention = self_attention
        self.backend = backend
        if self_attention:
            self.qkv_proj = linear(embed_dim, 3 * self.inner_dim, bias)
        else:
            self.q_proj = linear(embed_dim, self.inner_dim, bias)
            self.kv_proj = linear(embed_dim, 2 * self.inner_dim, bias)
        self.out_proj = linear(self.inner_dim, embed_dim, bias)

    def forward(self, x: Tensor, *, encoder_out: Optional[Tensor] = None,
                bias: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False,
                incremental_state: Optional[IncrementalState] = None) -> Tensor:
        """Attend from ``x`` to itself (self-attention) or to ``encoder_out`` (cross-attention).

        Args:
            x: (B, T, C) queries' input.
            encoder_out: (B, S, C) encoder states (cross-attention only; may be None once the
                incremental cache holds its keys/values).
            bias: optional additive bias: a (1 or B, H, T, S) tensor, a `RelativeBias` or the
                `FoldedBias` of `attention_backends.fold_masks` (which carries the masks);
                key_padding_mask: (B, S) bool, True at padding; causal: forbid future keys
                (full-sequence self-attention only).
            incremental_state: fairseq's decoding cache; with it, x holds only the new step(s).
        Returns:
            (B, T, C) tensor.
        """
        bsz, q_len, _ = x.shape
        packed_qkv = packed_kv = None  # the projection q, k, v (k, v) are views of, for the backend's backward
        if self.self_attention:
            qkv = self.qkv_proj(x).view(bsz, q_len, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
            if incremental_state is not None:
                k, v = self._append_to_cache(incremental_state, k, v)
            else:
                packed_qkv = qkv
        else:
            q = self.q_proj(x).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
            if incremental_state is None:
                packed_kv = self._packed_kv(encoder_out)
                k, v = packed_kv.permute(2, 0, 3, 1, 4).unbind(0)
            else:
                k, v = self._cross_keys_values(encoder_out, incremental_state)
        out = attention(q, k, v, bias=bias, key_padding_mask=key_padding_mask, causal=causal,
                        dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
                        backend=self.backend, packed_qkv=packed_qkv, packed_kv=packed_kv)  # (B, H, T, D)
        return self.out_proj(out.transpose(1, 2).reshape(bsz, q_len, self.inner_dim))

    def _packed_kv(self, states: Tensor) -> Tensor:
        bsz, src_len, _ = states.shape
        return self.kv_proj(states).view(bsz, src_len, 2, self.num_heads, self.head_dim)

    def _project_kv(self, states: Tensor) -> Tuple[Tensor, Tensor]:
        k, v = self._packed_kv(states).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, S, D)
        return k, v

    def _cross_keys_values(self, encoder_out: Optional[Tensor],
                           incremental_state: Optional[IncrementalState]) -> Tuple[Tensor, Tensor]:
        if incremental_state is None:
            return self._project_kv(encoder_out)
        cached = self.get_incremental_state(incremental_state, _CACHE_KEY)
        if cached is not None:
            return cached["key"], cached["value"]
        k, v = self._project_kv(encoder_out)
        self.set_incremental_state(incremental_state, _CACHE_KEY, {"key": k, "value": v})
        return k, v

    def _append_to_cache(self, incremental_state: IncrementalState, k: Tensor,
                         v: Tensor) -> Tuple[Tensor, Tensor]:
        cached = self.get_incremental_state(incremental_state, _CACHE_KEY)
        if cached is not None:
            k = torch.cat([cached["key"], k], dim=2)
            v = torch.cat([cached["value"], v], dim=2)
        self.set_incremental_state(incremental_state, _CACHE_KEY, {"key": k, "value": v})
        return k, v

    def reorder_incremental_state(self, incremental_state: IncrementalState,
                                  new_order: Tensor) -> IncrementalState:
        """Select cached keys/values of the beams in ``new_order`` (called by beam search)."""
        cached = self.get_incremental_state(incremental_state, _CACHE_KEY)
        if cached is not None:
            reordered = {name: t.index_select(0, new_order) for name, t in cached.items()}
            self.set_incremental_state(incremental_state, _CACHE_KEY, reordered)
        return incremental_state

    def cached_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of steps already in the self-attention cache (0 without a cache)."""
        cached = self.get_incremental_state(incremental_state, _CACHE_KEY)
        return 0 if cached is None else cached["key"].size(2)
