#!/usr/bin/env bash
# Build the fused softmax-dropout CUDA extension (fused_ops._C) into this checkout, in place.
#
#   bash scripts/build_fused_ops.sh                        # sm_80 + sm_90 + PTX (A100, H100/H200, newer)
#   TORCH_CUDA_ARCH_LIST="8.6" bash scripts/build_fused_ops.sh   # a single architecture
#
# Needs nvcc and a CUDA build of torch. Equivalent to the README's
#   AST_T5_BUILD_CUDA_EXT=1 pip install --no-build-isolation -e .
# Without a prebuilt extension, fused_ops compiles the same sources on first use instead
# (torch.utils.cpp_extension.load; set AST_T5_FUSED_OPS_JIT=0 to forbid that).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export AST_T5_BUILD_CUDA_EXT=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-"8.0;9.0+PTX"}
"$PY" setup.py build_ext --inplace
"$PY" -c "import fused_ops; ok, why = fused_ops.fused_backend_status(); print('fused_ops:', why); raise SystemExit(0 if ok else 1)"
