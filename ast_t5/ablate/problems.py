"""Held-out problems, built once from the ``test`` split and a seed, identical for every arm.

* Masked-subtree infilling: one whole AST node per problem is replaced by ``<extra_id_0>``; the
  model must generate it. Nodes are grouped by category (from the grammar's node-type names,
  see :func:`node_category`): identifier/expression, statement, block, function body.
* Random-span infilling: T5 span corruption of a window of a test segment (several holes).
* Downstream: Python functions with a docstring; the source is the signature and docstring, the
  target the rest of the body (:func:`docstring_functions`).
"""
import ast as python_ast
import logging
import os
import textwrap
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import numpy as np

from ..data.loading import TEXT_LANGUAGE, available_languages, count_node_types, load_language_split
from ..data.node_categories import IDENTIFIER_NAMES, LANGUAGE_ALIASES
from ..data.sentinels import SentinelSpec
from ..data.t5_span_masking import t5_span_corruption

logger = logging.getLogger(__name__)

CATEGORIES = ("identifier/expression", "statement", "block", "function body")
# Block-like kinds across the grammars; a block directly under a function-like node is its body.
BLOCK_NAMES = {"block", "compound_statement", "statement_block", "constructor_body"}
FUNCTION_NAME_PARTS = ("function", "method", "constructor", "lambda")
EXPRESSION_NAMES = {"call", "attribute", "subscript", "binary_operator", "comparison_operator",
                    "boolean_operator", "unary_operator", "not_operator", "argument_list",
                    "arguments", "conditional_expression", "list", "dictionary", "tuple",
                    "field_expression", "member_expression", "call_expression",
                    "method_invocation", "field_access", "object_creation_expression",
                    "invocation_expression", "selector_expression"}
LEAF_EXCLUDED = {"string", "integer", "float", "true", "false", "none", "comment"}


def node_category(name: str, parent: Optional[str], language: str) -> Optional[str]:
    """Category of a named node kind (None: not used for problems)."""
    ids = IDENTIFIER_NAMES.get(LANGUAGE_ALIASES.get(language, language), ())
    if name in BLOCK_NAMES:
        if parent and any(part in parent for part in FUNCTION_NAME_PARTS):
            return "function body"
        return "block"
    if name in ids or name in EXPRESSION_NAMES or name.endswith("expression"):
        return "identifier/expression"
    if name.endswith("statement") or name.endswith("_declaration") and "function" not in name \
            and "method" not in name and "class" not in name:
        return "statement"
    return None


def read_type_names(path: str) -> Dict[int, str]:
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3 and parts[0].isdigit():
                names[int(parts[0])] = parts[1]
    return names


def code_languages(data_dir: str) -> List[str]:
    return [l for l in available_languages(data_dir, "") if l != TEXT_LANGUAGE]


def load_split(data_dir: str, lang: str, split: str):
    return load_language_split(data_dir, lang, split, count_node_types(data_dir, lang), check="none")


@dataclass
class InfillProblem:
    kind: str  # "subtree" or "random_span"
    language: str
    category: str
    segment: int
    source: List[int]  # ends with </s>
    target: List[int]  # "<extra_id_0> span <extra_id_1> span ... </s>"

    def to_json(self) -> dict:
        return asdict(self)


def subtree_candidates(tokens: np.ndarray, rows: np.ndarray, names: Dict[int, str], language: str,
                       max_len: int):
    """(start, end, category) of every node of one segment that can be a problem."""
    n = len(tokens) - 1  # without </s>
    out, stack = [], []  # stack of (end, name)
    for start, end, kind in rows[1:].tolist():  # row 0 is the segment's root
        while stack and start >= stack[-1][0]:
            stack.pop()
        name = names.get(kind, "")
        parent = stack[-1][1] if stack else None
        stack.append((end, name))
        if not 1 <= end - start <= max_len or end > n or name in LEAF_EXCLUDED:
            continue
        cat = node_category(name, parent, language)
        if cat is not None:
            out.append((start, end, cat))
    return out


def scan_order(n: int, seed: int, tag: int, limit: int) -> List[int]:
    """A seeded order of at most ``limit`` of ``n`` segments (bounded work on big splits)."""
    order = np.random.default_rng([seed, tag, 0x5CA]).permutation(n)[:limit]
    return sorted(order.tolist())


