"""AST-T5 fairseq tasks."""
from . import ast_t5_pretraining  # noqa: F401  (registers "ast_t5_pretraining")
