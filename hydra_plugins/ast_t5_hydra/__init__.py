"""Hydra plugin hook for AST-T5 (see issue: pre-training configs)."""
