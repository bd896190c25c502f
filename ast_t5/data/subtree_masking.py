"""AST-aware span corruption (Gong et al., ICML 2024, "AST-aware subtree corruption"; spec
sections 5.4-5.8).

Pure NumPy, no global state: every function takes an explicit ``np.random.Generator`` (use
:func:`sample_rng` for the per-sample 64-bit seed of ``(seed, epoch, index)``). The fairseq
dataset wrapper calls :func:`ast_span_corruption` (or :func:`select_mask` then
:func:`build_source_target` when it also wants the statistics) once per sample.

Differences from the original C++ core (spec section 14), all deliberate:

* the budget is exactly ``round(N * mask_prob)`` (no probabilistic rounding), and shares are
  drawn from the exact multivariate hypergeometric distribution (B-12);
* the pooled small shares of a node are placed by :func:`ast_t5.data.span_sampling.arc_cover`
  (circular systematic sampling plus a pivotal step) instead of the fitted lognormal weights
  (B-5): each child's expected share is exactly proportional to its free tokens, whole children
  are masked where the pool allows, and at most one child is cut and recursed into;
* the traversal is an explicit stack over a vectorized tree index, so size and depth are
  unlimited and there is no fallback (B-3);
* obfuscation takes whole identifier groups and never stops early (B-11); obfuscated
  identifiers keep their shared sentinel even next to another masked span (B-10); content
  deduplication of other spans is an option;
* source and target come from one computation, and the target respects ``max_target_len``.
"""
import logging
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from .ast_tree import AstTree
from .masking_options import AstMaskingOptions
from .node_categories import NodeCategories
from .sentinels import (SentinelSpec, build_source_target, first_appearance_ranks, fit_spans,
                        reconstruct)
from .span_sampling import arc_cover, flat_spans
from .spans import content_groups, mask_runs, ranges_to_indices, sample_rng
from .unit_masking import (choose_bodies, choose_identifier_groups, docstring_bodies,
                           identifier_occurrences)

__all__ = ["AstMaskingOptions", "MaskSelection", "NodeCategories", "SentinelSpec",
           "ast_span_corruption", "build_source_target", "reconstruct", "sample_rng",
           "select_mask", "subtree_mask"]

logger = logging.getLogger(__name__)

MODES = ("subtree", "obfuscation", "t2c")  # which branch of spec section 5.4 a sample took


@dataclass(frozen=True, eq=False)
class MaskSelection:
    """The masking decision for one segment.

    Attributes:
        mask: (N,) bool, masked content positions (every obfuscated occurrence included).
        starts, ends: (s,) int64 spans in source order (end exclusive); adjacent subtree-masked
            tokens form one span, each obfuscated occurrence is its own span.
        sentinel: (s,) int64 sentinel number of each span (0 = first in source order); all
            occurrences of an obfuscated identifier share one.
        budget: round(N * mask_prob). ``mask.sum() == budget`` unless the sentinel-count or
            target-length limit dropped spans (see :func:`ast_t5.data.sentinels.fit_spans`).
        mode: one of :data:`MODES`.
    """

    mask: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    sentinel: np.ndarray
    budget: int
    mode: str

    @property
    def num_masked(self) -> int:
        return int(self.mask.sum())