def subtree_problems(data_dir: str, sentinels: SentinelSpec, seed: int, per_category: int,
                     max_len: int, split: str = "test", max_segments: int = 5000) -> List[InfillProblem]:
    """Up to ``per_category`` problems per (language, category), drawn with ``seed`` from the
    nodes of at most ``max_segments`` segments of each language."""
    problems = []
    hole = int(sentinels.sentinel_id(0))
    for li, lang in enumerate(code_languages(data_dir)):
        loaded = load_split(data_dir, lang, split)
        if loaded is None:
            continue
        tokens, asts = loaded
        names = read_type_names(os.path.join(data_dir, lang, "node_types.txt"))
        by_cat: Dict[str, list] = {c: [] for c in CATEGORIES}
        for i in scan_order(len(tokens), seed, li, max_segments):
            toks = tokens[i].numpy().astype(np.int64)
            rows = asts[i].numpy().reshape(-1, 3)
            for start, end, cat in subtree_candidates(toks, rows, names, lang, max_len):
                by_cat[cat].append((i, start, end))
        for ci, cat in enumerate(CATEGORIES):
            cands = by_cat[cat]
            if not cands:
                continue
            rng = np.random.default_rng([seed, li, ci, 0x5B7])
            pick = rng.choice(len(cands), min(per_category, len(cands)), replace=False)
            for j in sorted(pick.tolist()):
                i, start, end = cands[j]
                toks = tokens[i].numpy().astype(np.int64).tolist()
                problems.append(InfillProblem("subtree", lang, cat, i, toks[:start] + [hole] + toks[end:],
                                              [hole] + toks[start:end] + [sentinels.eos]))
    return problems


def random_span_problems(data_dir: str, sentinels: SentinelSpec, seed: int, count: int,
                         window: int, noise_density: float, mean_span_length: float,
                         split: str = "test") -> List[InfillProblem]:
    """Up to ``count`` problems per language: T5 span corruption of a random window."""
    problems = []
    for li, lang in enumerate(code_languages(data_dir)):
        loaded = load_split(data_dir, lang, split)
        if loaded is None:
            continue
        tokens, _ = loaded
        usable = [i for i in range(len(tokens)) if int(tokens.sizes[i]) > 8]
        if not usable:
            continue
        rng = np.random.default_rng([seed, li, 0x7A5])
        for i in sorted(rng.choice(len(usable), min(count, len(usable)), replace=False).tolist()):
            seg = tokens[usable[i]].numpy().astype(np.int64)[:-1]
            start = int(rng.integers(0, max(1, len(seg) - window + 1)))
            item = np.concatenate([seg[start:start + window], [sentinels.eos]])
            src, tgt = t5_span_corruption(item, noise_density, mean_span_length, rng,
                                          sentinels=sentinels)
            problems.append(InfillProblem("random_span", lang, "random spans", usable[i],
                                          src.tolist(), tgt.tolist()))
    return problems


def _function_pieces(text: str):
    """(signature + docstring, rest of the body) of a Python function's source, or None."""
    text = textwrap.dedent(text)
    try:
        tree = python_ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], (python_ast.FunctionDef,
                                                            python_ast.AsyncFunctionDef)):
        return None
    fn = tree.body[0]
    if python_ast.get_docstring(fn) is None or len(fn.body) < 2:
        return None
    lines = text.splitlines(keepends=True)
    cut = fn.body[0].end_lineno
    source, target = "".join(lines[:cut]), "".join(lines[cut:])
    if not target.strip():
        return None
    return source, target


def docstring_functions(data_dir: str, split: str, codec, limit: int, max_body_tokens: int,
                        seed: int, max_source_tokens: int = 256) -> List[dict]:
    """Up to ``limit`` Python functions of ``split`` with a docstring, segments visited in a
    seeded order: {"source", "target", "segment"}.

    Functions are found in the AST side channel (``function_definition`` nodes), decoded from
    the segment's tokens with the indentation of their line, and kept when they parse on their
    own (so a function cut by segmentation is never used).
    """
    if "python" not in available_languages(data_dir, ""):
        return []
    loaded = load_split(data_dir, "python", split)
    if loaded is None:
        return []
    tokens, asts = loaded
    names = read_type_names(os.path.join(data_dir, "python", "node_types.txt"))
    fn_ids = {k for k, v in names.items() if v == "function_definition"}
    found, seen = [], set()
    for i in np.random.default_rng([seed, 0xD0C]).permutation(len(tokens)).tolist():
        if len(found) >= limit:
            break
        toks = tokens[i].numpy().astype(np.int64)[:-1].tolist()
        rows = asts[i].numpy().reshape(-1, 3)
        for start, end, kind in rows[1:].tolist():
            if kind not in fn_ids:
                continue
            prefix = codec.decode(toks[:start])
            line_start = prefix.rfind("\n") + 1
            indent = prefix[line_start:]
            if indent.strip():
                continue  # something else on the line before `def` (a decorator is fine: skipped)
            pieces = _function_pieces(indent + codec.decode(toks[start:end]))
            if pieces is None or pieces in seen:
                continue
            src, tgt = pieces
            if len(codec.encode(tgt)) > max_body_tokens or len(codec.encode(src)) > max_source_tokens:
                continue
            seen.add(pieces)
            found.append({"source": src, "target": tgt, "segment": i})
    return found[:limit]
