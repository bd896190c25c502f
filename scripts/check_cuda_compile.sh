#!/usr/bin/env bash
# Compile the fused_ops CUDA and C++ sources without a GPU, to catch build errors in CI.
#
#   bash scripts/check_cuda_compile.sh            # uses nvcc from PATH and python3's torch
#   PYTHON=/path/to/python bash scripts/check_cuda_compile.sh
#
# The kernel (fused_ops/csrc/cuda/*.cu) is compiled with nvcc for sm_80 and sm_90 SASS plus
# compute_90 PTX against the CUDA headers alone: it includes no torch header, because the CPU
# build of PyTorch lacks the generated c10/cuda headers (c10/cuda/impl/cuda_cmake_macros.h) and
# minimal CUDA toolkits lack curand. The torch glue (fused_ops/csrc/*.cpp) is compiled with the
# host compiler (through nvcc, which adds the CUDA include path) against torch's include dirs; it
# uses only device-generic torch headers plus ATen/cuda/CUDAGeneratorImpl.h, which the CPU build
# ships. Objects go to a temporary directory; nothing is linked or installed.
# Exit status: 0 when everything compiles (or when nvcc is absent: "skipped"), 1 on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v nvcc >/dev/null 2>&1; then
  echo "check_cuda_compile: skipped: no nvcc on PATH"
  exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
GENCODE=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
         -gencode arch=compute_90,code=compute_90)
# Same flags as setup.py's extension build.
NVCC_FLAGS=(-O3 --use_fast_math -std=c++17 -U__CUDA_NO_HALF_OPERATORS__
            -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__)
mapfile -t TORCH_INCLUDES < <("$PY" -c \
  "from torch.utils.cpp_extension import include_paths; print('\n'.join('-I' + p for p in include_paths()))")
PY_INCLUDE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")

echo "check_cuda_compile: $(nvcc --version | tail -n 2 | head -n 1)"
status=0
for src in fused_ops/csrc/cuda/*.cu; do
  obj="$TMP/$(basename "$src").o"
  if nvcc -c "$src" -o "$obj" "${NVCC_FLAGS[@]}" "${GENCODE[@]}"; then
    echo "check_cuda_compile: ok   $src (sm_80, sm_90, compute_90 PTX)"
    if command -v cuobjdump >/dev/null 2>&1; then
      cuobjdump --list-elf --list-ptx "$obj" | sed 's/^/    /'
    fi
  else
    echo "check_cuda_compile: FAIL $src"
    status=1
  fi
done
for src in fused_ops/csrc/*.cpp; do
  obj="$TMP/$(basename "$src").o"
  if nvcc -c "$src" -o "$obj" -O2 -std=c++17 -Xcompiler -fPIC -DTORCH_EXTENSION_NAME=_C \
      "${TORCH_INCLUDES[@]}" -I"$PY_INCLUDE"; then
    echo "check_cuda_compile: ok   $src (host C++ against torch $("$PY" -c 'import torch; print(torch.__version__)') headers)"
  else
    echo "check_cuda_compile: FAIL $src"
    status=1
  fi
done
exit $status
