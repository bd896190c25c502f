"""AST-T5 criterions."""
