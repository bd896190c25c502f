"""Byte-to-token alignment and AST-aware segmentation (AST-T5 paper section 3.1; spec 4.3).

A file of ``n`` tokens is cut into segments of at most ``max_len`` tokens. A cut between tokens
``k-1`` and ``k`` *breaks* every AST node that spans it (``start < k < end``). Cut points are
chosen by dynamic programming to minimise the number of broken nodes, then the number of
segments, then (ties) to make earlier segments as long as possible::

    dp[0] = 0
    dp[i] = w[i] + min(dp[j] for j in [i - max_len, i))     i = 1..n
    w[i]  = broken(i) * (n + 1) + 1   for 0 < i < n,   w[n] = 0

Blocks of ``max_len`` positions are solved with NumPy (see :func:`ast_aware_cuts`), so the
programme is O(n) array work with O(n / max_len) Python steps. Files of at most ``max_len``
tokens stay whole.
"""
from typing import List, Tuple

import numpy as np

from .formats import AST_DTYPE

_INF = np.int64(1) << 62  # larger than any reachable cost


def align_boundaries(byte_offsets: np.ndarray, token_ends: np.ndarray) -> np.ndarray:
    """Map byte boundaries to token boundaries: the one tested alignment function.

    A boundary at byte ``b`` maps to the number of tokens that end at or before ``b``. A
    boundary inside a token therefore moves to that token's start, so a token that straddles
    an AST boundary belongs to the later node. The map is monotone, so nested byte spans stay
    nested and disjoint spans stay disjoint (some may become empty).

    Args:
        byte_offsets: (m,) int byte positions.
        token_ends: (n,) int64 nondecreasing end byte of each token (exclusive).
    Returns:
        (m,) int64 token positions in [0, n].
    """
    return np.searchsorted(token_ends, byte_offsets, side="right").astype(np.int64)


def align_nodes(starts: np.ndarray, ends: np.ndarray, token_ends: np.ndarray):
    """Token spans of byte-span nodes; nodes that become empty are dropped.

    Returns:
        (tok_starts, tok_ends, keep) with ``keep`` the boolean mask of surviving nodes.
    """
    ts = align_boundaries(starts, token_ends)
    te = align_boundaries(ends, token_ends)
    keep = te > ts
    return ts[keep], te[keep], keep


def cut_costs(tok_starts: np.ndarray, tok_ends: np.ndarray, n: int) -> np.ndarray:
    """``cost[k]`` = number of nodes broken by a cut before token ``k``, for k in [0, n]."""
    inner = tok_ends - tok_starts >= 2  # a node of one token can never be broken
    diff = np.bincount(tok_starts[inner] + 1, minlength=n + 2)[: n + 2].astype(np.int64)
    diff -= np.bincount(tok_ends[inner], minlength=n + 2)[: n + 2]
    return np.cumsum(diff)[: n + 1]


def ast_aware_cuts(cost: np.ndarray, max_len: int) -> List[int]:
    """Optimal cut positions (sorted, excluding 0 and n) for segments of <= max_len tokens.

    The programme is solved block by block (blocks of ``max_len`` positions) with NumPy: inside
    a block, the window minimum is the minimum of a suffix of the previous block (known) and of a
    prefix of the current block, found by relaxation until nothing changes (the number of rounds
    is the longest chain of cuts inside one block, one or two in practice). Backtracking takes,
    among equal minima, the latest position, so earlier segments are as long as possible.
    """
    n = len(cost) - 1
    if n <= max_len:
        return []
    if max_len < 1:
        raise ValueError("max_len must be positive")
    weight = cost.astype(np.int64) * (n + 1) + 1
    weight[n] = 0
    dp = np.zeros(n + 1, dtype=np.int64)
    for start in range(1, n + 1, max_len):
        dp[start:start + max_len] = _solve_block(dp, weight, start, min(start + max_len, n + 1), max_len)
    cuts, i = [], n
    while i > 0:
        lo = max(0, i - max_len)
        window = dp[lo:i]
        i = lo + len(window) - 1 - int(np.argmin(window[::-1]))  # the latest minimum
        if i > 0:
            cuts.append(i)
    return cuts[::-1]


def _solve_block(dp: np.ndarray, weight: np.ndarray, start: int, end: int, max_len: int) -> np.ndarray:
    """dp[start:end] given dp[:start]; every window of the block reaches back before ``start``."""
    prev_lo = max(0, start - max_len)
    suffix_min = np.minimum.accumulate(dp[prev_lo:start][::-1])[::-1]
    positions = np.arange(start, end)
    w = weight[start:end]
    best = w + suffix_min[np.maximum(positions - max_len - prev_lo, 0)]
    while True:  # relax with the minimum over earlier positions of the same block
        inner = np.empty_like(best)
        inner[0] = _INF
        np.minimum.accumulate(best[:-1], out=inner[1:])
        relaxed = np.minimum(best, w + inner)
        if np.array_equal(relaxed, best):
            return best
        best = relaxed


def naive_cuts(n: int, max_len: int) -> List[int]:
    """Fixed-length chunking, the baseline that AST-aware segmentation replaces."""
    return list(range(max_len, n, max_len))


def broken_count(cost: np.ndarray, cuts: List[int]) -> int:
    return int(cost[np.asarray(cuts, dtype=np.int64)].sum()) if cuts else 0


def clip_tree(tok_starts: np.ndarray, tok_ends: np.ndarray, kinds: np.ndarray,
              root_kind: int, a: int, b: int) -> np.ndarray:
    """AST rows of segment [a, b): the root plus every node clipped to the segment.

    Returns:
        (num_nodes, 3) int32 rows (start, end, type) relative to ``a``, in pre-order.
    """
    sel = (tok_starts < b) & (tok_ends > a)
    s = np.maximum(tok_starts[sel], a) - a
    e = np.minimum(tok_ends[sel], b) - a
    k = kinds[sel]
    order = np.lexsort((-e, s))  # stable: parent before an identical-span child
    rows = np.empty((len(order) + 1, 3), dtype=AST_DTYPE)
    rows[0] = (0, b - a, root_kind)
    rows[1:, 0], rows[1:, 1], rows[1:, 2] = s[order], e[order], k[order]
    return rows


def segment_bounds(n: int, cuts: List[int]) -> List[Tuple[int, int]]:
    edges = [0] + list(cuts) + [n]
    return list(zip(edges[:-1], edges[1:]))
