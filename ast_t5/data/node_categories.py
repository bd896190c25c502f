"""Language-specific AST node categories used by the masking objectives (spec sections 5.6, 5.7).

The masking algorithms see node types only as integer ids (the grammar's kind ids, listed in each
language's ``node_types.txt`` as ``id<TAB>name<TAB>named``). This module turns the names in
:data:`LANGUAGE_NODE_NAMES` into id sets, so no algorithm contains a node-type string literal
(fixes B-2: the original knew Python names only and the plain ``identifier`` type only).
"""
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

# Leaf node kinds that name a program entity, per grammar (checked against the installed
# tree-sitter grammars by tests/ast_t5/test_mask_node_categories.py). Compound kinds such as
# scoped_identifier are left out: obfuscation masks whole leaf names.
_JS_IDENTIFIERS = ("identifier", "property_identifier", "shorthand_property_identifier",
                   "shorthand_property_identifier_pattern", "private_property_identifier",
                   "statement_identifier")
# Keys are the language names of the preprocessed data (``ast_t5_preprocess.languages``).
IDENTIFIER_NAMES: Mapping[str, Tuple[str, ...]] = {
    "python": ("identifier",),
    "java": ("identifier", "type_identifier"),
    "cpp": ("identifier", "field_identifier", "type_identifier", "namespace_identifier",
            "statement_identifier"),
    "csharp": ("identifier",),
    "c": ("identifier", "field_identifier", "type_identifier", "statement_identifier"),
    "go": ("identifier", "field_identifier", "type_identifier", "package_identifier",
           "label_name"),
    "javascript": _JS_IDENTIFIERS,
    "typescript": _JS_IDENTIFIERS + ("type_identifier",),
    "tsx": _JS_IDENTIFIERS + ("type_identifier",),
    "rust": ("identifier", "field_identifier", "type_identifier", "shorthand_field_identifier"),
}

# Docstring rule of the text-to-code mode (spec section 5.7): a function_definition whose block
# starts with an expression_statement that is exactly one string. Python only, as in the paper.
T2C_ROLES = ("function_definition", "block", "expression_statement", "string")
T2C_NAMES: Mapping[str, Mapping[str, Tuple[str, ...]]] = {
    "python": {role: (role,) for role in T2C_ROLES},
}

LANGUAGE_NODE_NAMES: Mapping[str, Mapping[str, Tuple[str, ...]]] = {
    lang: {"identifier": ids, **T2C_NAMES.get(lang, {})} for lang, ids in IDENTIFIER_NAMES.items()
}

LANGUAGE_ALIASES: Mapping[str, str] = {"c_sharp": "csharp"}  # the grammar package's spelling

_EMPTY = np.zeros(0, dtype=np.int64)


def read_node_types(path: str) -> Dict[str, List[int]]:
    """Named node kinds of a ``node_types.txt`` file: name -> list of ids (a name can have several).

    Raises ValueError with the file and line number on a malformed line.
    """
    by_name: Dict[str, List[int]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("0", "1"):
                raise ValueError(f"{path}:{lineno}: expected 'id<TAB>name<TAB>0|1', got {line!r}")
            if parts[2] == "1":
                by_name.setdefault(parts[1], []).append(int(parts[0]))
    return by_name


@dataclass(frozen=True, eq=False)
class NodeCategories:
    """Node-type id sets of one language (sorted unique int64 arrays; empty = none).

    Attributes:
        identifier: leaf name kinds; their occurrences can be obfuscated (spec section 5.6).
        function_definition, block, expression_statement, string: the docstring rule of the
            text-to-code mode (spec section 5.7); all empty where the language has no rule.
    """

    identifier: np.ndarray = field(default_factory=lambda: _EMPTY)
    function_definition: np.ndarray = field(default_factory=lambda: _EMPTY)
    block: np.ndarray = field(default_factory=lambda: _EMPTY)
    expression_statement: np.ndarray = field(default_factory=lambda: _EMPTY)
    string: np.ndarray = field(default_factory=lambda: _EMPTY)

    def __post_init__(self):
        for name in ("identifier",) + T2C_ROLES:
            ids = np.unique(np.asarray(getattr(self, name), dtype=np.int64))
            object.__setattr__(self, name, ids)

    @property
    def supports_t2c(self) -> bool:
        """Whether every docstring role has at least one id (else t2c samples mask normally)."""
        return all(getattr(self, role).size for role in T2C_ROLES)

    @classmethod
    def from_type_ids(cls, ids_by_name: Mapping[str, Sequence[int]], language: str,
                      table: Mapping[str, Mapping[str, Tuple[str, ...]]] = LANGUAGE_NODE_NAMES
                      ) -> "NodeCategories":
        """Build the categories of ``language`` from a name -> ids map of its node types.

        Raises ValueError for an unknown language or when none of its identifier names exists
        (a sign that the node-type file belongs to another grammar).
        """
        language = LANGUAGE_ALIASES.get(language, language)
        if language not in table:
            raise ValueError(f"no node-name table for language {language!r}; "
                             f"known: {sorted(table)}")
        roles = {}
        for role, names in table[language].items():
            roles[role] = [i for name in names for i in ids_by_name.get(name, ())]
        if not roles.get("identifier"):
            raise ValueError(f"{language}: none of the identifier kinds "
                             f"{table[language].get('identifier')} is in the node types")
        cats = cls(**roles)
        if language in T2C_NAMES and not cats.supports_t2c:
            logger.warning("%s: docstring node kinds missing; text-to-code mode disabled", language)
        return cats

    @classmethod
    def from_node_types_file(cls, path: str, language: str) -> "NodeCategories":
        """Read ``<lang>/node_types.txt`` and build the categories of ``language``."""
        return cls.from_type_ids(read_node_types(path), language)