class _SubtreeMasker:
    """State of one :func:`subtree_mask` call: an explicit stack of (node, share) pairs and the
    masked tokens found so far (whole nodes, token ranges and single tokens; all disjoint,
    since every subtree is handled at most once)."""

    def __init__(self, tree: AstTree, free: np.ndarray, opts: AstMaskingOptions,
                 rng: np.random.Generator):
        self.tree, self.free, self.opts, self.rng = tree, free, opts, rng
        cfree = np.concatenate(([0], free.cumsum()))
        self.node_free = cfree[tree.ends] - cfree[tree.starts]  # (n,) free tokens per node
        self.all_free = bool(free.all())
        self.stack, self.whole, self.range_starts, self.range_ends, self.points = [], [], [], [], []

    def run(self, budget: int) -> np.ndarray:
        stack, whole = self.stack, self.whole
        node_free, has_big_kid = self.node_free.tolist(), self.tree.has_big_kid.tolist()
        if budget > 0:
            stack.append((0, budget))
        while stack:
            i, k = stack.pop()
            if k >= node_free[i]:  # the whole subtree
                whole.append(i)
            elif has_big_kid[i]:
                self._split(i, k)
            else:
                self._flat(i, k)
        return self._mask()

    def _flat(self, i: int, k: int) -> None:
        """Leaf-only node: T5-style locality spans over its free tokens."""
        l, r = int(self.tree.starts[i]), int(self.tree.ends[i])
        n = int(self.node_free[i])
        s, e = flat_spans(n, k, self.opts.mask_multiple_length, self.rng)
        if n == r - l:  # no token taken before: spans map to token ranges directly
            self.range_starts.append(s + l)
            self.range_ends.append(e + l)
        else:
            self.points.append((np.flatnonzero(self.free[l:r]) + l)[ranges_to_indices(s, e)])

    def _split(self, i: int, k: int) -> None:
        """Spec section 5.5 at node ``i`` with share ``k`` below its free tokens: children whose
        hypergeometric share exceeds the node's threshold go on the stack, the rest is pooled
        and placed by :func:`arc_cover`. Only children with more free tokens than the
        threshold can get a big share, so only they are drawn individually (the others are
        lumped into one colour, which leaves the distribution unchanged)."""
        tree, rng = self.tree, self.rng
        kids = tree.children(i)
        kid_free = self.node_free[kids]
        own = tree.leaf_tokens(i)
        if not self.all_free:
            own = own[self.free[own]]
        if own.size == 0 and kids.size == 1:  # single child: it gets the whole share
            self.stack.append((int(kids[0]), k))
            return
        theta = int(rng.integers(self.opts.threshold_lb, self.opts.threshold_ub + 1))
        small, pool = kid_free > 0, k
        if k > theta:
            cand = (kid_free > theta).nonzero()[0]
            if cand.size:
                colors = np.append(kid_free[cand], self.node_free[i] - kid_free[cand].sum())
                share = rng.multivariate_hypergeometric(colors, k)[:-1]
                big = cand[share > theta]
                big_share = share[share > theta].tolist()
                self.stack.extend(zip(kids[big].tolist(), big_share))
                small[big] = False
                pool -= sum(big_share)
        if pool:
            self._arc(kids[small], kid_free[small], own, pool)

    def _arc(self, nodes: np.ndarray, node_sizes: np.ndarray, own: np.ndarray, pool: int) -> None:
        """Mask ``pool`` tokens of the pooled children (nodes, then single leaf tokens): units
        fully under the arc are masked whole, cut ones go on the stack with their part."""
        m = nodes.size
        sizes = np.concatenate((node_sizes, np.ones(own.size, dtype=np.int64))) if own.size \
            else node_sizes
        node_sizes, nodes_list, whole_own = node_sizes.tolist(), nodes.tolist(), []
        for j, c in arc_cover(sizes, pool, self.rng):
            if j >= m:
                whole_own.append(j - m)
            elif c == node_sizes[j]:
                self.whole.append(nodes_list[j])
            else:
                self.stack.append((nodes_list[j], c))
        if whole_own:
            self.points.append(own[whole_own])

    def _mask(self) -> np.ndarray:
        whole = np.asarray(self.whole, dtype=np.int64)
        starts = np.concatenate([self.tree.starts[whole]] + self.range_starts)
        ends = np.concatenate([self.tree.ends[whole]] + self.range_ends)
        edges = np.zeros(self.free.size + 1, dtype=np.int32)
        edges[starts] += 1  # disjoint ranges: starts distinct, ends distinct
        edges[ends] -= 1
        mask = edges[:-1].cumsum() > 0
        if self.points:
            mask[np.concatenate(self.points)] = True
        return mask & self.free


def subtree_mask(tree: AstTree, free: np.ndarray, budget: int, opts: AstMaskingOptions,
                 rng: np.random.Generator) -> np.ndarray:
    """Mask exactly ``budget`` free tokens along the AST (spec section 5.5).

    Starting at the root with the whole budget, every visited node either masks its whole
    subtree (share == its free tokens), spreads its share as locality spans (leaf-only node), or
    splits it among its children (:meth:`_SubtreeMasker._split`). Iterative, no recursion.

    Args:
        tree: the segment's AST index.
        free: (N,) bool, tokens that may still be masked (not taken by obfuscation / t2c).
        budget: tokens to mask, ``0 <= budget <= free.sum()``.
    Returns:
        (N,) bool, the newly masked tokens (``budget`` of them, all free).
    """
    return _SubtreeMasker(tree, free, opts, rng).run(int(budget))


