"""Optimizers AST-T5 adds to fairseq's (Adam is fairseq's own) and the warmup_decay schedule."""
from . import adafactor, adamw_scale, adamw_torch, warmup_decay  # noqa: F401  (register "t5_adafactor",
# "adamw_scale", "adamw_torch" and the "warmup_decay" schedule)
