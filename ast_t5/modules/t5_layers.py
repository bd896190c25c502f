"""Encoder and decoder layers for both model families (AST-T5 spec section 7.2; T5 v1.1).

Each sub-layer (self-attention, cross-attention, feed-forward) is wrapped as
- pre-norm (T5 v1.1): x + dropout(f(norm(x)));
- post-norm (the AST-T5 paper's fairseq model): norm(x + dropout(f(x))).

The layers own their forward and take relative-position biases as explicit arguments: fairseq's
stock TransformerEncoderLayer rewrites a float ``attn_mask``, which would corrupt a bias.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch.nn as nn
from torch import Tensor

from .attention_backends import compute_dtype, fold_masks
from .feed_forward import FeedForward
from .norms import build_norm
from .relative_position_bias import RelativePositionBias
from .t5_attention import IncrementalState, T5MultiheadAttention


@dataclass(frozen=True)
class LayerSpec:
    """Sizes and switches shared by every layer of a stack (built from AstT5Config)."""

    embed_dim: int
    ffn_dim: int
    num_heads: int
    head_dim: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    activation: str  # "relu" | "gated-gelu"
    norm: str  # "layernorm" | "rmsnorm"
    normalize_before: bool
    bias: bool  # biases in every projection
    attention_scale: float  # multiplier of q k^T
    backend: str


def _attention(spec: LayerSpec, self_attention: bool) -> T5MultiheadAttention:
    return T5MultiheadAttention(spec.embed_dim, spec.num_heads, spec.head_dim, spec.attention_dropout,
                                spec.bias, spec.attention_scale, self_attention, spec.backend)


def _feed_forward(spec: LayerSpec) -> FeedForward:
    return FeedForward(spec.embed_dim, spec.ffn_dim, spec.activation, spec.activation_dropout, spec.bias)


class _SublayerMixin(nn.Module):
    """Residual wrapping of a sub-layer, pre- or post-norm."""

    normalize_before: bool
    dropout: nn.Dropout

    def _sublayer(self, x: Tensor, norm: nn.Module, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.normalize_before:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))


class T5EncoderLayer(_SublayerMixin):
    """Self-attention + feed-forward.

    Args:
        spec: layer sizes and switches.
        own_bias: a relative-position table owned by this layer (the paper's per-layer bias), or
            None when the stack passes a shared bias (T5 v1.1) or there is none.
    """

    def __init__(self, spec: LayerSpec, own_bias: Optional[RelativePositionBias] = None):
        super().__init__()
        self.normalize_before = spec.normalize_before
        self.self_attn = _attention(spec, self_attention=True)
        self.self_attn_norm = build_norm(spec.norm, spec.embed_dim)
        self.ffn = _feed_forward(spec)
        self.ffn_norm = build_norm(spec.norm, spec.embed_dim)
        self.dropout = nn.Dropout(spec.dropout)
        self.rel_pos_bias = own_bias
        self.backend = spec.backend

    def forward(self, x: Tensor, padding_mask: Optional[Tensor],
                shared_bias: Optional[Tensor] = None, block_mask=None) -> Tensor:
        """x: (B, S, C); padding_mask: (B, S) bool or None; shared_bias: (1 or B, H, S, S) or None
        (a shared bias comes with the padding already folded in, see attention_backends.fold_masks);
        block_mask: the stack's flex BlockMask for this layer's own bias (`stack_block_mask`) or None."""
        bias = shared_bias
        if self.rel_pos_bias is not None:
            bias, padding_mask, _ = fold_masks(self.backend, self.rel_pos_bias(x.size(1), x.size(1)),
                                               padding_mask, causal=False, dtype=compute_dtype(x),
                                               dropout_p=self.self_attn.dropout if self.training else 0.0,
                                               block_mask=block_mask)
        x = self._sublayer(x, self.self_attn_norm,
                           lambda h: self.self_attn(h, bias=bias, key_padding_mask=padding_mask))
        return self._sublayer(x, self.ffn_norm, self.ffn)


class T5DecoderLayer(_SublayerMixin):
    """Causal self-attention + encoder-decoder attention + feed-forward."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.normalize_before = spec.normalize_before
        self.self_attn = _attention(spec, self_attention=True)
        self.self_attn_norm = build_norm(spec.norm, spec.embed_dim)
        self.encoder_attn = _attention(spec, self_attention=False)
        self.encoder_attn_norm = build_norm(spec.norm, spec.embed_dim)
        self.ffn = _feed_forward(spec)
        self.ffn_norm = build_norm(spec.norm, spec.embed_dim)
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x: Tensor, encoder_out: Optional[Tensor], encoder_padding_mask: Optional[Tensor],
                self_bias: Optional[Tensor] = None, causal: bool = True,
                incremental_state: Optional[IncrementalState] = None) -> Tensor:
        """x: (B, T, C) decoder states (only the new steps when decoding incrementally);
        encoder_out: (B, S, C); encoder_padding_mask: (B, S) bool; self_bias: (1, H, T, T_total);
        causal: mask future keys in self-attention (False when the mask is folded into self_bias,
        or for a cached step, which sees every cached key)."""
        x = self._sublayer(x, self.self_attn_norm,
                           lambda h: self.self_attn(h, bias=self_bias, causal=causal,
                                                    incremental_state=incremental_state))
        x = self._sublayer(x, self.encoder_attn_norm,
                           lambda h: self.encoder_attn(h, encoder_out=encoder_out,
                                                       key_padding_mask=encoder_padding_mask,
                                                       incremental_state=incremental_state))
        return self._sublayer(x, self.ffn_norm, self.ffn)
