"""AST-T5 modules."""
