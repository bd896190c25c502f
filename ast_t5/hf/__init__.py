"""Hugging Face export and import of T5 v1.1-family AST-T5 models (``ast-t5-export-hf``,
``ast-t5-import-hf``); ``transformers`` is imported only when they run."""
