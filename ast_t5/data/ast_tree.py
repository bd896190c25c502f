"""Vectorized index over one segment's AST rows (spec section 5.3; DESIGN.md section 5.3).

The original built a pointer tree from open/close events with a per-event loop and assumed
well-formed input (B-6). Here the side-channel rows ``(start, end, type_id)`` (pre-order,
properly nested, row 0 = root over all content tokens; see ``preprocess/formats.py``) are
checked and indexed with a constant number of NumPy passes, so trees of any size or depth cost
no Python recursion and no per-node loop.
"""
import numpy as np

_RADIX_LIMIT = 1 << 16  # NumPy's stable argsort is a radix sort for 16-bit integer types


def _stable_argsort(values: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative ints (radix sort when they fit in 16 bits)."""
    if values.size and values.max() < _RADIX_LIMIT:
        values = values.astype(np.uint16)
    return np.argsort(values, kind="stable")


class AstTree:
    """Parent, depth, children and token-owner indices of one segment's AST.

    Attributes (n = number of nodes, N = number of content tokens):
        starts, ends, types: (n,) int64 node spans (end exclusive) and type ids.
        depth: (n,) int64, root = 0.
        parent: (n,) int64, parent[0] = -1.
        owner: (N,) int64, the deepest node covering each token; a token owned by node i and by
            no child of i is one of i's leaf children (the "gap" tokens of spec section 5.3).
        kid_order, kid_ptr, token_order, token_ptr: CSR indices behind :meth:`children` and
            :meth:`leaf_tokens`.
        has_big_kid: (n,) bool, whether a child spans more than one token (else the node is
            "leaf-only", spec section 5.5).
    """

    def __init__(self, rows: np.ndarray, num_tokens: int):
        """Index ``rows`` ((n, 3) ints, or the flat (3n,) item) of a segment with
        ``num_tokens`` content tokens. Raises ValueError (one line) if they are not a valid AST.
        """
        rows = np.asarray(rows)
        if rows.ndim == 1 and rows.size % 3 == 0:
            rows = rows.reshape(-1, 3)
        if rows.ndim != 2 or rows.shape[1] != 3 or rows.shape[0] == 0:
            raise ValueError(f"AST rows must be a non-empty (n, 3) array, got shape {rows.shape}")
        rows = rows.astype(np.int64, copy=False)
        self.starts, self.ends, self.types = rows[:, 0], rows[:, 1], rows[:, 2]
        self.num_tokens = int(num_tokens)
        self._check_spans()
        n = self.starts.size
        # Counts of node starts / ends at or before each position (0..N).
        self._starts_upto = np.bincount(self.starts, minlength=self.num_tokens + 1).cumsum()
        self._ends_upto = np.bincount(self.ends, minlength=self.num_tokens + 1).cumsum()
        # Node j is an ancestor of i iff j < i and ends[j] > starts[i]; every j with
        # ends[j] <= starts[i] precedes i, so depth = i - #{j : ends[j] <= starts[i]}.
        self.depth = np.arange(n) - self._ends_upto[self.starts]
        self.parent = self._parents()
        self.owner = self._token_owner()
        # CSR indices: children of i = kid_order[kid_ptr[i]:kid_ptr[i+1]] (source order), and
        # leaf tokens of i = token_order[token_ptr[i]:token_ptr[i+1]] (ascending).
        self.kid_order = _stable_argsort(self.parent[1:]) + 1
        self.kid_ptr = np.concatenate(([0], np.bincount(self.parent[1:], minlength=n).cumsum()))
        self.token_order = _stable_argsort(self.owner)
        self.token_ptr = np.concatenate(([0], np.bincount(self.owner, minlength=n).cumsum()))
        sizes = self.ends - self.starts
        self.has_big_kid = np.bincount(self.parent[1:][sizes[1:] > 1], minlength=n) > 0

    def _parents(self) -> np.ndarray:
        """Parent = nearest preceding node one level up; checks proper nesting on the way."""
        n = self.starts.size
        parent = np.full(n, -1, dtype=np.int64)
        if n == 1:
            return parent
        by_depth = _stable_argsort(self.depth)  # grouped by depth, pre-order inside
        keys = self.depth[by_depth] * n + by_depth
        i = np.arange(1, n)
        parent[1:] = by_depth[keys.searchsorted((self.depth[1:] - 1) * n + i) - 1]
        # The first crossing pair (j before i, overlapping without containment) always makes the
        # computed parent of i end before i does, so this check is complete.
        p = parent[1:]
        bad = np.flatnonzero((self.depth[p] != self.depth[1:] - 1) | (self.ends[1:] > self.ends[p]))
        if bad.size:
            raise ValueError(f"AST rows are not properly nested (row {bad[0] + 1} crosses an "
                             "earlier row)")
        return parent

    def _check_spans(self) -> None:
        s, e, n_tok = self.starts, self.ends, self.num_tokens
        if s[0] != 0 or e[0] != n_tok:
            raise ValueError(f"AST root spans [{s[0]}, {e[0]}), expected [0, {n_tok})")
        ds = s[1:] - s[:-1]
        if (ds < 0).any() or ((ds == 0) & (e[1:] > e[:-1])).any():
            raise ValueError("AST rows are not in pre-order (start ascending, end descending)")
        if (s >= e).any() or e.max() > n_tok:  # starts are >= s[0] = 0 by the order check
            raise ValueError(f"AST node span empty or outside [0, {n_tok})")

    def _token_owner(self) -> np.ndarray:
        """Deepest node covering each token: the innermost open node after the last event.

        The last open at or before t is node J (pre-order); the last close at or before t is the
        shallowest node C closing at the largest end <= t. Closes at a position precede opens
        there, so the owner is parent(C) if C closes after J opens, else J.
        """
        n = self.starts.size
        last_open = self._starts_upto[:-1] - 1
        close_order = np.argsort(self.ends * (n + 1) + (n - self.depth))  # end asc, depth desc
        c = self._ends_upto[:-1] - 1  # last close at or before t, as an index into close_order
        closed_later = (c >= 0) & (self.ends[close_order[c]] > self.starts[last_open])
        return np.where(closed_later, self.parent[close_order[c]], last_open)

    def children(self, i: int) -> np.ndarray:
        """Child node indices of node ``i`` in source order, (c,) int64."""
        return self.kid_order[self.kid_ptr[i]:self.kid_ptr[i + 1]]

    def leaf_tokens(self, i: int) -> np.ndarray:
        """Tokens owned by node ``i`` and by none of its children, ascending (t,) int64."""
        return self.token_order[self.token_ptr[i]:self.token_ptr[i + 1]]