def _premask(tree, content, budget, opts, cats, rng):
    """Mode choice and whole-unit masking (spec section 5.4).

    Returns:
        ``(mode, obf_starts, obf_ends, obf_group, t2c_mask)``.
    """
    empty = np.zeros(0, dtype=np.int64)
    no_t2c = np.zeros(content.size, dtype=bool)
    r = rng.random()
    if r < opts.obfuscation_prob:
        s, e, g = identifier_occurrences(tree, content, cats.identifier)
        keep = choose_identifier_groups(s, e, g, int(round(budget * opts.obfuscation_ratio)), rng)
        return "obfuscation", s[keep], e[keep], g[keep], no_t2c
    if r < opts.obfuscation_prob + opts.t2c_prob and cats.supports_t2c:
        s, e = docstring_bodies(tree, cats)
        keep = choose_bodies(s, e, int(round(budget * opts.t2c_ratio)), rng)
        no_t2c[ranges_to_indices(s[keep], e[keep])] = True
        return "t2c", empty, empty, empty, no_t2c
    return "subtree", empty, empty, empty, no_t2c


def select_mask(tokens, ast_rows, opts: AstMaskingOptions, rng: np.random.Generator, *,
                sentinels: SentinelSpec, categories: NodeCategories) -> MaskSelection:
    """Choose the masked spans of one segment (spec sections 5.4-5.8).

    Args:
        tokens: (N + 1,) int segment item, content then ``</s>``; ids below the first sentinel.
        ast_rows: (n, 3) int rows ``(start, end, type_id)`` of the segment's AST (format in
            ``preprocess/formats.py``), or the flat (3n,) item.
        opts: masking options (validated once by the caller with ``opts.validate()``).
        rng: the sample's generator, e.g. ``sample_rng(seed, epoch, index)``.
        sentinels: vocabulary layout; categories: node-kind ids of the segment's language.
    Returns:
        A :class:`MaskSelection`; exactly ``round(N * mask_prob)`` tokens are masked unless
        spans beyond ``num_sentinels`` or ``opts.max_target_len`` had to be dropped.
    """
    tokens = np.asarray(tokens)
    sentinels.check_tokens(tokens)
    content = tokens[:-1].astype(np.int64)
    budget = int(round(content.size * opts.mask_prob))
    if content.size == 0:
        nothing = np.zeros(0, dtype=np.int64)
        return MaskSelection(np.zeros(0, dtype=bool), nothing, nothing, nothing, 0, "subtree")
    tree = AstTree(ast_rows, content.size)
    mode, os_, oe, og, t2c = _premask(tree, content, budget, opts, categories, rng)
    obf = np.zeros(content.size, dtype=bool)
    obf[ranges_to_indices(os_, oe)] = True
    taken = obf | t2c
    sub = subtree_mask(tree, ~taken, budget - int(taken.sum()), opts, rng) | t2c
    rs, re_ = mask_runs(sub)
    starts, ends = np.concatenate((rs, os_)), np.concatenate((re_, oe))
    keys = np.concatenate((np.arange(rs.size) + content.size, og))  # obf groups < N <= run keys
    if opts.dedup_spans:
        keys = content_groups(content, starts, ends)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    sentinel = first_appearance_ranks(keys[order])
    keep = fit_spans(starts, ends, sentinel, sentinels.num_sentinels, opts.max_target_len)
    if not keep.all():
        logger.debug("sentinel/target limits drop %d of %d spans", (~keep).sum(), keep.size)
        starts, ends, sentinel = starts[keep], ends[keep], sentinel[keep]
    mask = np.zeros(content.size, dtype=bool)
    mask[ranges_to_indices(starts, ends)] = True
    return MaskSelection(mask, starts, ends, sentinel, budget, mode)


def ast_span_corruption(tokens, ast_rows, opts: AstMaskingOptions, rng: np.random.Generator, *,
                        sentinels: SentinelSpec, categories: NodeCategories
                        ) -> Tuple[np.ndarray, np.ndarray]:
    """AST-aware span corruption of one segment: ``(source, target)``, int64, both ending with
    ``</s>`` (format in :mod:`ast_t5.data.sentinels`). Arguments as in :func:`select_mask`."""
    sel = select_mask(tokens, ast_rows, opts, rng, sentinels=sentinels, categories=categories)
    content = np.asarray(tokens)[:-1].astype(np.int64)
    return build_source_target(content, sel.starts, sel.ends, sel.sentinel, sentinels)
