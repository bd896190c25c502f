"""Random placement primitives of subtree masking (spec section 5.5, with B-5 and B-12 fixed).

* :func:`arc_cover` spreads a node's pooled budget over its small children. It replaces the
  original's weighted permutation with empirically fitted lognormal weights by a scheme whose
  first-order behaviour is exact: every child's expected masked share is exactly
  ``pool * size / total``, and at most one child is cut (the original also cuts at most one).
* :func:`flat_spans` places the T5-style locality spans inside a leaf-only node.

Pure NumPy; randomness only from the caller's generator.
"""
from typing import List, Tuple

import numpy as np

from .spans import random_composition


def _pivot(a: int, size_a: int, b: int, size_b: int, rng: np.random.Generator):
    """Move tokens between two cut units so that at most one stays cut (pivotal sampling,
    Deville & Tille 1998). The total ``a + b`` is kept and ``E[a'] = a``: ``a'`` jumps to one of
    the ends of its feasible interval ``[max(0, a + b - size_b), min(size_a, a + b)]``."""
    total = a + b
    lo, hi = max(0, total - size_b), min(size_a, total)
    a = hi if int(rng.integers(hi - lo)) < a - lo else lo
    return a, total - a


def arc_cover(sizes: np.ndarray, pool: int, rng: np.random.Generator) -> List[Tuple[int, int]]:
    """Split ``pool`` tokens among units (children) of the given sizes.

    1. Circular systematic sampling: lay the units on a circle in a uniformly random order and
       cover ``pool`` consecutive tokens from a uniformly random offset. Every token is covered
       with probability exactly ``pool / total``; the arc cuts at most two units (its ends).
       Sampled lazily: the unit under the offset is drawn proportionally to its size, with a
       uniform offset inside it, and the following units in uniformly random order only until
       the arc ends.
    2. If two units are cut, :func:`_pivot` leaves at most one of them cut, without changing
       any unit's expected share. So with ``pool`` equal to the size of some units, typically
       whole units are masked.

    Args:
        sizes: (m,) int64 free tokens per unit, all > 0, ``sum(sizes) >= pool > 0``.
    Returns:
        ``(unit, tokens)`` for every unit that receives tokens; the tokens sum to ``pool`` and
        at most one unit receives fewer than its size.
    """
    cum = sizes.cumsum()
    total = int(cum[-1])
    if pool >= total:
        return list(enumerate(sizes.tolist()))
    u = int(rng.integers(total))
    first = int(cum.searchsorted(u, side="right"))
    tail = int(cum[first]) - u  # tokens of the first unit from the offset to its end
    if tail >= pool:
        return [(first, pool)]
    covered, left, sizes_list = [], pool - tail, sizes.tolist()
    for j in rng.permutation(sizes.size).tolist():
        if j != first:
            take = min(sizes_list[j], left)
            covered.append((j, take))
            left -= take
            if left == 0:
                break
    if left:  # the arc is longer than all other units: it wraps into the first unit's head
        covered.append((first, tail + left))
        return covered
    last, head = covered[-1]
    if tail < sizes_list[first] and head < sizes_list[last]:  # both ends cut
        tail, head = _pivot(tail, sizes_list[first], head, sizes_list[last], rng)
        covered[-1] = (last, head)
    covered.append((first, tail))
    return [(j, c) for j, c in covered if c]


def flat_spans(n: int, k: int, max_len: int, rng: np.random.Generator):
    """k of n positions as non-adjacent spans of length U{1..max_len-1} at random places.

    The T5-style locality spans of leaf-only nodes (spec section 5.5). Lengths are drawn until
    they reach k (the last one is cut to hit k exactly) and shuffled; when the n - k unmasked
    positions cannot keep that many spans apart, k is split uniformly into the largest number
    of spans that fits. Placement is uniform over all arrangements (distinct slots among the
    n - k + 1 gaps around unmasked positions).

    Returns:
        ``(starts, ends)``: (m,) int64 spans in ``[0, n)``, sorted, covering exactly k positions.
    """
    if k >= n:
        return np.zeros(1, dtype=np.int64), np.full(1, n, dtype=np.int64)
    lengths = rng.integers(1, max_len, size=k)
    reach = lengths.cumsum()
    m = int(reach.searchsorted(k)) + 1
    if m - 1 > n - k:
        m = n - k + 1
        lengths = random_composition(k, m, rng)
    else:
        lengths[m - 1] -= reach[m - 1] - k
        lengths = lengths[rng.permutation(m)]
    slots = np.sort(rng.permutation(n - k + 1)[:m])  # m distinct gaps, in order
    starts = slots + lengths.cumsum() - lengths
    return starts, starts + lengths
