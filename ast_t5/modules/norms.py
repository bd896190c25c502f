"""Normalization layers of the two model families.

The AST-T5 paper's model uses LayerNorm (with bias, eps 1e-5, fairseq's default); T5 v1.1 uses
RMSNorm without bias or mean subtraction (Zhang & Sennrich, 2019), eps 1e-6 as in T5.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .liger_norm_ffn import liger_rms_norm

LAYER_NORM_EPS = 1e-5  # fairseq / the original AST-T5 (spec section 10.1: layer_norm_epsilon 1e-5)
RMS_NORM_EPS = 1e-6  # T5 / T5 v1.1 (Hugging Face T5Config.layer_norm_epsilon default)


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dimension (T5's "layer norm").

    Args:
        dim: size of the last dimension; eps: added to the mean square.
    Input (..., dim) float tensor; output the same shape and dtype (the weight is cast to the
    input's dtype, so mixed-precision inputs keep the fused kernel).
    ``impl`` ("eager" | "liger") is set by the model from ``model.fused_norm_ffn``; both paths
    compute the same function of the same ``weight`` (see liger_norm_ffn.py).
    """

    impl: str = "eager"

    def __init__(self, dim: int, eps: float = RMS_NORM_EPS):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "liger":
            return liger_rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (self.dim,), self.weight.to(x.dtype), self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def build_norm(kind: str, dim: int) -> nn.Module:
    """``"layernorm"`` (paper family) or ``"rmsnorm"`` (T5 v1.1) over ``dim`` features."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=RMS_NORM_EPS)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
