"""AST-T5 models."""
