"""Corpus pipeline: code files -> tree-sitter ASTs -> AST-aware segments -> binarized data."""
