"""Node-kind tables of the masking objectives against the installed tree-sitter grammars."""

import numpy as np
import pytest

from ast_t5.data.node_categories import (LANGUAGE_NODE_NAMES, NodeCategories, read_node_types)

GRAMMARS = {  # language -> (module, function returning the language pointer)
    "python": ("tree_sitter_python", "language"), "java": ("tree_sitter_java", "language"),
    "cpp": ("tree_sitter_cpp", "language"), "csharp": ("tree_sitter_c_sharp", "language"),
    "c": ("tree_sitter_c", "language"), "go": ("tree_sitter_go", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "rust": ("tree_sitter_rust", "language"),
}


def grammar_ids(language):
    """name -> ids of the named node kinds of an installed grammar (what node_types.txt holds)."""
    tree_sitter = pytest.importorskip("tree_sitter")
    module, fn = GRAMMARS[language]
    lang = tree_sitter.Language(getattr(pytest.importorskip(module), fn)())
    ids = {}
    for i in range(lang.node_kind_count):
        if lang.node_kind_is_named(i):
            ids.setdefault(lang.node_kind_for_id(i), []).append(i)
    return ids


def test_every_language_of_the_table_has_a_grammar():
    assert set(LANGUAGE_NODE_NAMES) == set(GRAMMARS)


def test_the_table_covers_every_preprocessed_code_language():
    languages = pytest.importorskip("ast_t5_preprocess.languages")
    assert set(LANGUAGE_NODE_NAMES) == set(languages.LANGUAGES) - {languages.TEXT}


@pytest.mark.parametrize("language", sorted(GRAMMARS))
def test_table_names_are_named_kinds_of_the_grammar(language):
    ids = grammar_ids(language)
    for role, names in LANGUAGE_NODE_NAMES[language].items():
        missing = [n for n in names if n not in ids]
        assert not missing, f"{language} {role}: {missing} are not named kinds of the grammar"
    cats = NodeCategories.from_type_ids(ids, language)
    assert cats.identifier.size >= len(LANGUAGE_NODE_NAMES[language]["identifier"])
    assert cats.supports_t2c == (language == "python")


def test_node_types_file_round_trip(tmp_path):
    ids = grammar_ids("python")
    path = tmp_path / "node_types.txt"
    lines = [f"{i}\t{name}\t1" for name, group in ids.items() for i in group]
    path.write_text("\n".join(lines + ["999\tidentifier\t0"]) + "\n", encoding="utf-8")
    cats = NodeCategories.from_node_types_file(str(path), "python")
    assert cats.identifier.tolist() == sorted(ids["identifier"])  # anonymous row 999 ignored
    assert cats.block.tolist() == sorted(ids["block"]) and len(ids["block"]) > 1


def test_bad_inputs_raise(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\tidentifier\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:1"):
        read_node_types(str(bad))
    assert NodeCategories.from_type_ids({"identifier": [7]}, "c_sharp").identifier.tolist() == [7]
    with pytest.raises(ValueError, match="no node-name table"):
        NodeCategories.from_type_ids({"identifier": [1]}, "cobol")
    with pytest.raises(ValueError, match="identifier kinds"):
        NodeCategories.from_type_ids({"block": [3]}, "java")
    cats = NodeCategories(identifier=np.array([3, 1, 3]))
    assert cats.identifier.tolist() == [1, 3] and not cats.supports_t2c
