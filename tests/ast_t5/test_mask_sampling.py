"""Sampling primitives of the masking objectives: arc_cover, flat_spans, array helpers, seeding."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ast_t5.data.span_sampling import arc_cover, flat_spans
from ast_t5.data.spans import (content_groups, mask_runs, random_composition, ranges_to_indices,
                               sample_rng)

FAST = settings(max_examples=80, deadline=None)


@FAST
@given(st.lists(st.integers(1, 12), min_size=1, max_size=12), st.data(), st.integers(0, 10 ** 6))
def test_arc_cover_spends_the_pool_and_cuts_at_most_one_unit(sizes, data, seed):
    sizes = np.array(sizes)
    pool = data.draw(st.integers(1, int(sizes.sum())))
    got = arc_cover(sizes, pool, np.random.default_rng(seed))
    units = [j for j, _ in got]
    assert len(units) == len(set(units)) and sum(c for _, c in got) == pool
    assert all(0 < c <= sizes[j] for j, c in got)
    assert sum(c < sizes[j] for j, c in got) <= 1


@pytest.mark.parametrize("pool", [1, 4, 13, 29, 45])
def test_arc_cover_expected_share_is_proportional_to_size(pool):
    """Each unit's expected share is exactly pool * size / total (checked to 4 sigma)."""
    sizes = np.array([1, 9, 3, 20, 8, 8, 1, 1])
    rng, reps = np.random.default_rng(pool), 6000
    share = np.zeros((reps, sizes.size))
    for r in range(reps):
        for j, c in arc_cover(sizes, pool, rng):
            share[r, j] = c
    expected = pool * sizes / sizes.sum()
    err = np.abs(share.mean(axis=0) - expected)
    tolerance = 4 * share.std(axis=0) / np.sqrt(reps) + 1e-9
    assert np.all(err <= tolerance), (share.mean(axis=0), expected)


def test_arc_cover_prefers_whole_units():
    """A pool equal to a whole number of equal units masks whole units only."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        got = arc_cover(np.full(7, 5), 15, rng)
        assert sorted(c for _, c in got) == [5, 5, 5]


@FAST
@given(st.integers(1, 60), st.data(), st.integers(2, 8), st.integers(0, 10 ** 6))
def test_flat_spans_exact_non_adjacent_in_range(n, data, max_len, seed):
    k = data.draw(st.integers(1, n))
    starts, ends = flat_spans(n, k, max_len, np.random.default_rng(seed))
    assert (ends - starts).sum() == k and np.all(ends > starts)
    assert starts[0] >= 0 and ends[-1] <= n and np.all(starts[1:] > ends[:-1])
    if k < n and (ends - starts).max() > max_len - 1:  # longer spans only when forced
        assert starts.size == n - k + 1


def test_flat_span_lengths_follow_uniform_1_to_max_len_minus_1():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([np.diff(np.stack(flat_spans(1000, 100, 10, rng)), axis=0)[0]
                              for _ in range(300)])
    counts = np.bincount(lengths, minlength=10)[1:10] / lengths.size
    assert np.all(np.abs(counts[:-1] - 1 / 9) < 0.02), counts  # cut last spans add a few short ones


def test_ranges_runs_and_compositions():
    got = ranges_to_indices(np.array([2, 5, 5, 9]), np.array([4, 5, 7, 10]))
    assert got.tolist() == [2, 3, 5, 6, 9]
    assert ranges_to_indices(np.array([], int), np.array([], int)).size == 0
    s, e = mask_runs(np.array([1, 1, 0, 1, 0, 0, 1], bool))
    assert s.tolist() == [0, 3, 6] and e.tolist() == [2, 4, 7]
    rng = np.random.default_rng(0)
    comps = np.array([random_composition(5, 3, rng) for _ in range(6000)])
    assert np.all(comps.sum(axis=1) == 5) and comps.min() >= 1
    _, freq = np.unique(comps, axis=0, return_counts=True)
    assert freq.size == 6 and freq.min() > 850  # the 6 compositions of 5 into 3, uniform
    with pytest.raises(ValueError):
        random_composition(2, 3, rng)


def test_content_groups_are_exact():
    tokens = np.array([5, 6, 5, 6, 5, 7, 5])
    groups = content_groups(tokens, np.array([0, 2, 4, 6, 1]), np.array([2, 4, 6, 7, 2]))
    assert groups[0] == groups[1] and len(set(groups.tolist())) == 4


def test_sample_rng_is_a_64_bit_hash_of_the_triple():
    draw = lambda *a: sample_rng(*a).integers(2 ** 63, size=4).tolist()
    assert draw(1, 2, 3) == draw(1, 2, 3)
    triples = [(1, 2, 3), (1, 3, 2), (2 ** 32, 0, 0), (0, 1, 0), (0, 0, 2 ** 32), (0, 0, 1),
               (2 ** 64 - 1, 0, 0), (0, 0, 0), (1, 2, 3 + 10 ** 6)]
    assert len({tuple(draw(*t)) for t in triples}) == len(triples)
    with pytest.raises(ValueError, match="epoch"):
        sample_rng(0, -1, 0)
    with pytest.raises(ValueError, match="index"):
        sample_rng(0, 0, 2 ** 64)
