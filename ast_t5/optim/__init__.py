"""Optimizers AST-T5 adds to fairseq's (Adafactor, Adam and the schedules are fairseq's own)."""
from . import adamw_scale  # noqa: F401  (registers "adamw_scale")
