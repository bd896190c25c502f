"""Optimizers AST-T5 adds to fairseq's (Adam and the schedules are fairseq's own)."""
from . import adafactor, adamw_scale, adamw_torch  # noqa: F401  (register t5_adafactor, adamw_scale, adamw_torch)
