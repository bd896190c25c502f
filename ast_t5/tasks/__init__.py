"""AST-T5 fairseq tasks."""
from . import ast_t5_pretraining  # noqa: F401  (registers "ast_t5_pretraining")
from . import seq2seq_finetuning  # noqa: F401  (registers "ast_t5_seq2seq")
