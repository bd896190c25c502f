"""Array helpers shared by the span-corruption objectives (spec sections 5.5, 5.8, 5.10).

Pure NumPy: per-sample random generators, run detection, range expansion and uniform random
compositions. Every function takes its randomness from an explicit ``np.random.Generator``.
"""
import numpy as np

# A fixed word mixed into every masking seed, so that the masking stream of (seed, epoch, index)
# differs from any other stream seeded with the same three numbers ("mask" in ASCII).
MASKING_STREAM_TAG = 0x6D61736B
_WORD_BITS = 32  # SeedSequence consumes entropy as 32-bit words
_WORD_MASK = (1 << _WORD_BITS) - 1
_MAX_SEED_VALUE = 1 << 64  # seed, epoch and index are each hashed as full 64-bit values


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample, from a real 64-bit hash of ``(seed, epoch, index)``.

    Fixes bug B-8 (spec section 14): the original reduced the triple to ``hash(...) % 1e6``.
    Each value is split into exactly two 32-bit words, so distinct triples give distinct entropy
    (``SeedSequence`` would otherwise treat ``[a, b]`` and ``[a, b, 0]`` alike), and
    ``SeedSequence`` mixes them into the 128-bit state of a PCG64 generator.

    Args:
        seed, epoch, index: integers in ``[0, 2**64)``.
    Returns:
        A fresh ``np.random.Generator``; same arguments give the same stream in any process.
    """
    words = [MASKING_STREAM_TAG]
    for name, value in (("seed", seed), ("epoch", epoch), ("index", index)):
        value = int(value)
        if not 0 <= value < _MAX_SEED_VALUE:
            raise ValueError(f"sample_rng: {name}={value} must be in [0, 2**64)")
        words += [value & _WORD_MASK, value >> _WORD_BITS]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def ranges_to_indices(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, e)`` for every pair, without a Python loop.

    Args:
        starts, ends: (m,) int arrays with ``starts <= ends``.
    Returns:
        (sum(ends - starts),) int64 positions, range by range.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(ends, dtype=np.int64) - starts
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64)
    # Step +1 inside a range; at each range boundary jump from the previous range's last
    # position to the next range's start.
    steps = np.ones(int(lengths.sum()), dtype=np.int64)
    offsets = np.cumsum(lengths)[:-1]
    steps[0] = starts[0]
    steps[offsets] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps)


def mask_runs(mask: np.ndarray):
    """Maximal runs of True in a boolean mask.

    Args:
        mask: (n,) bool.
    Returns:
        ``(starts, ends)``: (r,) int64 each, ``ends`` exclusive, in increasing order.
    """
    padded = np.zeros(mask.size + 2, dtype=np.int8)
    padded[1:-1] = mask
    edges = np.flatnonzero(np.diff(padded))
    return edges[0::2].astype(np.int64), edges[1::2].astype(np.int64)


def random_composition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random composition of ``total`` into ``parts`` positive integers.

    Every ordered tuple of positive integers summing to ``total`` is equally likely: the
    ``parts - 1`` cut points are a uniform subset of the ``total - 1`` inner boundaries. This is
    the segmentation step of T5's span corruption (Raffel et al., 2020, section 3.1.4).

    Returns:
        (parts,) int64, every entry >= 1. Requires ``1 <= parts <= total``.
    """
    if not 1 <= parts <= total:
        raise ValueError(f"random_composition: need 1 <= parts ({parts}) <= total ({total})")
    cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False)) + 1 if parts > 1 else []
    return np.diff(np.concatenate(([0], cuts, [total]))).astype(np.int64)


def content_groups(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Group spans by exact token content (no hashing, so no collisions; fixes B-10).

    Args:
        tokens: (n,) int token ids.
        starts, ends: (m,) int64 spans.
    Returns:
        (m,) int64 group ids in ``[0, num_groups)``; equal ids <=> equal token sequences.
    """
    lengths = ends - starts
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    table = np.full((lengths.size, int(lengths.max()) + 1), -1, dtype=np.int64)  # (m, 1 + width)
    table[:, 0] = lengths
    positions = ranges_to_indices(starts, ends)
    rows = np.repeat(np.arange(lengths.size), lengths)
    table[rows, 1 + positions - np.repeat(starts, lengths)] = tokens[positions]
    order = np.lexsort(table.T[::-1])  # rows sorted lexicographically
    ranked = table[order]
    new_row = np.concatenate(([True], (ranked[1:] != ranked[:-1]).any(axis=1)))
    groups = np.empty(lengths.size, dtype=np.int64)
    groups[order] = new_row.cumsum() - 1
    return groups


_SMALL_SET = 8  # up to this many ids, comparisons beat np.isin's sort (measured on NumPy 2.4)


def member_mask(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``np.isin(values, ids)``, faster for the few ids of a node category.

    Args:
        values: (m,) int; ids: (t,) int.
    Returns:
        (m,) bool.
    """
    if ids.size > _SMALL_SET:
        return np.isin(values, ids)
    mask = np.zeros(values.shape, dtype=bool)
    for i in ids.tolist():
        mask |= values == i
    return mask
