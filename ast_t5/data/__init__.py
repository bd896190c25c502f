"""AST-T5 data."""
