"""AST-T5 tasks."""
