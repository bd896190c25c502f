"""Tests of ast_t5_preprocess.inputs and decontamination: discovery, skip reasons, JSONL."""
import json

import pytest

from ast_t5_preprocess.decontamination import Decontaminator
from ast_t5_preprocess.inputs import ReadLimits, iter_documents, read_document


def _read(doc, **kw):
    return read_document(doc, ReadLimits(**kw))[2]


def test_skip_reasons(tmp_path):
    files = {
        "ok.py": b"x = 1\n",
        "bin.py": b"x = 1\x00\x01\x02",
        "latin1.py": "x = 'é'\n".encode("latin-1"),
        "empty.py": b"",
        "blank.py": b"  \n\t\n",
        "big.py": b"x = 1\n" * 400,
        "minified.js": b"var a=1;" * 200,
        "notes.unknownext": b"whatever",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    docs = {d.key.split("/")[-1]: d for d in iter_documents([str(tmp_path)])}
    assert docs["notes.unknownext"].skip == "unknown_extension"  # counted, never read
    reasons = {name: _read(doc, max_file_bytes=2000) for name, doc in docs.items()}
    assert reasons == {"ok.py": None, "notes.unknownext": "unknown_extension", "bin.py": "binary", "latin1.py": "invalid_utf8",
                       "empty.py": "empty", "blank.py": "empty", "big.py": "too_large",
                       "minified.js": "long_lines"}


def test_directory_walk_is_sorted_and_location_independent(tmp_path):
    for rel in ["b/z.py", "a/y.py", "a/x.py", ".git/h.py", "site-packages/s.py"]:
        (tmp_path / "proj" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "proj" / rel).write_text("pass\n")
    keys = [d.key for d in iter_documents([str(tmp_path / "proj")], exclude_dirs=["site-packages"])]
    assert keys == ["proj/a/x.py", "proj/a/y.py", "proj/b/z.py"]


def test_jsonl_records(tmp_path):
    path = tmp_path / "stack.jsonl"
    lines = [
        json.dumps({"content": "def f():\n    pass\n", "max_stars_repo_path": "r/a.py", "lang": "Python"}),
        json.dumps({"content": "int main(){}\n", "path": "r/b.unknown", "language": "C++"}),
        json.dumps({"content": "x", "path": "r/c.zzz"}),  # no language anywhere
        "{not json",
        json.dumps({"path": "r/d.py"}),  # no content
        json.dumps({"content": "s = '\ud800'\n", "path": "r/e.py"}),  # lone surrogate
        "",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    docs = list(iter_documents([str(path)]))
    assert [(d.key, d.language) for d in docs[:2]] == [("r/a.py", "python"), ("r/b.unknown", "cpp")]
    assert [_read(d) for d in docs] == [None, None, "unknown_language", "bad_jsonl_record",
                                        "bad_jsonl_record", "invalid_utf8"]


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found"):
        list(iter_documents([str(tmp_path / "nope")]))


def test_decontamination_by_13_grams():
    bench = "def add(a, b):\n    \"\"\"Return the sum of a and b, the two numbers given to us here.\"\"\"\n"
    d = Decontaminator([bench])
    assert d.contaminated("# copied\n" + bench + "print(add(1, 2))\n")
    assert not d.contaminated("def add(a, b):\n    return a + b\n")
