"""Position-wise feed-forward blocks: ReLU (AST-T5 paper, T5 v1.0) and gated GELU (T5 v1.1).

Gated GELU (Shazeer, 2020, "GLU Variants Improve Transformer"): wo(gelu(wi_0 x) * wi_1 x), with
the tanh approximation of GELU that T5 v1.1 was trained with. The two input projections are one
matmul (``wi``, 2 * ffn_dim outputs: gate rows first, then linear rows).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

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
        h = self.wi(x)
        if self.gated:
            gate, value = h.split(self.ffn_dim, dim=-1)
            h = F.gelu(gate, approximate="tanh") * value
        else:
            h = F.relu(h)
        return self.wo(self.dropout(h))
