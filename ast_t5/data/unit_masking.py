"""Whole units masked before subtree masking: identifier obfuscation (spec section 5.6) and
text-to-code function bodies (spec section 5.7).

Both spend at most a sub-budget on complete units and leave the rest of the sample's budget to
:func:`ast_t5.data.subtree_masking.subtree_mask`, so the total stays exact. Node kinds come in as
id arrays (:class:`ast_t5.data.node_categories.NodeCategories`).
"""
from typing import Tuple

import numpy as np

from .ast_tree import AstTree
from .node_categories import NodeCategories
from .spans import content_groups, member_mask


def identifier_occurrences(tree: AstTree, content: np.ndarray, identifier_types: np.ndarray
                           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outermost identifier nodes and their groups by token content.

    Args:
        tree: the segment's AST; content: (N,) token ids; identifier_types: (t,) int64 kind ids.
    Returns:
        ``(starts, ends, group)``: (m,) int64 each, disjoint occurrences in source order; equal
        ``group`` <=> equal token content (so ``Foo`` as a type and as a call are one group).
    """
    sel = np.flatnonzero(member_mask(tree.types, identifier_types))
    starts, ends = tree.starts[sel], tree.ends[sel]
    if starts.size:  # drop identifier nodes nested in an earlier identifier node
        outer = starts >= np.concatenate(([0], np.maximum.accumulate(ends)[:-1]))
        starts, ends = starts[outer], ends[outer]
    return starts, ends, content_groups(content, starts, ends)


def choose_identifier_groups(starts: np.ndarray, ends: np.ndarray, group: np.ndarray,
                             budget: int, rng: np.random.Generator) -> np.ndarray:
    """Pick whole identifier groups (all occurrences) costing at most ``budget`` tokens.

    Groups are visited in a random order drawn with probability proportional to their cost
    (length x occurrences, as in the original); each group that still fits is taken. Unlike the
    original, a group that does not fit is skipped rather than ending the search (fixes B-11),
    and groups are never split.

    Returns:
        (m,) bool: the occurrences to obfuscate.
    """
    if group.size == 0 or budget <= 0:
        return np.zeros(group.size, dtype=bool)
    cost = np.bincount(group, weights=ends - starts).astype(np.int64)  # length x occurrences
    num_groups = cost.size
    candidates = np.flatnonzero(cost <= budget)
    # Exponential race: sorting Exp(1) / weight gives successive sampling proportional to weight.
    race = rng.exponential(size=candidates.size) / cost[candidates]
    order = candidates[np.argsort(race)]
    chosen, left = [], budget
    for g, c in zip(order.tolist(), cost[order].tolist()):
        if c <= left:
            chosen.append(g)
            left -= c
    taken = np.zeros(num_groups, dtype=bool)
    taken[chosen] = True
    return taken[group]


def docstring_bodies(tree: AstTree, cats: NodeCategories) -> Tuple[np.ndarray, np.ndarray]:
    """Token ranges of function bodies that follow a docstring (Python rule, spec section 5.7).

    A docstring is an expression statement that is the first child of a block whose parent is a
    function definition, and whose only child is a string covering it. The body runs from the
    next statement to the end of the block. (The original accepted a docstring anywhere in the
    block and started the body right after it; we require the first statement, which is what a
    docstring is, and leave the whitespace before the body in the source.)

    Returns:
        ``(starts, ends)``: (b,) int64 non-empty body ranges in source order (may nest).
    """
    n = tree.starts.size
    e = np.flatnonzero(member_mask(tree.types, cats.expression_statement))
    e = e[(e >= 2) & (e + 1 < n)]
    p = tree.parent[e]
    ok = (p == e - 1) & member_mask(tree.types[p], cats.block)
    ok &= member_mask(tree.types[tree.parent[p]], cats.function_definition) & (tree.parent[p] >= 0)
    ok &= member_mask(tree.types[e + 1], cats.string) & (tree.starts[e + 1] == tree.starts[e])
    ok &= tree.ends[e + 1] == tree.ends[e]
    nxt = np.minimum(tree.starts.searchsorted(tree.ends[e]), n - 1)  # next sibling, if any
    ok &= (tree.parent[nxt] == p) & (tree.starts[nxt] >= tree.ends[e])
    return tree.starts[nxt[ok]], tree.ends[p[ok]]


def choose_bodies(starts: np.ndarray, ends: np.ndarray, budget: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Pick function bodies in a uniformly random order, each if it fits the remaining budget and
    does not overlap (nest in or contain) one already picked.

    Returns:
        (b,) bool: the bodies to mask.
    """
    chosen = np.zeros(starts.size, dtype=bool)
    left, picked = budget, []
    for j in rng.permutation(starts.size).tolist():
        s, e = int(starts[j]), int(ends[j])
        if e - s <= left and all(e <= ps or s >= pe for ps, pe in picked):
            chosen[j] = True
            picked.append((s, e))
            left -= e - s
    return chosen
