"""Options of AST-aware span corruption (spec sections 5.4-5.8 and 6).

Every magic number of the original objective is a named, documented field here (fixes B-4,
B-5). The fairseq task mirrors these fields in its config and calls :meth:`validate` before
training starts. Defaults are the released AST-T5 configuration
(``base1m_rpe_mask25_ast10_lb5_ub100_op50_or50``, spec section 6) unless noted.
"""
from dataclasses import dataclass, field, fields

# Longest target the paper's decoder accepts: tokens_per_sample = 1024 positions (spec section 6).
DEFAULT_MAX_TARGET_LEN = 1024


def _opt(default, text: str):
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class AstMaskingOptions:
    """How one code segment is corrupted. See :func:`ast_t5.data.subtree_masking.select_mask`."""

    mask_prob: float = _opt(
        0.25, "fraction of content tokens masked; the budget is exactly round(N * mask_prob) "
              "(released AST config 0.25, spec section 6)")
    threshold_lb: int = _opt(
        5, "smallest per-node threshold: a child whose share of the budget exceeds the node's "
           "threshold is masked recursively, smaller shares become whole subtrees (spec 5.5)")
    threshold_ub: int = _opt(
        100, "largest per-node threshold; each visited node draws one uniformly from "
             "[threshold_lb, threshold_ub] (released config 100; original default 50)")
    mask_multiple_length: int = _opt(
        10, "inside leaf-only nodes, spans of length U{1..mask_multiple_length-1} are masked "
            "(T5-style locality spans, spec 5.5; released config 10; must be >= 2, B-4)")
    obfuscation_prob: float = _opt(
        0.5, "probability that a sample spends part of its budget on identifier obfuscation "
             "(released obf_prob 0.5, spec 5.6)")
    obfuscation_ratio: float = _opt(
        0.5, "at most this share of the budget goes to obfuscated identifiers; all occurrences "
             "of a chosen identifier share one sentinel (released obf_ratio 0.5)")
    t2c_prob: float = _opt(
        0.0, "probability of the text-to-code mode: mask Python function bodies that follow a "
             "docstring (spec 5.7; off in the released config)")
    t2c_ratio: float = _opt(
        0.0, "at most this share of the budget goes to function bodies in text-to-code samples "
             "(released config 0.0; must be > 0 when t2c_prob > 0)")
    dedup_spans: bool = _opt(
        False, "give masked spans with identical content one shared sentinel, listed once in the "
               "target (the original always did, spec 5.8 and B-10); obfuscated identifiers "
               "share their sentinel either way")
    max_target_len: int = _opt(
        DEFAULT_MAX_TARGET_LEN, "longest target including </s> (the decoder's positions); "
        "masking is reduced deterministically to fit, see ast_t5.data.sentinels.fit_spans")

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the first invalid field."""
        for name in ("mask_prob", "obfuscation_prob", "obfuscation_ratio", "t2c_prob", "t2c_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} must be in [0, 1]")
        for name in ("threshold_lb", "threshold_ub", "mask_multiple_length", "max_target_len"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be an integer")
        if self.threshold_lb < 1:
            raise ValueError(f"threshold_lb={self.threshold_lb} must be >= 1")
        if self.threshold_ub < self.threshold_lb:
            raise ValueError(f"threshold_ub={self.threshold_ub} must be >= "
                             f"threshold_lb={self.threshold_lb}")
        if self.mask_multiple_length < 2:
            raise ValueError(f"mask_multiple_length={self.mask_multiple_length} must be >= 2 "
                             "(flat spans have lengths 1..mask_multiple_length-1)")
        if self.obfuscation_prob + self.t2c_prob > 1.0:
            total = self.obfuscation_prob + self.t2c_prob
            raise ValueError(f"obfuscation_prob + t2c_prob = {total} must be <= 1")
        if self.t2c_prob > 0 and self.t2c_ratio == 0:
            raise ValueError("t2c_ratio must be > 0 when t2c_prob > 0")
        if self.max_target_len < 2:
            raise ValueError(f"max_target_len={self.max_target_len} must be >= 2 "
                             "(one sentinel and </s>)")

    @classmethod
    def field_names(cls):
        """Names of all option fields, for configs that mirror them."""
        return [f.name for f in fields(cls)]
