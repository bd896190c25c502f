"""AST-T5 on fairseq: structure-aware T5 pre-training for code (Gong et al., ICML 2024).

Importing this package registers its tasks, models, criterions and optimizers with fairseq.
"""
import re as _re

import torch as _torch

from .version import __version__  # noqa: F401

MIN_TORCH = (2, 11)  # pyproject.toml's bound: older releases fail in torch.compile (compiled optimizer, flex, graphs)
_found = _re.match(r"(\d+)\.(\d+)", _torch.__version__)
if _found is not None and tuple(map(int, _found.groups())) < MIN_TORCH:
    raise ImportError(f"AST-T5 needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found {_torch.__version__}: upgrade it "
                      f"(CPU: pip install torch==2.13.0; GPU: the CUDA build for your driver), then rerun "
                      f"scripts/install.sh")
from . import criterions, models, optim, tasks  # noqa: E402,F401  (registers components with fairseq)
