"""Parse source bytes with tree-sitter into flat arrays of named AST nodes.

Traversal uses a ``TreeCursor`` loop, never recursion, so arbitrarily deep trees (a 100k-deep
nested expression) are fine. Offsets are UTF-8 byte offsets throughout.

Error policy (one place, counted by the caller): tree-sitter never rejects input; it returns a
tree with ``ERROR``/``MISSING`` nodes. The *error ratio* of a file is the share of its bytes
covered by ``ERROR`` nodes, with every ``MISSING`` node counted as one byte. Files whose ratio is
at most ``max_error_ratio`` are kept as parsed. Files above it are handled by ``ErrorPolicy``:

* ``skip`` (default): the file is dropped and counted as ``parse_errors``;
* ``keep``: the tree is used as is (``ERROR`` nodes become ordinary nodes of type ``ERROR``);
* ``flat``: the tokens are kept but the AST is reduced to the root, so masking treats the file
  as flat text;
* ``spans`` (default): ``ERROR`` nodes are dropped and every valid subtree around or inside them
  is kept, so an error region is a flat span (covered by no node) for masking. The error ratio
  then counts only the bytes of ``ERROR`` regions that no valid subtree covers, and the file is
  skipped only above its language's threshold (:data:`DEFAULT_MAX_ERROR_RATIO`, measured on real
  headers: ``benchmarks/measure_headers.py``).

C and C++ headers are macro-heavy (``__BEGIN_DECLS``, ``__THROW``, ``__attribute__((...))``,
``_GLIBCXX_VISIBILITY(default)``): when a C/C++ file has errors, well-known declaration macros
are blanked out (replaced by spaces, so every byte offset stays the same) and the file is parsed
again; the better parse wins (:func:`neutralize_macros`).

Trees deeper than ``max_depth`` (levels of the tree, anonymous nodes included) are cut there and the cut subtrees counted, so the
AST rows stored per token stay bounded on pathological input (260,000 nested parentheses).
"""
import enum
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from .languages import load_grammar

# tree-sitter reports ERROR nodes with this kind id (the maximum uint16 symbol).
TS_ERROR_KIND = 0xFFFF
ERROR_TYPE_NAME = "ERROR"


class ErrorPolicy(str, enum.Enum):
    SKIP = "skip"
    KEEP = "keep"
    FLAT = "flat"
    SPANS = "spans"


# Skip threshold per language for the ``spans`` policy: the share of a file's bytes in ERROR
# regions that no valid subtree covers. C and C++ come from benchmarks/measure_headers.py on
# /usr/include (164 C headers) and libstdc++ 12 (783 files): after the header measures the worst
# file is at 0.075 (C) and 0.088 (C++), so 0.2 keeps them all with a 2x margin (BENCHMARKS.md,
# "Corpus pipeline at size"). Other languages keep the strict 0.05 (real code rarely errs).
DEFAULT_MAX_ERROR_RATIO: Dict[str, float] = {"c": 0.2, "cpp": 0.2}
FALLBACK_MAX_ERROR_RATIO = 0.05
DEFAULT_MAX_AST_DEPTH = 256  # cursor depth; real code stays far below (see test_parsing.py)


def max_error_ratio_for(language: str, override: Optional[float] = None) -> float:
    if override is not None:
        return override
    return DEFAULT_MAX_ERROR_RATIO.get(language, FALLBACK_MAX_ERROR_RATIO)


@dataclass
class ParsedFile:
    """Named nodes of one file in pre-order (the root first).

    Attributes:
        starts, ends: (num_nodes,) int64 byte offsets, end exclusive.
        kinds: (num_nodes,) int32 node-type ids (see :func:`node_type_names`).
        error_ratio: share of bytes under ERROR nodes (+1 byte per MISSING node).
    """
    starts: np.ndarray
    ends: np.ndarray
    kinds: np.ndarray
    error_ratio: float
    depth_cut: int = 0  # subtrees not stored because they were deeper than max_depth

    @property
    def has_error(self) -> bool:
        return self.error_ratio > 0


def node_type_names(grammar) -> List[str]:
    """Node-type vocabulary of a grammar: its symbol names by id, then ``ERROR``."""
    names = [grammar.node_kind_for_id(i) or f"<symbol_{i}>" for i in range(grammar.node_kind_count)]
    return names + [ERROR_TYPE_NAME]


def node_type_named(grammar) -> List[bool]:
    return [bool(grammar.node_kind_is_named(i)) for i in range(grammar.node_kind_count)] + [True]


class CodeParser:
    """A tree-sitter parser for one language; one instance per worker process."""

    def __init__(self, language: str):
        from tree_sitter import Parser

        self.language = language
        self.grammar = load_grammar(language)
        self.parser = Parser(self.grammar)
        self.error_type_id = self.grammar.node_kind_count  # ERROR's id in our vocabulary

    def parse(self, source: bytes, max_depth: Optional[int] = None,
              error_spans: bool = False) -> ParsedFile:
        """Parse ``source``.

        Args:
            max_depth: store no node deeper than this cursor depth (None: no limit).
            error_spans: drop ERROR nodes, keep every other named node, and measure only the
                ERROR bytes that no valid subtree covers (the ``spans`` policy). For C and C++
                files with errors, the parse of :func:`neutralize_macros` is tried too.
        """
        parsed = self._parse_once(source, max_depth, error_spans)
        if parsed.has_error and self.language in MACRO_LANGUAGES:
            blanked = neutralize_macros(source)
            if blanked != source:
                second = self._parse_once(blanked, max_depth, error_spans)
                if second.error_ratio < parsed.error_ratio:
                    parsed = second
        return parsed

    def _parse_once(self, source: bytes, max_depth: Optional[int], error_spans: bool) -> ParsedFile:
        tree = self.parser.parse(source)
        limit = max_depth if max_depth is not None else 1 << 62
        if not tree.root_node.has_error:
            starts, ends, kinds, cut = _walk_clean(tree.walk(), limit)
            error_bytes = 0
        else:
            starts, ends, kinds, error_bytes, cut = _walk_with_errors(tree.walk(), limit, error_spans)
        kinds_arr = np.asarray(kinds, dtype=np.int64)
        kinds_arr[kinds_arr == TS_ERROR_KIND] = self.error_type_id
        ratio = min(1.0, error_bytes / max(1, len(source)))
        return ParsedFile(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                          kinds_arr.astype(np.int32), ratio, cut)


