#!/usr/bin/env bash
# Install AST-T5 on fairseq and everything it needs into the current Python environment.
#
#   bash scripts/install.sh            # editable install with the test extras (re-run after adding files)
#   PYTHON=/path/to/python bash scripts/install.sh
#   AST_T5_BUILD_CUDA_EXT=1 bash scripts/install.sh   # also build the fused CUDA op (needs nvcc + CUDA torch)
#
# Order matters: torch first and pinned (an unpinned torch requirement with no torch installed
# resolves to a multi-GB CUDA build), then fairseq-fixed without its declared dependencies (its
# torchaudio requirement pulls a CUDA build that cannot load on CPU torch and breaks transformers),
# then its real dependencies, then this package. Idempotent: finished steps are skipped.
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
pipi() { "$PY" -m pip install --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  pipi torch==2.13.0
fi
# An older torch already there would be replaced by the registry's newest CUDA build while pip resolves
# this package's torch>=2.11 (pyproject.toml), under a fairseq built against the old one: stop instead.
if ! "$PY" -c "import re, sys, torch; v = re.match(r'(\d+)\.(\d+)', torch.__version__); sys.exit(v is not None and tuple(map(int, v.groups())) < (2, 11))"; then
  echo "install.sh: AST-T5 needs torch >= 2.11, found $("$PY" -c 'import torch; print(torch.__version__)'): upgrade it (CPU: pip install torch==2.13.0; GPU: the CUDA build for your driver), then rerun" >&2
  exit 1
fi
# fairseq-fixed's real run-time dependencies (setup.py lists them; torchaudio is left out on purpose)
# and what its Cython build needs, since it is built without isolation against the torch above.
pipi "setuptools>=64" wheel cython "numpy>=1.24,<2.6" cffi regex "sacrebleu>=2.0" tqdm bitarray \
     scikit-learn packaging hydra-core==1.3.2 omegaconf==2.3.0
if ! "$PY" -c "import fairseq" 2>/dev/null; then
  pipi --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
fi
# A torchaudio that does not match torch breaks `import transformers`; we never need it.
if "$PY" -m pip show torchaudio >/dev/null 2>&1 && ! "$PY" -c "import torchaudio" 2>/dev/null; then
  "$PY" -m pip uninstall -y torchaudio
fi
# Strict editable mode: a tree of links under build/ instead of an import hook, so the
# `hydra_plugins` namespace package is a real folder that Hydra's plugin scan can list (the hook of
# the default mode hides it). Re-run this script after adding a new module.
# The `interpreter` extra (triton, for the CPU tests of the triton kernels) only where no triton is
# importable: a CUDA torch already brings the triton it pins, which must stay.
extras=test
if ! "$PY" -c "import triton" 2>/dev/null; then
  extras=test,interpreter
fi
pipi --no-build-isolation --config-settings editable_mode=strict -e ".[$extras]"
# cudnn-frontend's Python package, for the `cudnn` attention backend's CPU tests: it describes and validates
# cuDNN graphs without a GPU. Without its dependencies (NVIDIA's CuTe DSL, ~100 MB, which only its own
# Python kernels need on a GPU); a GPU machine installs it in full with the `gpu` extra.
if ! "$PY" -c "import cudnn; cudnn.pygraph" 2>/dev/null; then
  pipi --no-deps nvidia-cudnn-frontend==1.32.0 || \
    echo "install.sh: nvidia-cudnn-frontend has no wheel here: the cudnn backend's graph-description tests will skip" >&2
fi
"$PY" -c "import fairseq, ast_t5, ast_t5_preprocess, fused_ops; print('ast-t5 install OK: fairseq', fairseq.__version__)"
