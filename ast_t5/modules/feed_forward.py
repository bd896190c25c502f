"""Position-wise feed-forward blocks: ReLU (AST-T5 paper, T5 v1.0) and gated GELU (T5 v1.1).

Gated GELU (Shazeer, 2020, "GLU Variants Improve Transformer"): wo(gelu(wi_0 x) * wi_1 x), with
the tanh approximation of GELU that T5 v1.1 was trained with. The two input projections are one
matmul (``wi``, 2 * ffn_dim outputs: gate rows first, then linear rows). With ``impl = "liger"``
(set by the model from ``model.fused_norm_ffn``) the gate and linear halves of ``wi`` are two
matmuls and liger-kernel's fused gelu-times-linear kernel joins them (see liger_norm_ffn.py); the
parameters are the same.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .liger_norm_ffn import liger_gelu_mul
from .projections import linear

ACTIVATIONS = ("relu", "gated-gelu")


class FeedForward(nn.Module):
    """x (..., embed_dim) -> (..., embed_dim).

    Args:
        embed_dim: model width; ffn_dim: hidden width.
        activation: "relu" or "gated-gelu".
        activation_dropout: dropout on the hidden activations.
        bias: whether the projections have biases (paper: yes; T5: no).
    """

    impl: str = "eager"  # "liger": liger-kernel's gated GELU (gated blocks only)

    def __init__(self, embed_dim: int, ffn_dim: int, activation: str, activation_dropout: float,
                 bias: bool):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.gated = activation == "gated-gelu"
        self.ffn_dim = ffn_dim
        self.wi = linear(embed_dim, ffn_dim * (2 if self.gated else 1), bias)
        self.wo = linear(ffn_dim, embed_dim, bias)
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated and self.impl == "liger":
            return self.wo(self.dropout(self._liger_gated(x)))
        h = self.wi(x)
        if self.gated:
            gate, value = h.split(self.ffn_dim, dim=-1)
            h = F.gelu(gate, approximate="tanh") * value
        else:
            h = F.relu(h)
        return self.wo(self.dropout(h))

    def _liger_gated(self, x: torch.Tensor) -> torch.Tensor:
        """gelu_tanh(x wi_gate^T) * (x wi_linear^T): the row halves of ``wi`` are contiguous views,
        so both products come out contiguous, as the fused kernel needs them."""
        w, b, n = self.wi.weight, self.wi.bias, self.ffn_dim
        gate = F.linear(x, w[:n], None if b is None else b[:n])
        value = F.linear(x, w[n:], None if b is None else b[n:])
        return liger_gelu_mul(gate, value)