def _walk_clean(cursor, max_depth: int):
    """Pre-order walk of a tree without errors; returns named nodes and the cut subtree count."""
    starts: List[int] = []
    ends: List[int] = []
    kinds: List[int] = []
    cut = depth = 0  # our own depth count: TreeCursor.depth costs O(depth) per call
    while True:
        node = cursor.node
        if node.is_named:
            starts.append(node.start_byte)
            ends.append(node.end_byte)
            kinds.append(node.kind_id)
        if depth < max_depth:
            if cursor.goto_first_child():
                depth += 1
                continue
        elif node.child_count:
            cut += 1
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return starts, ends, kinds, cut
            depth -= 1


def _walk_with_errors(cursor, max_depth: int, error_spans: bool):
    """Like :func:`_walk_clean`, measuring ERROR bytes (see :meth:`CodeParser.parse`)."""
    starts: List[int] = []
    ends: List[int] = []
    kinds: List[int] = []
    error_bytes = 0
    cut = depth = 0
    error_until = -1  # end of the outermost ERROR node we are inside, to avoid double counting
    error_start = -1
    covered_until = -1  # inside an ERROR: end of the outermost valid subtree we are inside
    while True:
        node = cursor.node
        s, e = node.start_byte, node.end_byte
        if s >= error_until and error_until >= 0:  # left the ERROR region
            error_until = -1
        if node.is_error:
            if error_until < 0:
                error_until, error_start, covered_until = e, s, s
                error_bytes += e - s
            if not error_spans:
                starts.append(s)
                ends.append(e)
                kinds.append(node.kind_id)
        elif node.is_named:
            starts.append(s)
            ends.append(e)
            kinds.append(node.kind_id)
            if error_spans and error_until >= 0 and not node.has_error and s >= covered_until:
                error_bytes -= min(e, error_until) - max(s, error_start)  # a valid subtree
                covered_until = e
        if node.is_missing:
            error_bytes += 1
        if depth < max_depth:
            if cursor.goto_first_child():
                depth += 1
                continue
        elif node.child_count:
            cut += 1
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return starts, ends, kinds, max(0, error_bytes), cut
            depth -= 1


# Declaration macros of glibc and libstdc++ that tree-sitter cannot know, blanked before a second
# parse. Each name may be followed by a balanced parenthesized argument list, blanked too.
MACRO_LANGUAGES = ("c", "cpp")
_MACRO_NAMES = re.compile(
    rb"\b(?:__BEGIN_DECLS|__END_DECLS|__BEGIN_NAMESPACE_\w+|__END_NAMESPACE_\w+|__USING_NAMESPACE_\w+"
    rb"|__THROW\w*|__wur|__nonnull|__attribute__|__attribute_\w+__|__attr_\w+|__fortified_attr_\w+"
    rb"|__LEAF(?:_ATTR)?|__COLD|__nothrow|__extension__|__restrict|__inline|__asm__|__asm"
    rb"|__MALLOC_\w+|__errordecl|__warnattr|__REDIRECT_\w*NTH\w*|__flexarr"
    rb"|_GLIBCXX\w*_(?:VISIBILITY|BEGIN_\w+|END_\w+|NOEXCEPT\w*|USE_NOEXCEPT|CONSTEXPR|NODISCARD"
    rb"|THROW\w*|NOTHROW|DEPRECATED\w*|PURE|CONST|ABI_TAG_CXX11|INLINE_VERSION|ALWAYS_INLINE"
    rb"|VISIBILITY|TXN_SAFE\w*|NORETURN|EXTERN_TEMPLATE\w*))\b")


def neutralize_macros(source: bytes) -> bytes:
    """Blank well-known declaration macros (and their argument lists) outside ``#`` lines.

    Every blanked byte becomes a space (newlines are kept), so byte offsets do not move and the
    AST found on the result applies to the original bytes.
    """
    out = bytearray(source)
    n = len(source)
    for m in _MACRO_NAMES.finditer(source):
        a, b = m.start(), m.end()
        line_start = source.rfind(b"\n", 0, a) + 1
        if source[line_start:a].lstrip().startswith(b"#"):
            continue  # a preprocessor line: #if _GLIBCXX_USE_NOEXCEPT ... stays as written
        j = b
        while j < n and source[j] in b" \t":
            j += 1
        if j < n and source[j] == 0x28:  # "(": blank the balanced argument list
            depth, k = 0, j
            while k < n:
                c = source[k]
                depth += (c == 0x28) - (c == 0x29)
                k += 1
                if depth == 0:
                    break
            if depth == 0:
                b = k
        for k in range(a, b):
            if out[k] != 0x0A:
                out[k] = 0x20
    return bytes(out)


def parsers_for(languages) -> Dict[str, CodeParser]:
    return {lang: CodeParser(lang) for lang in languages}
