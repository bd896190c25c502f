"""Memory of `ast-t5-preprocess run` on published formats at size: is it flat?

Generates a corpus of ``--size`` MB of real Python (the standard library's files, each copy
given a distinct first line so that exact deduplication keeps it), half as Parquet files
(The Stack v1 columns, 1,000 rows per row group) and half as ``.jsonl.zst``; then runs the whole
pipeline (tokenizer sample + training, shards, merge) as a subprocess and samples the resident
memory of the main process and of every pool worker from /proc twice a second. Prints the peak
RSS per process kind, and the worker RSS at 10% / 50% / 90% of the run, for each size given.

    python benchmarks/bench_corpus_memory.py --size 50 --size 1000 --workers 2

Linux only (/proc). The corpus is written under --workdir (default: a temporary folder) and
deleted afterwards unless --keep.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

FILES_PER_RECORD_FILE = 20000


def stdlib_sources(max_bytes=200_000):
    out = []
    root = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "test" in path.split(os.sep):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        if 0 < len(text) <= max_bytes and "\u2581" not in text:
            out.append((os.path.relpath(path, root), text))
    return out


def generate(folder, megabytes):
    """Write the corpus; returns its size in bytes of code."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    os.makedirs(folder, exist_ok=True)
    sources = stdlib_sources()
    schema = pa.schema([("content", pa.string()), ("max_stars_repo_path", pa.string()), ("lang", pa.string())])
    total, k, part = 0, 0, 0
    while total < megabytes * 1e6:
        rows = []
        while len(rows) < FILES_PER_RECORD_FILE and total < megabytes * 1e6:
            rel, text = sources[k % len(sources)]
            content = f"# copy {k // len(sources)} of {rel}\n{text}"
            rows.append((content, f"copy{k // len(sources)}/{rel}", "Python"))
            total += len(content.encode("utf-8"))
            k += 1
        if part % 2 == 0:
            with pq.ParquetWriter(os.path.join(folder, f"part-{part:05d}.parquet"), schema) as w:
                for s in range(0, len(rows), 1000):
                    chunk = rows[s:s + 1000]
                    w.write_table(pa.table({"content": [r[0] for r in chunk],
                                            "max_stars_repo_path": [r[1] for r in chunk],
                                            "lang": [r[2] for r in chunk]}, schema=schema))
        else:
            cctx = zstandard.ZstdCompressor()
            with open(os.path.join(folder, f"part-{part:05d}.jsonl.zst"), "wb") as f, \
                    cctx.stream_writer(f) as w:
                for content, path, lang in rows:
                    w.write((json.dumps({"content": content, "path": path, "lang": lang}) + "\n").encode())
        part += 1
    return total


def rss_kib(pid, field="VmRSS"):
    """Resident memory of a process in KiB: VmRSS (all), RssAnon (heap) or RssFile (mapped files,
    e.g. the memory-mapped datasets read by the merge: page cache, reclaimable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in open(task).read().split()]
        except OSError:
            pass
    return out


def measure(corpus, out, workers, extra):
    cmd = [sys.executable, "-m", "ast_t5_preprocess", "run", corpus, "-o", out, "--workers", str(workers),
           "--no-progress", *extra]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    main_peak, main_anon_peak, worker_peak, timeline = 0, 0, 0, []
    while proc.poll() is None:
        main = rss_kib(proc.pid)
        main_anon_peak = max(main_anon_peak, rss_kib(proc.pid, "RssAnon"))
        workers_rss = [rss_kib(c) for c in children(proc.pid)]
        main_peak = max(main_peak, main)
        if workers_rss:
            worker_peak = max(worker_peak, max(workers_rss))
            timeline.append((time.time() - t0, max(workers_rss)))
        time.sleep(0.5)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{err[-2000:]}")
    wall = time.time() - t0
    at = {}
    if timeline:
        start, end = timeline[0][0], timeline[-1][0]
        for q in (0.1, 0.5, 0.9):
            t = start + q * (end - start)
            at[q] = next(r for s, r in timeline if s >= t)
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    return dict(wall=wall, main_peak=main_peak, main_anon_peak=main_anon_peak, worker_peak=worker_peak, at=at,
                files=manifest["totals"].get("files_kept", 0), mb=manifest["totals"].get("bytes", 0) / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, action="append", help="corpus size in MB (repeatable; 50 and 1000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--vocab-size", type=int, default=8000)
    args = ap.parse_args()
    sizes = args.size or [50.0, 1000.0]
    work = args.workdir or tempfile.mkdtemp(prefix="bench_corpus_memory_")
    extra = ["--vocab-size", str(args.vocab_size), "--spm-sample-mb", "16"]
    results = {}
    try:
        for size in sizes:
            corpus, out = os.path.join(work, f"corpus{size:g}"), os.path.join(work, f"out{size:g}")
            shutil.rmtree(out, ignore_errors=True)
            if not os.path.isdir(corpus):
                generate(corpus, size)
            inputs = sum(os.path.getsize(p) for p in glob.glob(os.path.join(corpus, "*")))
            r = measure(corpus, out, args.workers, extra)
            results[size] = r
            print(f"{size:g} MB of code ({inputs / 1e6:.0f} MB of Parquet + .jsonl.zst): {r['files']} files kept, "
                  f"{r['mb']:.0f} MB, {r['wall']:.0f} s; peak RSS main {r['main_peak'] / 1024:.0f} MiB "
                  f"(anonymous {r['main_anon_peak'] / 1024:.0f} MiB), "
                  f"worker {r['worker_peak'] / 1024:.0f} MiB; worker RSS at 10/50/90% of the run: "
                  + " / ".join(f"{v / 1024:.0f}" for v in r["at"].values()) + " MiB", flush=True)
        if len(results) > 1:
            small, big = results[min(results)], results[max(results)]
            print(f"ratio {max(results):g} MB / {min(results):g} MB: worker peak "
                  f"{big['worker_peak'] / small['worker_peak']:.2f} x, main peak "
                  f"{big['main_peak'] / small['main_peak']:.2f} x (anonymous {big['main_anon_peak'] / small['main_anon_peak']:.2f} x) "
                  "(target: worker <= 1.2 x)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
