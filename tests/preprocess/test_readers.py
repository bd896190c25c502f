"""Readers of published corpus formats (generated data in the published schemas, no network):
Parquet as The Stack v1 ships it, .jsonl/.gz/.zst, datasets.save_to_disk folders; and hostile
inputs: named pipes, symlink loops, dangling symlinks, truncated streams, late NUL bytes."""
import gzip
import json
import os
import random

import pytest

from ast_t5_preprocess.inputs import ReadLimits, iter_documents, read_document
from ast_t5_preprocess.readers import Columns, CorpusFormatError

from ..conftest import STDLIB

# The Stack v1 per-file columns (a subset; the reader must ignore the others).
STACK_ROWS = [
    ("def f(x):\n    return x + 1\n", "src/a.py", "Python"),
    ("int main() { return 0; }\n", "src/b.cc", "C++"),
    ("class A { }\n", "src/c.cs", "C#"),
    ("let x: number = 1;\n", "src/d.ts", "TypeScript"),
    ("puts 1\n", "src/e.h", "Ruby"),  # a language we do not parse: not guessed from ".h"
    ("fn main() {}\n", "src/f.rs", None),  # no language: from the extension
    (None, "src/g.py", "Python"),  # null content
]
EXPECTED = [("src/a.py", "python", None), ("src/b.cc", "cpp", None), ("src/c.cs", "csharp", None),
            ("src/d.ts", "typescript", None), ("src/e.h", None, "unknown_language"),
            ("src/f.rs", "rust", None), ("src/g.py", None, "bad_record")]


def stack_table(rows=STACK_ROWS):
    import pyarrow as pa

    return pa.table({
        "hexsha": [f"{i:040x}" for i in range(len(rows))],
        "size": [len(r[0] or "") for r in rows],
        "content": [r[0] for r in rows],
        "max_stars_repo_path": [r[1] for r in rows],
        "max_stars_repo_name": ["org/repo"] * len(rows),
        "lang": [r[2] for r in rows],
        "avg_line_length": [10.0] * len(rows),
    })


def write_parquet(path, table, row_group_size=2):
    import pyarrow.parquet as pq

    pq.write_table(table, str(path), row_group_size=row_group_size)
    return path


def summary(docs):
    return [(d.key, d.language, read_document(d, ReadLimits())[2] if d.language else d.skip) for d in docs]


def test_parquet_stack_schema_by_row_group(tmp_path):
    import pyarrow.parquet as pq

    path = write_parquet(tmp_path / "train-00000-of-00001.parquet", stack_table())
    assert pq.ParquetFile(str(path)).num_row_groups == 4
    docs = list(iter_documents([str(path)]))
    assert summary(docs) == EXPECTED
    assert docs[0].origin.endswith("train-00000-of-00001.parquet#0")
    assert sum(d.src_bytes for d in docs) == os.path.getsize(path)  # progress adds up to the file


def test_parquet_column_flags_and_missing_content(tmp_path):
    import pyarrow as pa

    t = pa.table({"code": ["x = 1\n"], "file": ["a/x.py"], "language_name": ["Python"]})
    path = write_parquet(tmp_path / "custom.parquet", t)
    with pytest.raises(CorpusFormatError, match="no content column"):  # 'code' is a fallback,
        list(iter_documents([str(path)], columns=Columns(content="text")))  # but a flag is exact
    docs = list(iter_documents([str(path)], columns=Columns("code", "file", "language_name")))
    assert [(d.key, d.language, d.content) for d in docs] == [("a/x.py", "python", "x = 1\n")]
    with pytest.raises(CorpusFormatError, match="--path-column"):
        list(iter_documents([str(path)], columns=Columns(path="nope")))
    v2 = write_parquet(tmp_path / "v2.parquet", pa.table({"blob_id": ["ab" * 20], "path": ["a.py"],
                                                          "language": ["Python"]}))
    with pytest.raises(CorpusFormatError) as err:
        list(iter_documents([str(v2)]))
    msg = str(err.value)
    assert "\n" not in msg and "blob_id" in msg and "The Stack v2" in msg and "--content-column" in msg


