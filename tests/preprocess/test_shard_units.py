"""Sharding by record-file unit (units.py): a shard job opens and decompresses only its own
Parquet row groups, JSONL files and Arrow files; damage in another shard's unit is not its
business; the shards together hold every document once; plan's bytes add up to the input; a
shard made with another assignment is refused. Generated data in the published schemas."""
import json
import os
from collections import Counter

import pytest

from ast_t5_preprocess import readers
from ast_t5_preprocess.cli import main
from ast_t5_preprocess.inputs import input_bytes, iter_documents
from ast_t5_preprocess.plan import make_plan
from ast_t5_preprocess.shards import shard_documents
from ast_t5_preprocess.units import Assignment, assign_units, iter_record_units, Unit

from ..conftest import STDLIB, STDLIB_FILES
from .test_cli import SMALL
from .test_corpus_cli import jsonl_zst
from .test_readers import _many_records, stack_table, write_parquet, write_saved_dataset


def make_corpus(root, rows):
    """Parquet with 5 row groups, two .jsonl.zst files, a save_to_disk folder of 3 Arrow files
    and two source files, over ``rows`` (content, path, lang) with distinct paths."""
    root.mkdir()
    n = len(rows)
    write_parquet(root / "a.parquet", stack_table(rows[: n // 2]), row_group_size=-(-(n // 2) // 5))
    jsonl_zst(root / "b.jsonl.zst", rows[n // 2: n * 5 // 8])
    jsonl_zst(root / "c.jsonl.zst", rows[n * 5 // 8: n * 6 // 8])
    write_saved_dataset(root / "ds", stack_table(rows[n * 6 // 8:]), num_files=3)
    (root / "x.py").write_text("x = 1\n")
    (root / "y.py").write_text("def y():\n    return 2\n")
    return root


def code_rows():
    rows = [(open(os.path.join(STDLIB, n), encoding="utf-8").read(), f"lib/{n}", "Python")
            for n in STDLIB_FILES]
    return rows + [(f"def f{i}(x):\n    return x * {i} + {i * i}\n", f"gen/f{i}.py", "Python")
                   for i in range(18)]


def _shard_reads(monkeypatch, corpus, num_shards):
    """Per shard: the documents it yields and the (path, row group) units it decompressed."""
    import pyarrow.parquet as pq

    reads = []
    real_iter, real_open = pq.ParquetFile.iter_batches, readers.open_regular

    def iter_batches(self, *args, row_groups=None, **kw):
        reads.append(("parquet", tuple(row_groups) if row_groups is not None else "all"))
        return real_iter(self, *args, row_groups=row_groups, **kw)

    def open_regular(path):
        if not path.endswith(".parquet"):  # Parquet footers are read by every job: not counted
            reads.append((os.path.basename(path), None))
        return real_open(path)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    monkeypatch.setattr(readers, "open_regular", open_regular)
    out = []
    for sid in range(num_shards):
        reads.clear()
        docs = list(shard_documents([str(corpus)], None, sid, num_shards))
        out.append((docs, list(reads)))
    return out


def test_a_shard_job_decompresses_only_its_own_units(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path / "c", _many_records(80))
    assignment = Assignment.of([str(corpus)], num_shards=3)
    owned = [set() for _ in range(3)]
    for u, sid in zip(assignment.units, assignment.shards):
        owned[sid].add(("parquet", (u.row_group,)) if u.row_group is not None else (os.path.basename(u.path), None))
    assert len(assignment.units) == 5 + 2 + 3 and all(owned)  # every shard owns some unit
    for sid, (_, reads) in enumerate(_shard_reads(monkeypatch, corpus, 3)):
        assert set(reads) == owned[sid] and len(reads) == len(owned[sid]), sid  # each once, no other


def test_damage_in_another_shards_unit_is_counted_only_by_its_owner(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    rows = _many_records(80)
    corpus = make_corpus(tmp_path / "c", rows)
    md = pq.ParquetFile(str(corpus / "a.parquet")).metadata
    rg = md.row_group(2)
    chunk = next(rg.column(c) for c in range(rg.num_columns) if rg.column(c).path_in_schema == "content")
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray((corpus / "a.parquet").read_bytes())
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    (corpus / "a.parquet").write_bytes(bytes(data))  # row group 2's pages only: footer intact
    zst = (corpus / "b.jsonl.zst").read_bytes()
    (corpus / "b.jsonl.zst").write_bytes(zst[: len(zst) * 2 // 3])  # the same size class of cut
    full = list(iter_documents([str(corpus)]))
    damaged = {d.unit for d in full if d.skip == "corrupt_stream"}
    assert damaged == {f"{corpus / 'a.parquet'}#rowgroup=2", str(corpus / "b.jsonl.zst")}
    for num_shards in (2, 3):
        assignment = Assignment.of([str(corpus)], num_shards=num_shards)
        owner = {unit: assignment.by_id[unit] for unit in damaged}
        counted = Counter()
        shards = _shard_reads(monkeypatch, corpus, num_shards)
        for sid, (docs, _) in enumerate(shards):
            for d in docs:
                if d.skip == "corrupt_stream":
                    counted[d.unit] += 1
                    assert owner[d.unit] == sid
        assert counted == Counter({u: 1 for u in damaged})
        # records before the damage are kept by the owner: the same documents as one full pass
        assert sorted(d.origin for docs, _ in shards for d in docs) == sorted(d.origin for d in full)


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_shards_hold_every_document_once(tmp_path, num_shards):
    """End to end (run, then merge from the shards): every document is seen by exactly one shard,
    kept or skipped, and the merged dataset keeps the same files for any number of shards."""
    rows = code_rows()
    corpus = make_corpus(tmp_path / "c", rows)
    want = Counter(d.key for d in iter_documents([str(corpus)]))
    assert len(want) == len(rows) + 2 and set(want.values()) == {1}
    out = tmp_path / f"out{num_shards}"
    assert main(["run", str(corpus), "-o", str(out), *SMALL, "--num-shards", str(num_shards),
                 "--keep-shards", "--no-dedup"]) == 0
    seen = Counter()
    for sid in range(num_shards):
        folder = out / "shards" / f"shard-{sid:05d}-of-{num_shards:05d}"
        meta = json.load(open(folder / "shard.json"))
        seen.update(k for keys in meta["keys"].values() for k in keys)
        seen.update(json.loads(line)["path"] for line in open(folder / "skipped.jsonl")
                    if json.loads(line)["skipped"])
    assert seen == want  # nothing lost, nothing twice
    totals = json.load(open(out / "manifest.json"))["totals"]
    assert totals["files_seen"] == len(want)
    assert totals["files_kept"] == len(want) - sum(v for k, v in totals.items() if k.startswith("skipped_"))


def test_plan_bytes_add_up_to_the_input_and_balance(tmp_path):
    corpus = make_corpus(tmp_path / "c", _many_records(120))
    (corpus / "notes.bin").write_bytes(b"\x00" * 5000)  # unknown extension: never read, not counted
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(corpus) for f in fs
                  if f.endswith((".parquet", ".zst", ".arrow", ".py")))
    assert input_bytes([str(corpus)]) == on_disk
    units = list(iter_record_units([str(corpus)]))
    assert sum(u.size for u in units) == on_disk - sum(os.path.getsize(corpus / f) for f in ("x.py", "y.py"))
    for n in (1, 2, 3, 4):
        plan = make_plan([str(corpus)], n)
        assert sum(s["input_bytes"] for s in plan["shards"]) == on_disk == plan["input_bytes"]
        assert sum(s["units"] for s in plan["shards"]) == len(units) == plan["units"]
        assert sum(s["files"] for s in plan["shards"]) == plan["files"]
    sizes = [s["input_bytes"] for s in make_plan([str(corpus)], 3)["shards"]]
    assert max(sizes) <= min(sizes) + max(u.size for u in units)  # greedy: within one unit


def test_assignment_ignores_discovery_order_and_is_greedy():
    units = [Unit(f"/p/{k}", k, f"/p/{k}", size) for k, size in
             [("a", 5), ("b", 9), ("c", 5), ("d", 1), ("e", 7), ("f", 3)]]
    shards = assign_units(units, 2)
    by_key = dict(zip((u.key for u in units), shards))
    rev = assign_units(units[::-1], 2)
    assert dict(zip((u.key for u in units[::-1]), rev)) == by_key
    loads = Counter()
    for u, s in zip(units, shards):
        loads[s] += u.size
    assert sorted(loads.values()) == [15, 15]  # 9+5+1 / 7+5+3
    assert assign_units(units, 1) == [0] * len(units)


def test_shards_of_another_assignment_are_refused(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c", code_rows())
    out = tmp_path / "out"
    args = [str(corpus), "-o", str(out), *SMALL, "--num-shards", "2"]
    assert main(["train-spm", str(corpus), "-o", str(out), *SMALL[:4]]) == 0
    assert main(["run", *args, "--shard-id", "0"]) == 0
    jsonl_zst(corpus / "c.jsonl.zst", code_rows()[:3])  # another size: the units move
    capsys.readouterr()
    assert main(["run", *args, "--shard-id", "0"]) != 0
    err = capsys.readouterr().err
    assert "shard assignment" in err and len(err.strip().splitlines()) == 1
