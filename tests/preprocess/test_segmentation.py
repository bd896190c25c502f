"""Tests of ast_t5_preprocess.segmentation: alignment and the segmentation programme."""
import itertools
import signal

import numpy as np
from hypothesis import given, settings, strategies as st

from ast_t5_preprocess.formats import check_ast_item
from ast_t5_preprocess.segmentation import (align_boundaries, align_nodes, ast_aware_cuts, broken_count,
                                            clip_tree, cut_costs, naive_cuts, segment_bounds)


@st.composite
def nested_spans(draw, max_len=60):
    """A random laminar family of spans over [0, n) plus the root, in pre-order."""
    n = draw(st.integers(2, max_len))
    spans = []
    stack = [(0, n)]
    while stack:
        a, b = stack.pop()
        if b - a < 2 or len(spans) > 80:
            continue
        cuts = sorted(set(draw(st.lists(st.integers(a, b), max_size=4)) + [a, b]))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            if hi > lo and draw(st.booleans()):
                spans.append((lo, hi))
                stack.append((lo, hi))
    spans.sort(key=lambda s: (s[0], -s[1]))
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    return n, starts, ends


def brute_force_best(cost, max_len):
    n = len(cost) - 1
    best = None
    for k in range(0, n):
        for cuts in itertools.combinations(range(1, n), k):
            edges = [0, *cuts, n]
            if all(b - a <= max_len for a, b in zip(edges[:-1], edges[1:])):
                key = (broken_count(cost, list(cuts)), len(cuts))
                best = key if best is None or key < best else best
    return best


@settings(max_examples=150, deadline=None)
@given(nested_spans(max_len=14), st.integers(2, 8))
def test_dp_is_optimal_against_brute_force(tree, max_len):
    n, starts, ends = tree
    cost = cut_costs(starts, ends, n)
    cuts = ast_aware_cuts(cost, max_len)
    expected = (0, 0) if n <= max_len else brute_force_best(cost, max_len)
    assert (broken_count(cost, cuts), len(cuts)) == expected


@settings(max_examples=200, deadline=None)
@given(nested_spans(), st.integers(1, 20))
def test_segments_cover_within_budget_and_trees_nest(tree, max_len):
    n, starts, ends = tree
    cost = cut_costs(starts, ends, n)
    cuts = ast_aware_cuts(cost, max_len)
    bounds = segment_bounds(n, cuts)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(bounds[:-1], bounds[1:]))
    assert all(0 < b - a <= max_len for a, b in bounds)
    assert broken_count(cost, cuts) <= broken_count(cost, naive_cuts(n, max_len))
    kinds = np.arange(len(starts), dtype=np.int32) % 7
    for a, b in bounds:
        rows = clip_tree(starts, ends, kinds, 99, a, b)
        check_ast_item(rows, b - a + 1)  # +1: the segment's </s>


def test_cut_costs_counts_spanning_nodes():
    starts, ends = np.array([0, 0, 2, 5]), np.array([8, 4, 4, 6])
    cost = cut_costs(starts, ends, 8)
    # cut k breaks nodes with start < k < end
    expected = [sum(s < k < e for s, e in zip(starts, ends)) for k in range(9)]
    assert cost.tolist() == expected


def test_alignment_moves_straddled_boundaries_to_token_start():
    token_ends = np.array([3, 7, 8, 12])  # tokens [0,3) [3,7) [7,8) [8,12)
    assert align_boundaries(np.array([0, 3, 5, 7, 12]), token_ends).tolist() == [0, 1, 1, 2, 4]
    ts, te, keep = align_nodes(np.array([0, 5, 5]), np.array([12, 8, 6]), token_ends)
    assert keep.tolist() == [True, True, False]  # [5,6) lies inside one token: dropped
    assert list(zip(ts, te)) == [(0, 4), (1, 3)]


@settings(max_examples=200, deadline=None)
@given(nested_spans(max_len=80), st.lists(st.integers(1, 5), min_size=1, max_size=80))
def test_alignment_preserves_nesting(tree, lengths):
    n_bytes, starts, ends = tree
    token_ends = np.cumsum(lengths)
    token_ends = token_ends[token_ends < n_bytes].tolist() + [n_bytes]
    ts, te, _ = align_nodes(starts, ends, np.array(token_ends))
    n_tok = len(token_ends)
    order = np.lexsort((-te, ts))
    rows = np.stack([np.r_[0, ts[order]], np.r_[n_tok, te[order]], np.zeros(len(ts) + 1, int)], 1)
    check_ast_item(rows, n_tok + 1)


def test_segmentation_is_linear_time():
    n, max_len = 300_000, 100_000  # O(n * max_len) Python steps would never finish
    rng = np.random.default_rng(0)
    cost = rng.integers(0, 6, n + 1)
    cost[0] = cost[n] = 0

    def _timeout(*_):
        raise TimeoutError("segmentation is not linear")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(60)
    try:
        cuts = ast_aware_cuts(cost, max_len)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert len(cuts) >= 2 and all(b - a <= max_len for a, b in segment_bounds(n, cuts))


def test_short_files_stay_whole():
    assert ast_aware_cuts(np.zeros(11, dtype=np.int64), 10) == []
    assert ast_aware_cuts(np.zeros(12, dtype=np.int64), 10) != []
