"""AST-aware span corruption on real trees: standard-library files parsed with tree-sitter-python,
segmented by the masking benchmark's fixture (benchmarks/bench_masking.py)."""

import numpy as np
import pytest

from ast_t5.data.ast_tree import AstTree
from ast_t5.data.masking_options import AstMaskingOptions
from ast_t5.data.spans import sample_rng
from ast_t5.data.subtree_masking import ast_span_corruption, select_mask, subtree_mask
from ast_t5.data.unit_masking import docstring_bodies

from ..conftest import load_benchmark
from .test_subtree_masking import check_format

pytest.importorskip("tree_sitter_python")
NO_LIMIT = 10 ** 9


def kw(bench, cats):
    return {"sentinels": bench.SPEC, "categories": cats}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_masking", "bench_masking_fixture")


@pytest.fixture(scope="module")
def segments(bench):
    segs = bench.stdlib_segments(max_files=25, seg_len=512)
    assert len(segs) >= 40
    return segs[:: max(1, len(segs) // 60)]


@pytest.fixture(scope="module")
def cats(bench):
    return bench.python_categories(bench.python_language())


def test_paper_config_exact_budget_and_reconstruction(bench, segments, cats):
    opts = AstMaskingOptions(max_target_len=NO_LIMIT)
    modes = set()
    for i, (tokens, rows) in enumerate(segments):
        sel = select_mask(tokens, rows, opts, sample_rng(0, 0, i), **kw(bench, cats))
        assert sel.num_masked == sel.budget == round((tokens.size - 1) * 0.25)
        source, target = ast_span_corruption(tokens, rows, opts, sample_rng(0, 0, i),
                                             **kw(bench, cats))
        check_format(tokens, source, target, bench.SPEC)
        modes.add(sel.mode)
        if sel.mode == "obfuscation":  # shared sentinels cover identical identifiers
            for k in np.flatnonzero(np.bincount(sel.sentinel) > 1):
                spans = {tuple(tokens[s:e]) for s, e in zip(sel.starts[sel.sentinel == k],
                                                            sel.ends[sel.sentinel == k])}
                assert len(spans) == 1
    assert modes == {"subtree", "obfuscation"}


def test_at_most_one_cut_child_per_node_on_real_trees(segments):
    for i, (tokens, rows) in enumerate(segments):
        n = tokens.size - 1
        opts = AstMaskingOptions(threshold_lb=n + 1, threshold_ub=n + 1, obfuscation_prob=0.0)
        tree = AstTree(rows, n)
        mask = subtree_mask(tree, np.ones(n, bool), round(n * 0.25), opts, sample_rng(1, 0, i))
        masked = np.concatenate(([0], np.cumsum(mask)))
        inside = masked[tree.ends] - masked[tree.starts]
        cut = (inside > 0) & (inside < tree.ends - tree.starts)
        assert mask.sum() == round(n * 0.25)
        assert max(cut[tree.children(j)].sum() for j in range(rows.shape[0])) <= 1


def test_docstring_bodies_and_text_to_code_mode(bench, cats):
    from tree_sitter import Parser
    src = (b'def f(x):\n    """Doc."""\n    y = x\n    return y\n\n'
           b'def g():\n    return 1\n\n'
           b'def h():\n    x = 1\n    """not a docstring"""\n')
    (tokens, rows), = bench.file_segments(src, Parser(bench.python_language()), 1024)
    starts, ends = docstring_bodies(AstTree(rows, tokens.size - 1), cats)
    pieces = bench.PIECE.findall(src)
    assert [b"".join(pieces[s:e]) for s, e in zip(starts, ends)] == [b"y = x\n    return y"]
    opts = AstMaskingOptions(mask_prob=0.5, obfuscation_prob=0.0, t2c_prob=1.0, t2c_ratio=1.0,
                             max_target_len=NO_LIMIT)
    sel = select_mask(tokens, rows, opts, sample_rng(0, 0, 0), **kw(bench, cats))
    assert sel.mode == "t2c" and sel.mask[starts[0]:ends[0]].all() and sel.num_masked == sel.budget


def test_dedup_spans_lists_each_content_once(bench, segments, cats):
    opts = AstMaskingOptions(obfuscation_prob=0.0, dedup_spans=True, max_target_len=NO_LIMIT)
    shared = 0
    for i, (tokens, rows) in enumerate(segments):
        sel = select_mask(tokens, rows, opts, sample_rng(2, 0, i), **kw(bench, cats))
        contents = [tuple(tokens[s:e]) for s, e in zip(sel.starts, sel.ends)]
        assert len(set(contents)) == sel.sentinel.max() + 1
        assert all(contents[j] == contents[np.flatnonzero(sel.sentinel == k)[0]]
                   for j, k in enumerate(sel.sentinel))
        shared += len(contents) - len(set(contents))
    assert shared > 0
