"""Masking in DataLoader-style worker processes (fork and spawn) equals masking in-process."""
import multiprocessing as mp

import numpy as np
import pytest

from ast_t5.data.masking_options import AstMaskingOptions
from ast_t5.data.node_categories import NodeCategories
from ast_t5.data.sentinels import SentinelSpec
from ast_t5.data.spans import sample_rng
from ast_t5.data.subtree_masking import ast_span_corruption
from ast_t5.data.t5_span_masking import t5_span_corruption

SPEC = SentinelSpec(vocab_size=300, num_sentinels=200)


def _segment():
    """A fixed 400-token segment: 40 statements of 10 tokens, each with a 2-token identifier."""
    rng = np.random.default_rng(123)
    rows = [[0, 400, 0]]
    for c in range(40):
        rows += [[10 * c, 10 * c + 10, 2], [10 * c + 1, 10 * c + 3, 1], [10 * c + 5, 10 * c + 9, 3]]
    tokens = np.append(rng.integers(4, 20, 400), SPEC.eos)
    return tokens, np.array(rows)


def corrupt_indices(indices):
    """(source, target) lists for some sample indices (top level, so spawn can pickle it)."""
    tokens, rows = _segment()
    opts, cats = AstMaskingOptions(), NodeCategories(identifier=[1])
    out = []
    for i in indices:
        src, tgt = ast_span_corruption(tokens, rows, opts, sample_rng(5, 1, i), sentinels=SPEC,
                                       categories=cats)
        t5 = t5_span_corruption(tokens, 0.15, 3.0, sample_rng(5, 1, i), sentinels=SPEC)
        out.append((src.tolist(), tgt.tolist(), t5[0].tolist(), t5[1].tolist()))
    return out


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_give_the_in_process_results(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"start method {method} unavailable")
    chunks = [list(range(j, j + 4)) for j in range(0, 16, 4)]
    expected = [corrupt_indices(c) for c in chunks]
    with mp.get_context(method).Pool(2 if method == "fork" else 1) as pool:  # spawn imports torch
        got = pool.map(corrupt_indices, chunks)
    assert got == expected
    assert len({tuple(s) for chunk in got for s, _, _, _ in chunk}) == 16
