"""Fused CUDA ops with PyTorch reference fallbacks (see softmax_dropout.py).

Importing this package is cheap: it neither initializes CUDA nor compiles anything. The compiled
extension (``fused_ops._C``, built with ``AST_T5_BUILD_CUDA_EXT=1``, or compiled on first use) is
only looked for when a CUDA tensor asks for the fused path.
"""
from .softmax_dropout import (  # noqa: F401
    BACKENDS,
    MAX_FUSED_COLS,
    SUPPORTED_DTYPES,
    fused_backend_available,
    fused_backend_status,
    softmax_dropout,
    softmax_dropout_reference,
    softmax_dropout_with_mask,
)

__all__ = [
    "BACKENDS",
    "MAX_FUSED_COLS",
    "SUPPORTED_DTYPES",
    "fused_backend_available",
    "fused_backend_status",
    "softmax_dropout",
    "softmax_dropout_reference",
    "softmax_dropout_with_mask",
]
