"""AST-T5 models: importing this package registers the ``ast_t5`` model and its architectures."""
from . import ast_t5_model  # noqa: F401  (registers model "ast_t5")
from . import architectures  # noqa: F401  (registers the named size presets)
from .ast_t5_model import AstT5Model  # noqa: F401
from .config import AstT5Config  # noqa: F401
