"""Property tests of AST-aware span corruption (ast_t5/data/subtree_masking.py) on random trees.

The tree strategy and the ``corrupt`` helper are reused by the other test_mask*.py modules.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ast_t5.data.ast_tree import AstTree
from ast_t5.data.masking_options import AstMaskingOptions
from ast_t5.data.node_categories import NodeCategories
from ast_t5.data.sentinels import SentinelSpec, build_source_target, reconstruct
from ast_t5.data.spans import sample_rng
from ast_t5.data.subtree_masking import ast_span_corruption, select_mask, subtree_mask

IDENT = 1  # node type id used as "identifier" by the random trees
CATS = NodeCategories(identifier=[IDENT])
SPEC = SentinelSpec(vocab_size=100, num_sentinels=40)  # ordinary ids 4..59, sentinels 60..99
NO_LIMIT = 10 ** 9
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def trees(draw, max_tokens=80, max_nodes=50, vocab=(4, 12)):
    """(tokens with </s>, (n, 3) rows): a random properly nested tree in pre-order.

    Children are disjoint non-empty sub-spans (possibly equal to the parent, i.e. chains); tokens
    come from a small vocabulary so identifiers repeat.
    """
    n_tok = draw(st.integers(1, max_tokens))
    rows, work = [(0, n_tok, 0)], [(0, n_tok)]
    while work and len(rows) < max_nodes:
        lo, hi = work.pop()
        k = draw(st.integers(0, min(4, (hi - lo + 1) // 2)))
        cuts = sorted(draw(st.lists(st.integers(lo, hi), min_size=2 * k, max_size=2 * k,
                                    unique=True)))
        for a, b in zip(cuts[0::2], cuts[1::2]):
            rows.append((a, b, draw(st.integers(0, 3))))
            work.append((a, b))
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], -rows[i][1], i))
    content = draw(st.lists(st.integers(*vocab), min_size=n_tok, max_size=n_tok))
    return np.array(content + [SPEC.eos]), np.array([rows[i] for i in order])


options = st.builds(
    lambda p, lb, extra, mml, op, orat, dedup: AstMaskingOptions(
        mask_prob=p, threshold_lb=lb, threshold_ub=lb + extra, mask_multiple_length=mml,
        obfuscation_prob=op, obfuscation_ratio=orat, dedup_spans=dedup, max_target_len=NO_LIMIT),
    st.floats(0, 1), st.integers(1, 10), st.integers(0, 20), st.integers(2, 6),
    st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1), st.booleans())


def corrupt(tokens, rows, opts, seed=0, epoch=0, index=0, spec=SPEC, cats=CATS):
    return ast_span_corruption(tokens, rows, opts, sample_rng(seed, epoch, index),
                               sentinels=spec, categories=cats)


def check_format(tokens, source, target, spec=SPEC):
    """Source/target format of ast_t5/data/sentinels.py; returns the sentinels in order."""
    assert source[-1] == spec.eos and target[-1] == spec.eos
    src_sent = [t for t in source.tolist() if t >= spec.first_sentinel]
    tgt_sent = [t for t in target.tolist() if t >= spec.first_sentinel]
    firsts = list(dict.fromkeys(src_sent))
    assert firsts == [spec.vocab_size - 1 - k for k in range(len(firsts))]  # k-th new span
    assert tgt_sent == firsts  # each sentinel listed once, in order
    assert target.size == 1 or target[0] == spec.vocab_size - 1
    assert np.array_equal(reconstruct(source, target, spec), tokens)
    return firsts


@FAST
@given(trees(), options, st.integers(0, 2 ** 64 - 1))
def test_exact_budget_format_and_reconstruction(tree, opts, seed):
    tokens, rows = tree
    opts.validate()
    sel = select_mask(tokens, rows, opts, sample_rng(seed, 0, 0), sentinels=SPEC, categories=CATS)
    n = tokens.size - 1
    assert sel.budget == round(n * opts.mask_prob) == sel.num_masked
    source, target = corrupt(tokens, rows, opts, seed=seed)
    firsts = check_format(tokens, source, target)
    assert source.size == n - sel.num_masked + sel.starts.size + 1
    assert len(firsts) == sel.sentinel.max() + 1 if sel.starts.size else not firsts
    if not opts.dedup_spans and opts.obfuscation_prob == 0:
        assert len(firsts) == sel.starts.size  # plain spans never share a sentinel
        assert np.all(sel.starts[1:] > sel.ends[:-1])  # adjacent spans were merged


@FAST
@given(trees(), options, st.integers(1, 6), st.integers(2, 25))
def test_limits_keep_a_prefix_of_sentinels(tree, opts, num_sentinels, max_target_len):
    tokens, rows = tree
    spec = SentinelSpec(vocab_size=100, num_sentinels=num_sentinels)
    limited = AstMaskingOptions(**{**opts.__dict__, "max_target_len": max_target_len})
    full = select_mask(tokens, rows, opts, sample_rng(7, 1, 2), sentinels=SPEC, categories=CATS)
    sel = select_mask(tokens, rows, limited, sample_rng(7, 1, 2), sentinels=spec, categories=CATS)
    source, target = corrupt(tokens, rows, limited, seed=7, epoch=1, index=2, spec=spec)
    assert target.size <= max_target_len
    assert len(check_format(tokens, source, target, spec)) <= num_sentinels
    m = sel.sentinel.max() + 1 if sel.sentinel.size else 0
    keep = full.sentinel < m
    assert np.array_equal(sel.starts, full.starts[keep])
    assert np.array_equal(sel.ends, full.ends[keep])
    if m < (full.sentinel.max() + 1 if full.sentinel.size else 0):  # the next one did not fit
        first_next = np.flatnonzero(full.sentinel == m)[0]
        cost = target.size + 1 + full.ends[first_next] - full.starts[first_next]
        assert m == num_sentinels or cost > max_target_len


@FAST
@given(trees(vocab=(4, 7)), st.floats(0.2, 1.0), st.integers(0, 1000))
def test_obfuscated_identifiers_share_one_sentinel(tree, mask_prob, seed):
    tokens, rows = tree
    opts = AstMaskingOptions(mask_prob=mask_prob, obfuscation_prob=1.0, obfuscation_ratio=1.0,
                             max_target_len=NO_LIMIT)
    sel = select_mask(tokens, rows, opts, sample_rng(seed, 0, 0), sentinels=SPEC, categories=CATS)
    ident = [(s, e) for s, e, t in rows.tolist() if t == IDENT]
    outer = [(s, e) for j, (s, e) in enumerate(ident)  # not inside an earlier identifier node
             if not any(a <= s and e <= b for a, b in ident[:j])]
    content = lambda s, e: tuple(tokens[s:e].tolist())
    spans = dict(zip(zip(sel.starts.tolist(), sel.ends.tolist()), sel.sentinel.tolist()))
    obf_tokens = 0
    for k in set(sel.sentinel.tolist()):
        group = [se for se, kk in spans.items() if kk == k]
        if len(group) > 1:  # shared sentinel => an obfuscated identifier, every occurrence
            assert len({content(*se) for se in group}) == 1
            assert set(group) == {se for se in outer if content(*se) == content(*group[0])}
            obf_tokens += sum(e - s for s, e in group)
    assert obf_tokens <= round(sel.budget * opts.obfuscation_ratio)
    assert sel.num_masked == sel.budget


@FAST
@given(trees(max_tokens=60), st.floats(0, 1), st.integers(0, 1000))
def test_without_big_shares_at_most_one_child_is_cut(tree, mask_prob, seed):
    tokens, rows = tree
    n = tokens.size - 1
    opts = AstMaskingOptions(mask_prob=mask_prob, threshold_lb=n + 1, threshold_ub=n + 1,
                             obfuscation_prob=0.0)
    tr = AstTree(rows, n)
    mask = subtree_mask(tr, np.ones(n, bool), round(n * mask_prob), opts, sample_rng(seed, 0, 0))
    masked = np.concatenate(([0], np.cumsum(mask)))
    inside = masked[tr.ends] - masked[tr.starts]
    part = (inside > 0) & (inside < tr.ends - tr.starts)
    for i in range(rows.shape[0]):
        assert part[tr.children(i)].sum() <= 1


@pytest.mark.parametrize("seed", range(20))
def test_budget_of_whole_children_masks_whole_children(seed):
    rng = np.random.default_rng(seed)
    q, s = 8, int(rng.integers(2, 7))
    j = int(rng.integers(1, q))
    n = q * s  # a root with q children of s tokens each; budget j * s
    rows = np.array([[0, n, 0]] + [[c * s, (c + 1) * s, 2] for c in range(q)])
    tokens = np.append(rng.integers(4, 50, n), SPEC.eos)
    opts = AstMaskingOptions(mask_prob=j / q, threshold_lb=n, threshold_ub=n, obfuscation_prob=0.0,
                             max_target_len=NO_LIMIT)
    sel = select_mask(tokens, rows, opts, sample_rng(seed, 0, 0), sentinels=SPEC, categories=CATS)
    per_child = sel.mask.reshape(q, s).sum(axis=1)
    assert sorted(per_child.tolist()) == [0] * (q - j) + [s] * j


def test_same_seed_same_sample_new_epoch_new_mask():
    rng = np.random.default_rng(0)
    n = 300
    rows = np.array([[0, n, 0]] + [[c * 10, c * 10 + 10, 2] for c in range(30)]
                    + [[c * 10 + 2, c * 10 + 5, IDENT] for c in range(30)])
    rows = rows[np.lexsort((-rows[:, 1], rows[:, 0]))]
    tokens = np.append(rng.integers(4, 50, n), SPEC.eos)
    opts = AstMaskingOptions(max_target_len=NO_LIMIT)
    spec = SentinelSpec(vocab_size=200, num_sentinels=140)
    a = [corrupt(tokens, rows, opts, seed=3, epoch=1, index=i, spec=spec) for i in range(10)]
    b = [corrupt(tokens, rows, opts, seed=3, epoch=1, index=i, spec=spec) for i in range(10)]
    c = [corrupt(tokens, rows, opts, seed=3, epoch=2, index=i, spec=spec) for i in range(10)]
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert all(not np.array_equal(x[0], z[0]) for x, z in zip(a, c))
    assert len({x[0].tobytes() for x in a}) == 10  # different indices, different masks


def _random_big_tree(rng, n_tok, n_nodes):
    """A tree with about n_nodes random nested nodes, built by recursive halving (iterative)."""
    rows, work = [(0, n_tok, 0)], [(0, n_tok)]
    while work and len(rows) < n_nodes:
        lo, hi = work.pop(int(rng.integers(len(work))))
        if hi - lo < 2:
            continue
        mid = int(rng.integers(lo + 1, hi))
        for a, b in ((lo, mid), (mid + int(rng.integers(0, 2)) if mid + 1 < hi else mid, hi)):
            rows.append((a, b, int(rng.integers(0, 3))))
            work.append((a, b))
    rows = np.array(rows)
    return rows[np.lexsort((np.arange(len(rows)), -rows[:, 1], rows[:, 0]))]


@pytest.mark.parametrize("shape", ["wide_12k_nodes", "deep_5k_levels"])
def test_large_and_deep_trees(shape):
    rng = np.random.default_rng(1)
    if shape == "wide_12k_nodes":
        n = 20000
        rows = _random_big_tree(rng, n, 12000)
    else:
        n = 10001  # 5001 nested spans [i, n - i)
        rows = np.array([[i, n - i, i % 3] for i in range(5001)])
    tokens = np.append(rng.integers(4, 50, n), SPEC.eos)
    spec = SentinelSpec(vocab_size=5000, num_sentinels=4000)
    opts = AstMaskingOptions(max_target_len=NO_LIMIT)
    sel = select_mask(tokens, rows, opts, sample_rng(0, 0, 0), sentinels=spec, categories=CATS)
    assert sel.num_masked == round(n * opts.mask_prob)
    source, target = build_source_target(tokens[:-1], sel.starts, sel.ends, sel.sentinel, spec)
    assert np.array_equal(reconstruct(source, target, spec), tokens)


@FAST
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n), st.integers(0, n)), max_size=12))))
def test_tree_index_matches_brute_force(case):
    """Validation, parents, children and token owners of AstTree against O(n^2) definitions."""
    n, pairs = case
    spans = sorted([(min(a, b), max(a, b)) for a, b in pairs if a != b],  # duplicates allowed
                   key=lambda se: (se[0], -se[1]))
    rows = np.array([(0, n, 0)] + [(a, b, 0) for a, b in spans]).reshape(-1, 3)
    nested = all(b1 <= a2 or b2 <= a1 or (a1 <= a2 and b2 <= b1) or (a2 <= a1 and b1 <= b2)
                 for a1, b1 in spans for a2, b2 in spans)
    if not nested:
        with pytest.raises(ValueError, match="properly nested"):
            AstTree(rows, n)
        return
    tree = AstTree(rows, n)
    contains = lambda j, i: rows[j, 0] <= rows[i, 0] and rows[i, 1] <= rows[j, 1]
    parent = [-1] + [max(j for j in range(i) if contains(j, i)) for i in range(1, len(rows))]
    assert tree.parent.tolist() == parent
    for i in range(len(rows)):
        assert tree.children(i).tolist() == [j for j in range(len(rows)) if parent[j] == i]
    owner = [max(i for i in range(len(rows)) if rows[i, 0] <= t < rows[i, 1]) for t in range(n)]
    assert tree.owner.tolist() == owner


@pytest.mark.parametrize("rows, match", [
    ([[0, 5, 0], [1, 3, 0], [2, 4, 0]], "properly nested"),
    ([[0, 5, 0], [2, 3, 0], [1, 2, 0]], "pre-order"),
    ([[0, 4, 0]], "root spans"),
    ([[0, 5, 0], [3, 3, 0]], "empty or outside"),
    ([[0, 5, 0], [3, 6, 0]], "pre-order|empty or outside"),
    (np.zeros((0, 3)), "non-empty"),
])
def test_invalid_trees_raise_one_line_errors(rows, match):
    tokens = np.array([5, 6, 7, 8, 9, SPEC.eos])
    with pytest.raises(ValueError, match=match):
        corrupt(tokens, np.array(rows), AstMaskingOptions())


@pytest.mark.parametrize("tokens, match", [
    ([5, 6, 7], "end with </s>"),
    ([5, 60, 7, 2], r"\[0, 60\)"),
    ([5, -1, 7, 2], r"\[0, 60\)"),
])
def test_invalid_tokens_raise(tokens, match):
    with pytest.raises(ValueError, match=match):
        corrupt(np.array(tokens), np.array([[0, len(tokens) - 1, 0]]), AstMaskingOptions())


@pytest.mark.parametrize("changes, field", [
    ({"mask_prob": 1.5}, "mask_prob"), ({"threshold_lb": 0}, "threshold_lb"),
    ({"threshold_ub": 3}, "threshold_ub"), ({"mask_multiple_length": 1}, "mask_multiple_length"),
    ({"obfuscation_prob": -0.1}, "obfuscation_prob"),
    ({"obfuscation_ratio": 2.0}, "obfuscation_ratio"),
    ({"t2c_prob": 1.2}, "t2c_prob"), ({"t2c_ratio": 1.5}, "t2c_ratio"),
    ({"t2c_prob": 0.3}, "t2c_ratio"), ({"t2c_prob": 0.6, "t2c_ratio": 0.5}, "obfuscation_prob"),
    ({"max_target_len": 1}, "max_target_len"), ({"threshold_lb": 2.5}, "threshold_lb"),
])
def test_options_validate_names_the_field(changes, field):
    AstMaskingOptions().validate()
    with pytest.raises(ValueError, match=f"^{field}"):
        AstMaskingOptions(**changes).validate()
