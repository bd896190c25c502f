"""AST-T5 criterions."""
from . import span_cross_entropy  # noqa: F401  (registers "ast_t5_span_cross_entropy")