def test_parquet_without_content_is_a_one_line_cli_error(tmp_path, capsys):
    import pyarrow as pa

    from ast_t5_preprocess.cli import main

    v2 = write_parquet(tmp_path / "v2.parquet", pa.table({"blob_id": ["ab" * 20], "path": ["a.py"]}))
    assert main(["run", str(v2), "-o", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "blob_id" in err and "Traceback" not in err


def _jsonl_lines(rows=STACK_ROWS):
    return "".join(json.dumps({"content": c, "max_stars_repo_path": p, "lang": l}) + "\n" for c, p, l in rows)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_formats_read_alike(tmp_path, suffix):
    import zstandard

    data = _jsonl_lines().encode()
    if suffix == ".jsonl.gz":
        data = gzip.compress(data)
    elif suffix == ".jsonl.zst":
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"part{suffix}"
    path.write_bytes(data)
    got = summary(iter_documents([str(path)]))
    # JSONL null content is a bad JSONL record (the Parquet reader's bad_record)
    assert got == EXPECTED[:-1] + [("part" + suffix + ":7", None, "bad_jsonl_record")]
    assert sum(d.src_bytes for d in iter_documents([str(path)])) == len(data)


def _many_records(n=400):
    rng = random.Random(0)
    return [(f"x_{i} = {rng.random()!r}\n" * 20, f"r/m{i}.py", "Python") for i in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_truncated_stream_keeps_records_before_the_damage(tmp_path, suffix):
    import zstandard

    raw = _jsonl_lines(_many_records()).encode()
    data = gzip.compress(raw) if suffix.endswith("gz") else zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(data[: len(data) * 2 // 3])
    docs = list(iter_documents([str(path)]))
    good, bad = docs[:-1], docs[-1]
    assert 100 < len(good) < 400 and all(d.skip is None for d in good)
    assert [d.key for d in good] == [f"r/m{i}.py" for i in range(len(good))]  # in order, no gap
    assert bad.skip == "corrupt_stream" and bad.file_path == str(path)
    # garbage after a valid gzip member / zstd frame, and a file that is not compressed at all
    (tmp_path / "junk.jsonl.zst").write_bytes(b"not zstd at all" * 10)
    assert [d.skip for d in iter_documents([str(tmp_path / "junk.jsonl.zst")])] == ["corrupt_stream"]


def write_saved_dataset(folder, table, num_files=2):
    """The layout of ``datasets.Dataset.save_to_disk``: Arrow IPC *stream* files
    ``data-0000i-of-0000N.arrow``, ``dataset_info.json`` and ``state.json`` listing the files."""
    import pyarrow as pa

    folder.mkdir(parents=True)
    names, per = [], -(-table.num_rows // num_files)
    for i in range(num_files):
        name = f"data-{i:05d}-of-{num_files:05d}.arrow"
        part = table.slice(i * per, per)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as w:
            for batch in part.to_batches(max_chunksize=2):
                w.write_batch(batch)
        names.append(name)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {c: {"dtype": "string", "_type": "Value"}
                                                                       for c in table.column_names}}))
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_fingerprint": "0" * 16, "_split": "train"}))


def test_save_to_disk_folder(tmp_path):
    write_saved_dataset(tmp_path / "ds", stack_table())
    assert summary(iter_documents([str(tmp_path / "ds")])) == EXPECTED
    # a DatasetDict (one folder per split) found by walking a directory, beside source files
    write_saved_dataset(tmp_path / "dd" / "train", stack_table(STACK_ROWS[:2]), num_files=1)
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (tmp_path / "dd" / "extra.py").write_text("y = 2\n")
    assert [d.key for d in iter_documents([str(tmp_path / "dd")])] == ["dd/extra.py", "src/a.py", "src/b.cc"]


def test_record_files_inside_a_directory(tmp_path):
    (tmp_path / "c" / "python").mkdir(parents=True)
    write_parquet(tmp_path / "c" / "python" / "train-0.parquet", stack_table(STACK_ROWS[:1]))
    (tmp_path / "c" / "part.jsonl.zst").write_bytes(__import__("zstandard").ZstdCompressor().compress(
        _jsonl_lines(STACK_ROWS[1:2]).encode()))
    assert [d.key for d in iter_documents([str(tmp_path / "c")])] == ["src/b.cc", "src/a.py"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_special_files_and_bad_symlinks_are_skipped_never_opened(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.py").write_text("x = 1\n")
    os.mkfifo(d / "pipe.py")
    os.mkfifo(d / "pipe.jsonl.gz")
    os.symlink("loop.py", d / "loop.py")
    os.symlink("missing.py", d / "dangling.py")
    os.symlink(str(d / "ok.py"), d / "link.py")  # a symlink to a regular file is fine
    os.symlink("/dev/zero", d / "zero.py")  # a device
    got = {d.key.split("/")[-1]: read_document(d, ReadLimits())[2] for d in iter_documents([str(d)])}
    assert got == {"dangling.py": "unreadable", "link.py": None, "loop.py": "unreadable",
                   "ok.py": None, "pipe.py": "special_file", "pipe.jsonl.gz": "special_file",
                   "zero.py": "special_file"}
    # given directly as inputs too
    assert [x.skip for x in iter_documents([str(d / "pipe.py"), str(d / "loop.py")])] == ["special_file", "unreadable"]


def test_nul_byte_anywhere_marks_binary():
    from ast_t5_preprocess.inputs import check_content

    late = b"x = 1\n" * 3000 + b"\x00\n"  # past the first 8 KiB
    assert check_content(late, ReadLimits())[2] == "binary"
    assert check_content(b"x = 1\n" * 3000, ReadLimits())[2] is None


def test_stdlib_files_round_trip_through_every_format(tmp_path):
    """The same real files as a directory, Parquet, .jsonl.zst and a saved dataset give the same
    documents (keys, languages and bytes)."""
    import zstandard

    names = ["textwrap.py", "heapq.py", "bisect.py", "colorsys.py"]
    rows = [(open(os.path.join(STDLIB, n), encoding="utf-8").read(), f"lib/{n}", "Python") for n in names]
    write_parquet(tmp_path / "x.parquet", stack_table(rows))
    (tmp_path / "x.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl_lines(rows).encode()))
    write_saved_dataset(tmp_path / "saved", stack_table(rows))
    want = [(k, "python", t.encode()) for t, k, _ in rows]
    for inp in ("x.parquet", "x.jsonl.zst", "saved"):
        docs = list(iter_documents([str(tmp_path / inp)]))
        assert [(d.key, d.language, read_document(d, ReadLimits(max_line_length=10 ** 6))[0])
                for d in docs] == want, inp


def test_damaged_parquet_and_arrow_files_are_skipped_and_counted(tmp_path):
    rows = _many_records(40)
    good = write_parquet(tmp_path / "good.parquet", stack_table(rows), row_group_size=10)
    data = good.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])  # no footer: nothing readable
    assert [(d.skip, d.file_path) for d in iter_documents([str(tmp_path / "cut.parquet")])] == [
        ("corrupt_stream", str(tmp_path / "cut.parquet"))]
    write_saved_dataset(tmp_path / "ds", stack_table(rows), num_files=1)
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size * 2 // 3])
    docs = list(iter_documents([str(tmp_path / "ds")]))
    assert 10 <= len(docs) - 1 < 40 and all(d.skip is None for d in docs[:-1])
    assert docs[-1].skip == "corrupt_stream" and [d.key for d in docs[:-1]] == [r[1] for r in rows[:len(docs) - 1]]
