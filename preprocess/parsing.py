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
  as flat text.
"""
import enum
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from .languages import load_grammar

# tree-sitter reports ERROR nodes with this kind id (the maximum uint16 symbol).
TS_ERROR_KIND = 0xFFFF
ERROR_TYPE_NAME = "ERROR"


class ErrorPolicy(str, enum.Enum):
    SKIP = "skip"
    KEEP = "keep"
    FLAT = "flat"


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

    def parse(self, source: bytes) -> ParsedFile:
        tree = self.parser.parse(source)
        starts, ends, kinds, error_bytes = _collect_named_nodes(tree)
        kinds_arr = np.asarray(kinds, dtype=np.int64)
        kinds_arr[kinds_arr == TS_ERROR_KIND] = self.error_type_id
        ratio = min(1.0, error_bytes / max(1, len(source)))
        return ParsedFile(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                          kinds_arr.astype(np.int32), ratio)


def _collect_named_nodes(tree):
    """Pre-order walk with a cursor; returns named nodes and the error byte count."""
    if not tree.root_node.has_error:  # the common case: no error bookkeeping per node
        return _walk_clean(tree.walk()) + (0,)
    return _walk_with_errors(tree.walk())


def _walk_clean(cursor):
    starts: List[int] = []
    ends: List[int] = []
    kinds: List[int] = []
    while True:
        node = cursor.node
        if node.is_named:
            starts.append(node.start_byte)
            ends.append(node.end_byte)
            kinds.append(node.kind_id)
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return starts, ends, kinds


def _walk_with_errors(cursor):
    starts: List[int] = []
    ends: List[int] = []
    kinds: List[int] = []
    error_bytes = 0
    error_until = -1  # end of the outermost ERROR node we are inside, to avoid double counting
    while True:
        node = cursor.node
        if node.is_named:
            s, e = node.start_byte, node.end_byte
            starts.append(s)
            ends.append(e)
            kinds.append(node.kind_id)
            if node.is_error and s >= error_until:
                error_bytes += e - s
                error_until = e
        if node.is_missing:
            error_bytes += 1
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return starts, ends, kinds, error_bytes


def parsers_for(languages) -> Dict[str, CodeParser]:
    return {lang: CodeParser(lang) for lang in languages}
