"""Finding the compiled softmax-dropout extension: installed build first, then a first-use JIT build.

Nothing here runs at import. `load()` is called only when a CUDA tensor asks for the fused path:

1. ``fused_ops._C``: built by ``AST_T5_BUILD_CUDA_EXT=1 pip install --no-build-isolation -e .``;
2. otherwise, when a GPU and nvcc are present and ``AST_T5_FUSED_OPS_JIT`` is not ``0``, the same
   sources are compiled once with ``torch.utils.cpp_extension.load`` (cached under
   ``TORCH_EXTENSIONS_DIR``; the first call takes a few minutes and says so in the log).

Either way the extension registers ``torch.ops.fused_ops.softmax_dropout_forward`` and
``torch.ops.fused_ops.softmax_dropout_backward``. The outcome (and the reason for a failure) is
remembered, so the search runs once per process.
"""
import glob
import logging
import os
import shutil
from typing import Optional

import torch

logger = logging.getLogger(__name__)

JIT_ENV_VAR = "AST_T5_FUSED_OPS_JIT"  # "0" disables the first-use compilation
JIT_MODULE_NAME = "fused_ops_C"
CSRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
NVCC_FLAGS = ["-O3", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__",
              "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]


class _LoadState:
    """Outcome of the one search per process: the ops namespace or why there is none."""

    def __init__(self):
        self.searched = False
        self.ops = None
        self.error: Optional[str] = None


_STATE = _LoadState()


def source_files():
    """The C++ and CUDA sources of the extension, in a stable order."""
    return sorted(glob.glob(os.path.join(CSRC_DIR, "*.cpp"))
                  + glob.glob(os.path.join(CSRC_DIR, "cuda", "*.cu")))


def _import_installed() -> Optional[str]:
    """Import ``fused_ops._C``; return None on success, else why it failed."""
    try:
        from . import _C  # noqa: F401  (registers torch.ops.fused_ops.*)
    except ImportError as e:
        return f"fused_ops._C is not built ({e})"
    return None


def _jit_build() -> Optional[str]:
    """Compile the sources with torch.utils.cpp_extension.load; None on success, else why not."""
    if os.environ.get(JIT_ENV_VAR, "1") == "0":
        return f"{JIT_ENV_VAR}=0 disables the first-use build"
    if shutil.which("nvcc") is None:
        return "nvcc is not on PATH, so the extension cannot be compiled on first use"
    from torch.utils.cpp_extension import load

    logger.info("fused_ops: compiling the softmax-dropout extension on first use (minutes, once)")
    try:
        load(name=JIT_MODULE_NAME, sources=source_files(), extra_cuda_cflags=NVCC_FLAGS,
             is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        return f"first-use compilation failed: {e}"
    return None


def load():
    """Return ``torch.ops.fused_ops`` when the extension can be loaded, else None (see `error`)."""
    if not _STATE.searched:
        _STATE.searched = True
        error = _import_installed()
        if error is not None:
            jit_error = _jit_build()
            error = None if jit_error is None else f"{error}; {jit_error}"
        if error is None:
            _STATE.ops = torch.ops.fused_ops
        _STATE.error = error
    return _STATE.ops


def error() -> Optional[str]:
    """Why `load()` found no extension (None before the search or after a success)."""
    return _STATE.error
