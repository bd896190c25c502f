"""Sentinel tokens and the source/target format of span corruption (spec sections 2.2, 5.8).

Decided convention (sentinels are reserved in the tokenizer up front, DESIGN.md section 5.2):
the dictionary is ``<s>=0, <pad>=1, </s>=2, <unk>=3``, the sentencepiece pieces, then
``num_sentinels`` sentinel tokens at the END. The k-th
sentinel (k = 0 for the first span in source order) has id ``vocab_size - 1 - k`` and is named
``<extra_id_k>`` (the Hugging Face T5 convention).

Format, for content tokens ``x`` (the segment without its trailing ``</s>``):

* source = ``x`` with every masked span replaced by its sentinel, then ``</s>``;
* target = for each distinct sentinel in order: the sentinel, then the tokens of its (first)
  span; then ``</s>``. Spans that share a sentinel (obfuscated identifiers) are listed once.

Limits (spec section 15.5; fixes B-9): if the spans need more than ``num_sentinels`` sentinels
or a target longer than ``max_target_len`` (counting ``</s>``), :func:`fit_spans` keeps the
longest prefix of sentinels (in order of first appearance) that fits and unmasks the spans of the
others. This is deterministic and never truncates a span.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .spans import ranges_to_indices

EOS_ID = 2  # fairseq's </s>; the tokenizer makes fairseq ids equal sentencepiece ids (DESIGN 5.1)
NUM_SPECIAL_TOKENS = 4  # <s>, <pad>, </s>, <unk> come first in the dictionary (DESIGN 5.1)
SENTINEL_FORMAT = "<extra_id_{}>"  # Hugging Face T5 sentinel names


def sentinel_symbols(num_sentinels: int):
    """Sentinel names in dictionary order (the last dictionary entry is ``<extra_id_0>``)."""
    return [SENTINEL_FORMAT.format(k) for k in reversed(range(num_sentinels))]


@dataclass(frozen=True)
class SentinelSpec:
    """Where the sentinels live in the vocabulary.

    Attributes:
        vocab_size: dictionary size, sentinels included.
        num_sentinels: number of sentinel tokens at the end of the dictionary.
        eos: id of ``</s>``.
    """

    vocab_size: int
    num_sentinels: int
    eos: int = EOS_ID

    def __post_init__(self):
        if self.num_sentinels < 1:
            raise ValueError(f"num_sentinels={self.num_sentinels} must be >= 1")
        if self.vocab_size - self.num_sentinels < NUM_SPECIAL_TOKENS:
            raise ValueError(f"vocab_size={self.vocab_size} leaves no room for the 4 special "
                             f"tokens before {self.num_sentinels} sentinels")
        if not 0 <= self.eos < self.first_sentinel:
            raise ValueError(f"eos={self.eos} must be a non-sentinel id")

    @property
    def first_sentinel(self) -> int:
        """Smallest sentinel id; every ordinary token id is below it."""
        return self.vocab_size - self.num_sentinels

    def sentinel_id(self, k):
        """Token id of the k-th sentinel (int or int array)."""
        return self.vocab_size - 1 - k

    def check_tokens(self, tokens: np.ndarray) -> None:
        """Raise ValueError unless ``tokens`` is a 1-D integer item ending with ``</s>`` whose ids
        all lie in ``[0, first_sentinel)`` (spec section 2.2 data assertion)."""
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be a 1-D integer array, got {tokens.dtype} "
                             f"{tokens.shape}")
        if tokens.size == 0 or tokens[-1] != self.eos:
            raise ValueError(f"tokens must end with </s> (id {self.eos})")
        if tokens.min() < 0 or tokens.max() >= self.first_sentinel:
            raise ValueError(f"token ids must lie in [0, {self.first_sentinel}) (sentinels start "
                             f"there); got min {tokens.min()}, max {tokens.max()}")


def first_appearance_ranks(keys: np.ndarray) -> np.ndarray:
    """Number equal keys 0, 1, 2, ... in order of first appearance.

    Args:
        keys: (m,) int64, one per span in source order; equal keys share a sentinel.
    Returns:
        (m,) int64 sentinel numbers.
    """
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank_of_unique = np.empty(first.size, dtype=np.int64)
    rank_of_unique[np.argsort(first)] = np.arange(first.size)
    return rank_of_unique[inverse.reshape(-1)]


def first_spans(sentinel: np.ndarray) -> np.ndarray:
    """Index of the first span of each sentinel, ordered by sentinel number.

    Args:
        sentinel: (s,) int64 first-appearance ranks (see :func:`first_appearance_ranks`).
    Returns:
        (num distinct sentinels,) int64.
    """
    if sentinel.size == 0:
        return np.zeros(0, dtype=np.int64)
    seen_before = np.maximum.accumulate(sentinel)[:-1]
    return np.flatnonzero(np.concatenate(([True], sentinel[1:] > seen_before)))


def fit_spans(starts: np.ndarray, ends: np.ndarray, sentinel: np.ndarray, num_sentinels: int,
              max_target_len: Optional[int]) -> np.ndarray:
    """Which spans to keep so that sentinels and target length stay within their limits.

    Keeps the sentinels ``0 .. m-1`` for the largest ``m`` with ``m <= num_sentinels`` and
    ``1 + sum_{k<m} (1 + len(first span of k)) <= max_target_len``; spans of later sentinels are
    dropped (left unmasked).

    Args:
        starts, ends, sentinel: (s,) int64 spans in source order and their sentinel numbers.
    Returns:
        (s,) bool: the spans to keep.
    """
    if max_target_len is not None and max_target_len < 1:
        raise ValueError(f"max_target_len={max_target_len} must be >= 1")
    first = first_spans(sentinel)
    limit = min(first.size, num_sentinels)
    if max_target_len is not None and first.size:
        cost = 1 + np.cumsum(1 + ends[first] - starts[first])
        limit = min(limit, int(np.searchsorted(cost, max_target_len, side="right")))
    return sentinel < limit


def build_source_target(content: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                        sentinel: np.ndarray, spec: SentinelSpec) -> Tuple[np.ndarray, np.ndarray]:
    """Source and target of span corruption, in one vectorized pass.

    Args:
        content: (n,) int token ids (no trailing ``</s>``).
        starts, ends: (s,) int64 disjoint spans sorted by start (``ends`` exclusive; an empty span
            ``start == end`` inserts a sentinel with no content, T5's "empty" sentinel).
        sentinel: (s,) int64 sentinel numbers, 0, 1, ... in order of first appearance.
    Returns:
        ``(source, target)``, int64 arrays, both ending with ``</s>``.
    """
    n = content.size
    masked = np.zeros(n, dtype=bool)
    masked[ranges_to_indices(starts, ends)] = True
    masked_before = np.concatenate(([0], np.cumsum(masked)))  # masked tokens in [0, t)
    source = np.empty(n - int(masked_before[-1]) + starts.size + 1, dtype=np.int64)
    kept = np.flatnonzero(~masked)
    kept_pos = kept - masked_before[kept] + np.searchsorted(starts, kept, side="right")
    source[kept_pos] = content[kept]
    source[starts - masked_before[starts] + np.arange(starts.size)] = spec.sentinel_id(sentinel)
    source[-1] = spec.eos

    first = first_spans(sentinel)
    lengths = ends[first] - starts[first]
    target = np.empty(int(lengths.sum()) + first.size + 1, dtype=np.int64)
    heads = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])) if first.size else first
    is_token = np.ones(target.size - 1, dtype=bool)
    is_token[heads] = False
    target[heads] = spec.sentinel_id(sentinel[first])
    target[:-1][is_token] = content[ranges_to_indices(starts[first], ends[first])]
    target[-1] = spec.eos
    return source, target


def reconstruct(source, target, spec: SentinelSpec) -> np.ndarray:
    """Invert :func:`build_source_target`: the original item (content then ``</s>``).

    Used by tests and to fill generated spans back into a source. Raises ValueError on a
    malformed pair (missing ``</s>``, a sentinel in the source absent from the target).
    """
    source, target = np.asarray(source).tolist(), np.asarray(target).tolist()
    if not source or source[-1] != spec.eos or not target or target[-1] != spec.eos:
        raise ValueError("source and target must both end with </s>")
    fills, current = {}, None
    for tok in target[:-1]:
        if tok >= spec.first_sentinel:
            current = fills.setdefault(tok, [])
        elif current is None:
            raise ValueError("target must start with a sentinel")
        else:
            current.append(tok)
    out = []
    for tok in source[:-1]:
        if tok >= spec.first_sentinel:
            if tok not in fills:
                raise ValueError(f"sentinel {tok} of the source is missing from the target")
            out.extend(fills[tok])
        else:
            out.append(tok)
    out.append(spec.eos)
    return np.asarray(out, dtype=np.int64)
