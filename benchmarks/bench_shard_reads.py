"""Bytes each shard job reads and decodes, per-document hash (before) against record units (after).

Generates a corpus in the published formats from this interpreter's standard library (real
code): Parquet files of several row groups (The Stack's columns, snappy), ``.jsonl.zst`` files
and a ``datasets.save_to_disk`` folder of Arrow files. For every shard of ``--num-shards`` it
walks the shard's documents both ways, in this process, and prints side by side:

* MB read: bytes the walk read from files (``rchar`` of /proc/self/io: every read system call,
  footers and headers included);
* MB decoded: bytes of document content the readers decompressed and decoded.

"before" is the old shard job: every document of every record file is decoded, then kept if
``hash(key) % N`` is the shard. "after" is ``shards.shard_documents``: only the shard's units.
The figures are byte counts, identical from run to run (no timing).

    python benchmarks/bench_shard_reads.py [--num-shards 4] [--mb 12] [--workdir DIR]
"""
import argparse
import json
import os
import shutil
import tempfile


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def code_rows(max_bytes: int):
    """(content, path, lang) rows of standard-library Python, up to ``max_bytes`` of content
    (the same files `bench_corpus_memory.py` uses)."""
    from bench_corpus_memory import stdlib_sources

    rows, total = [], 0
    for rel, text in stdlib_sources():
        rows.append((text, rel, "Python"))
        total += len(text.encode())
        if total >= max_bytes:
            break
    return rows


def write_corpus(root: str, rows, parquet_files=4, row_groups=8, zst_files=4, arrow_files=4):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    os.makedirs(root)
    parts = [rows[i::3] for i in range(3)]

    def table(rs):
        return pa.table({"content": [r[0] for r in rs], "max_stars_repo_path": [r[1] for r in rs],
                         "lang": [r[2] for r in rs], "size": [len(r[0]) for r in rs]})

    for i in range(parquet_files):
        rs = parts[0][i::parquet_files]
        pq.write_table(table(rs), os.path.join(root, f"train-{i:05d}.parquet"),
                       row_group_size=max(1, -(-len(rs) // row_groups)), compression="snappy")
    for i in range(zst_files):
        text = "".join(json.dumps({"content": c, "path": p, "lang": l}) + "\n" for c, p, l in parts[1][i::zst_files])
        with open(os.path.join(root, f"more-{i:05d}.jsonl.zst"), "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(text.encode()))
    folder = os.path.join(root, "saved")
    os.makedirs(folder)
    names = []
    for i in range(arrow_files):
        t = table(parts[2][i::arrow_files])
        name = f"data-{i:05d}-of-{arrow_files:05d}.arrow"
        with pa.OSFile(os.path.join(folder, name), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            for batch in t.to_batches(max_chunksize=256):
                w.write_batch(batch)
        names.append(name)
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"_data_files": [{"filename": n} for n in names]}, f)


def content_bytes(doc) -> int:
    if doc.content is None:
        return 0
    return len(doc.content) if isinstance(doc.content, bytes) else len(doc.content.encode("utf-8", "surrogatepass"))


def measure(walk):
    """(bytes read, bytes of content decoded, documents kept) of one walk."""
    r0, decoded, kept = rchar(), 0, 0
    for doc, mine in walk:
        decoded += content_bytes(doc)
        kept += mine
    return rchar() - r0, decoded, kept


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-shards", type=int, default=4)
    ap.add_argument("--mb", type=float, default=12.0, help="MB of code in the generated corpus (12; at "
                    "most what the standard library has outside its tests, about 13 MB)")
    ap.add_argument("--workdir", help="keep the generated corpus here")
    args = ap.parse_args(argv)

    from ast_t5_preprocess.inputs import input_bytes, iter_documents
    from ast_t5_preprocess.shards import shard_documents, shard_of
    from ast_t5_preprocess.units import Assignment

    work = args.workdir or tempfile.mkdtemp(prefix="bench_shard_reads_")
    corpus = os.path.join(work, "corpus")
    shutil.rmtree(corpus, ignore_errors=True)
    write_corpus(corpus, code_rows(int(args.mb * 1e6)))
    n = args.num_shards
    assignment = Assignment.of([corpus], num_shards=n)
    list(iter_documents([corpus]))  # warm up: imports and the page cache, outside the counts

    def before(sid):
        for doc in iter_documents([corpus]):
            yield doc, shard_of(doc.key, n) == sid

    def after(sid):
        for doc in shard_documents([corpus], None, sid, n, assignment=assignment):
            yield doc, True

    total = input_bytes([corpus])
    print(f"corpus: {total / 1e6:.2f} MB of input files, {len(assignment.units)} units "
          f"(Parquet row groups, .jsonl.zst files, Arrow files), {n} shards")
    print(f"{'shard':>5}  {'docs':>6}  {'before MB read':>14}  {'MB decoded':>10}  "
          f"{'after MB read':>13}  {'MB decoded':>10}  {'read ratio':>10}  {'decoded ratio':>13}")
    sums = [0, 0, 0, 0]
    for sid in range(n):
        b_read, b_dec, b_kept = measure(before(sid))
        a_read, a_dec, a_kept = measure(after(sid))
        sums = [x + y for x, y in zip(sums, (b_read, b_dec, a_read, a_dec))]
        print(f"{sid:>5}  {a_kept:>6}  {b_read / 1e6:>14.2f}  {b_dec / 1e6:>10.2f}  {a_read / 1e6:>13.2f}  "
              f"{a_dec / 1e6:>10.2f}  {b_read / max(1, a_read):>9.2f}x  {b_dec / max(1, a_dec):>12.2f}x")
    print(f"{'all':>5}  {'':>6}  {sums[0] / 1e6:>14.2f}  {sums[1] / 1e6:>10.2f}  {sums[2] / 1e6:>13.2f}  "
          f"{sums[3] / 1e6:>10.2f}  {sums[0] / max(1, sums[2]):>9.2f}x  {sums[1] / max(1, sums[3]):>12.2f}x")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
