"""AST-T5 on fairseq: structure-aware T5 pre-training for code (Gong et al., ICML 2024).

Importing this package registers its tasks, models, criterions and optimizers with fairseq.
"""
from .version import __version__  # noqa: F401
from . import criterions, models, optim, tasks  # noqa: F401  (registers components with fairseq)
