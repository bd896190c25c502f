"""Tests of ast_t5_preprocess.parsing and languages: grammars, byte offsets, errors, deep trees."""
import numpy as np
import pytest

from ast_t5_preprocess.languages import LANGUAGES, TEXT, language_from_path, load_grammar, normalize_language
from ast_t5_preprocess.parsing import ERROR_TYPE_NAME, CodeParser, node_type_names

from ..conftest import bundled_corpus_dir


@pytest.mark.parametrize("lang", [l for l in LANGUAGES if l != TEXT])
def test_every_grammar_parses_its_sample(lang):
    import os

    parser = CodeParser(lang)
    names = node_type_names(parser.grammar)
    assert names[parser.error_type_id] == ERROR_TYPE_NAME
    samples = {"tsx": "const a = <div>{x}</div>;\n", "python": "def f(x):\n    return [x, 'é']\n"}
    ext = {"typescript": "typescript", "tsx": None}.get(lang, lang)
    folder = os.path.join(bundled_corpus_dir(), ext) if ext else None
    if folder and os.path.isdir(folder):
        src = open(os.path.join(folder, sorted(os.listdir(folder))[0]), "rb").read()
    else:
        src = samples[lang].encode()
    parsed = parser.parse(src)
    assert parsed.error_ratio == 0, lang
    assert parsed.kinds.max() < len(names)
    assert np.all(parsed.starts[1:] >= parsed.starts[:-1])  # pre-order


def test_offsets_are_utf8_bytes():
    parsed = CodeParser("python").parse('x = "é"\n'.encode())
    names = node_type_names(CodeParser("python").grammar)
    string = [i for i, k in enumerate(parsed.kinds) if names[k] == "string"][0]
    assert (parsed.starts[string], parsed.ends[string]) == (4, 8)  # 7 characters, 8 bytes


def test_errors_are_measured():
    parser = CodeParser("python")
    good = parser.parse(b"def f(x):\n    return x\n")
    bad = parser.parse(b"def f(:\n  return 1\n")
    worse = parser.parse(b"))))((((\x01 ??? ]]] def def class (\n" * 3)
    assert good.error_ratio == 0 and not good.has_error
    assert 0 < bad.error_ratio < worse.error_ratio <= 1
    assert parser.error_type_id in worse.kinds


def test_deep_nesting_does_not_recurse():
    depth = 100_000
    src = b"x = " + b"(" * depth + b"1" + b")" * depth + b"\n"
    parsed = CodeParser("python").parse(src)
    assert len(parsed.starts) > depth  # every parenthesized expression became a node


def test_language_tables():
    assert language_from_path("a/b/C.JAVA") == "java"
    assert language_from_path("x.h") == "c" and language_from_path("x.hpp") == "cpp"
    assert language_from_path("notes.md") == TEXT and language_from_path("x.bin") is None
    assert normalize_language("C++") == "cpp" and normalize_language("C#") == "csharp"
    assert normalize_language("Markdown") == TEXT and normalize_language("cobol") is None
    with pytest.raises(ValueError):
        load_grammar(TEXT)
