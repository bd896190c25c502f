"""Corpus-pipeline throughput, measured side by side on the same files in one run.

Prints, in MB of source per second:
  * raw tree-sitter parse, sentencepiece encode, and the floor (parse + encode, summed times);
  * the full pipeline (read, parse, tokenize, align, segment, write, merge-free shard) with one
    worker and with two, and the ratios against the targets of DESIGN.md section 8
    (one worker >= 0.6 x floor; two workers >= 1.7 x one).

    python benchmarks/bench_preprocess.py                 # the whole standard library, ~30 MB
    python benchmarks/bench_preprocess.py --max-mb 10     # a quicker, noisier run

At size (``--size 1GB``, or 200MB ...): a corpus of that size is generated from real code (the
standard library and the bundled samples, then renamed variants of it: every identifier gets a
variant suffix, so variants share almost no 5-token shingles with each other), with near
duplicates planted at a known rate (copies of a file with 2-6% of their lines edited). It runs
the whole shard + merge pipeline on it and reports MB/s per worker against the floor, peak RSS
of the main process and of the largest worker, the share of time spent on near-duplicate removal
(signatures in the workers, LSH at merge), and recall/precision of near-duplicate removal on the
planted pairs (a planted pair is found when one of its two files is removed as a duplicate of the
other). A removal is correct when it is a planted pair, or when the exact Jaccard similarity of
the two files' shingle sets reaches the threshold (the standard library has its own near
duplicates, e.g. the encodings/cp*.py tables).

    python benchmarks/bench_preprocess.py --size 200MB --workers 2 --planted-rate 0.05 --compare
    python benchmarks/bench_preprocess.py --size 1GB --workers 2 --compare --scaling  # idle machine, ~25 min

Near-duplicate removal, old and new code side by side: the worker's signature cost per file
(``--signatures``, on the standard library tokenized as the pipeline does), and the merge
index's peak memory and CPU time on generated signatures, each index in its own process, with a
check that both removed the same files for the same partners (``--near-dup-index 200000``).

    python benchmarks/bench_preprocess.py --signatures --max-mb 10 --vocab-size 8000
    python benchmarks/bench_preprocess.py --near-dup-index 200000
"""
import argparse
import json
import keyword
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

from ast_t5_preprocess.driver import DEFAULT_CORPUS_EXCLUDES, default_corpus
from ast_t5_preprocess.inputs import ReadLimits, iter_documents, read_document
from ast_t5_preprocess.parsing import CodeParser
from ast_t5_preprocess.pipeline import PipelineOptions
from ast_t5_preprocess.shards import run_shard
from ast_t5_preprocess.tokenizer import train_sentencepiece

_KEYWORDS = frozenset(keyword.kwlist) | {"self", "cls", "int", "void", "char", "return", "if", "else",
                                         "for", "while", "class", "public", "private", "static", "const",
                                         "func", "fn", "let", "var", "function", "struct", "package"}


def select_documents(max_mb):
    """Readable code files of the default corpus, in walk order, up to max_mb."""
    docs, texts, total = [], [], 0
    for doc in iter_documents(default_corpus(), None, DEFAULT_CORPUS_EXCLUDES):
        data, text, skip = read_document(doc, ReadLimits())
        if skip or doc.language == "text":
            continue
        docs.append(doc)
        texts.append((doc.language, data, text))
        total += len(data)
        if total >= max_mb * 1e6:
            break
    return docs, texts, total / 1e6


def time_floor(texts, tok):
    parsers = {}
    t0 = time.perf_counter()
    for lang, data, _ in texts:
        parsers.setdefault(lang, CodeParser(lang)).parser.parse(data)
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _, _, text in texts:
        tok.sp.encode(text)
    return t_parse, time.perf_counter() - t0


def time_pipeline(docs, workdir, spm_model, num_sentinels, workers):
    out = os.path.join(workdir, f"w{workers}")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    ctx_args = (spm_model, num_sentinels, PipelineOptions(), None)
    run_shard([], None, out, 0, 1, ctx_args, workers, "bench", progress=False,
              documents=docs)
    return time.perf_counter() - t0


def parse_size(text: str) -> float:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1}
    t = text.strip().upper()
    for unit, scale in units.items():
        if t.endswith(unit):
            return float(t[: -len(unit)]) * scale
    return float(t)


_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def renamed_variant(text: str, variant: int) -> str:
    """Every identifier that is not a keyword gets the suffix ``_v<variant>``."""
    suffix = f"_v{variant}"
    return _IDENT.sub(lambda m: m.group(0) if m.group(0) in _KEYWORDS else m.group(0) + suffix, text)


def near_copy(text: str, rng: random.Random) -> str:
    """2-6% of the lines edited (a comment appended), the rest unchanged."""
    lines = text.split("\n")
    rate = rng.uniform(0.02, 0.06)
    for i in rng.sample(range(len(lines)), max(1, int(rate * len(lines)))):
        lines[i] += "  # edited for the copy"
    return "\n".join(lines)


def generate_corpus(root: str, size_bytes: float, planted_rate: float, seed: int = 0):
    """Write the corpus; returns ({planted copy key: source key}, bytes written)."""
    rng = random.Random(seed)
    base = []
    for doc in iter_documents(default_corpus(), None, DEFAULT_CORPUS_EXCLUDES):
        data, text, skip = read_document(doc, ReadLimits())
        if not skip and doc.language != "text":
            base.append((doc.key, text))
    planted, total, variant = {}, 0, 0
    top = os.path.basename(root)
    while total < size_bytes:
        for key, text in base:
            body = text if variant == 0 else renamed_variant(text, variant)
            rel = f"v{variant}/{key}"
            total += _write(os.path.join(root, rel), body)
            if rng.random() < planted_rate:
                copy_rel = f"planted/v{variant}/{key}"
                total += _write(os.path.join(root, copy_rel), near_copy(body, rng))
                planted[f"{top}/{copy_rel}"] = f"{top}/{rel}"
            if total >= size_bytes:
                break
        variant += 1
    return planted, total


def _write(path: str, text: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def shingle_set(tok, path: str):
    from ast_t5_preprocess.near_dup import shingle_ids

    with open(path, encoding="utf-8") as f:
        return set(shingle_ids(tok.encode(f.read())).tolist())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def at_size(args) -> None:
    from ast_t5_preprocess.merge import merge_shards
    from ast_t5_preprocess.near_dup import DEFAULT_THRESHOLD, minhash_signature

    size = parse_size(args.size)
    work = args.workdir or tempfile.mkdtemp(prefix="bench_at_size_")
    corpus = os.path.join(work, "corpus")
    shutil.rmtree(corpus, ignore_errors=True)
    t0 = time.perf_counter()
    planted, written = generate_corpus(corpus, size, args.planted_rate)
    print(f"corpus: {written / 1e6:.1f} MB in {corpus}, {len(planted)} planted near copies "
          f"(generated in {time.perf_counter() - t0:.0f}s)")
    docs = list(iter_documents([corpus]))
    sample = [read_document(d, ReadLimits()) for d in docs[:: max(1, len(docs) // 400)]]
    sample = [(d, lang, data, text) for d, (data, text, skip) in zip(docs[:: max(1, len(docs) // 400)], sample)
              for lang in [d.language] if not skip]
    tok = train_sentencepiece((t for _, _, _, t in sample), work, args.vocab_size, 256, num_threads=2)
    spm = os.path.join(work, "spm.model")
    # floor and near-dup signature cost, in this process, on the sample
    # CPU seconds (process_time, and the workers' rusage) rather than wall time: the ratios then
    # hold on a machine shared with other jobs
    c0 = time.process_time()
    time_floor([(lang, data, text) for _, lang, data, text in sample], tok)
    t_floor = time.process_time() - c0
    sample_mb = sum(len(data) for _, _, data, _ in sample) / 1e6
    ids = [tok.sp.encode(text) for _, _, _, text in sample]
    minhash_signature(np.asarray(ids[0]))  # imports datasketch outside the timing
    t_sig = time.process_time()
    for x in ids:
        minhash_signature(np.asarray(x))
    t_sig = time.process_time() - t_sig
    floor = sample_mb / t_floor
    # the pipeline at size: one shard run with W workers, then the merge with near-dup removal
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    opts = PipelineOptions(near_dup_threshold=DEFAULT_THRESHOLD)
    ctx_args = (spm, 256, opts, None)
    t0, c0, w0 = time.perf_counter(), time.process_time(), _children_cpu()
    stats = run_shard([corpus], None, out, 0, 1, ctx_args, args.workers, "bench", progress=False)
    t_shard = time.perf_counter() - t0
    cpu_shard = time.process_time() - c0 + _children_cpu() - w0  # main + every worker
    rss_main = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    cpu_plain = None
    if args.compare:  # the same shard run without near-dup signatures, side by side
        plain_ctx = (spm, 256, PipelineOptions(near_dup_threshold=None), None)
        c0, w0 = time.process_time(), _children_cpu()
        run_shard([corpus], None, out + "_plain", 0, 1, plain_ctx, args.workers, "plain", progress=False)
        cpu_plain = time.process_time() - c0 + _children_cpu() - w0
        shutil.rmtree(out + "_plain", ignore_errors=True)
    t_one = None
    if args.scaling and args.workers > 1:  # the same shard run with one worker: wall-clock scaling
        t0 = time.perf_counter()
        run_shard([corpus], None, out + "_w1", 0, 1, ctx_args, 1, "one", progress=False)
        t_one = time.perf_counter() - t0
        shutil.rmtree(out + "_w1", ignore_errors=True)
    report = os.path.join(work, "report.jsonl")
    t0 = time.process_time()
    merge_shards(out, 1, "bench", near_dup_threshold=None)  # the same merge, without near-dup
    t_merge_plain = time.process_time() - t0
    t0 = time.process_time()
    merge_shards(out, 1, "bench", near_dup_threshold=DEFAULT_THRESHOLD, report_path=report)
    t_merge_nd = time.process_time() - t0
    # near-duplicate quality on the planted pairs
    removed = [e for e in map(json.loads, open(report, encoding="utf-8")) if e["reason"] == "near_duplicate"]
    pairs = {frozenset(p) for p in planted.items()}
    hits = {frozenset((e["path"], e["duplicate_of"])) for e in removed} & pairs
    recall = len(hits) / max(1, len(pairs))
    root = os.path.dirname(corpus)
    exact = []  # exact Jaccard of the other removals (natural near duplicates of the corpus)
    for e in removed:
        if frozenset((e["path"], e["duplicate_of"])) not in pairs:
            a, b = (shingle_set(tok, os.path.join(root, e[k])) for k in ("path", "duplicate_of"))
            exact.append(len(a & b) / max(1, len(a | b)))
    exact = np.array(exact)
    verified = len(hits) + int(np.sum(exact >= DEFAULT_THRESHOLD))
    precision = verified / max(1, len(removed))
    mb = sum(s.get("bytes", 0) for s in stats["stats"].values()) / 1e6
    seen_mb = written / 1e6
    t_pipeline = t_shard + t_merge_nd
    # signature time scaled from the sample to the corpus, in worker-seconds
    t_dedup = t_sig * (mb / sample_mb) + max(0.0, t_merge_nd - t_merge_plain)
    per_worker = seen_mb / cpu_shard
    print(f"floor (parse + encode, sample of {sample_mb:.1f} MB)   {floor:8.2f} MB per CPU-second")
    print(f"shard run, {args.workers} workers: {seen_mb / t_shard:.2f} MB/s wall; {per_worker:.2f} MB per "
          f"CPU-second of main + workers = {per_worker / floor:.2f} x floor (target >= 0.60)")
    if cpu_plain is not None:
        print(f"shard run without near-dup: {seen_mb / cpu_plain:.2f} MB per CPU-second = "
              f"{seen_mb / cpu_plain / floor:.2f} x floor; near-dup share measured side by side: "
              f"{(cpu_shard + t_merge_nd - cpu_plain - t_merge_plain) / (cpu_shard + t_merge_nd) * 100:.1f}%")
    if t_one is not None:
        print(f"shard run, 1 worker: {seen_mb / t_one:.2f} MB/s wall; {args.workers} workers / 1 worker = "
              f"{t_one / t_shard:.2f} x (target >= 1.7 for 2; wall clock: needs an idle machine)")
    print(f"merge: {t_merge_nd:.1f} CPU-s with near-dup removal, {t_merge_plain:.1f} CPU-s without")
    print(f"near-dup share of pipeline time: {t_dedup / (cpu_shard + t_merge_nd) * 100:.1f}% "
          f"(signatures {t_sig * (mb / sample_mb):.1f} CPU-s of {cpu_shard:.1f}, LSH {max(0.0, t_merge_nd - t_merge_plain):.1f}s; "
          f"target <= 25%)")
    print(f"peak RSS: main {rss_main:.0f} MB, largest worker {rss_worker:.0f} MB")
    print(f"near-dup on planted pairs: {len(hits)}/{len(pairs)} found: recall {recall:.3f} (target >= 0.9)")
    print(f"near-dup overall: {len(removed)} removed, {len(exact)} natural (not planted) pairs, of which "
          f"{int(np.sum(exact >= DEFAULT_THRESHOLD))} have an exact shingle Jaccard >= {DEFAULT_THRESHOLD} and "
          f"{int(np.sum((exact < DEFAULT_THRESHOLD) & (exact >= DEFAULT_THRESHOLD - 0.1)))} are within 0.1 below; "
          f"precision (planted pairs + natural pairs at or above the threshold) {precision:.3f} (target >= 0.99)")
    print(f"kept {mb:.1f} MB; machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
          f"wall {t_pipeline:.0f}s")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


# ---- near-duplicate removal: worker signatures and merge index, old and new side by side ----

def _old_signature(ids: np.ndarray) -> np.ndarray:
    """The signature as main computed it before the vectorized path: np.unique shingles, then
    datasketch's ``update_batch`` over a Python list (kept here to time it side by side)."""
    from datasketch import MinHash

    from ast_t5_preprocess.near_dup import _MIX, NUM_PERM, SEED, SHINGLE, _identity

    ids = np.asarray(ids, dtype=np.uint64)
    k = min(SHINGLE, len(ids))
    n = len(ids) - k + 1
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * _MIX + ids[j:j + n] + np.uint64(1)
    mh = MinHash(num_perm=NUM_PERM, seed=SEED, hashfunc=_identity, scheme="affine32")
    sh = np.unique((h >> np.uint64(32)).astype(np.uint32))
    if len(sh):
        mh.update_batch(sh.tolist())
    return np.asarray(mh.hashvalues, dtype=np.uint32)


def signature_cost(args) -> None:
    """Per-file CPU cost of the worker's MinHash signature, old and new, on the standard
    library tokenized as the pipeline does (a sentencepiece model trained on it)."""
    from ast_t5_preprocess.near_dup import minhash_signature

    _, texts, mb = select_documents(args.max_mb)
    with tempfile.TemporaryDirectory() as work:
        tok = train_sentencepiece((t for _, _, t in texts), work, args.vocab_size, 256, num_threads=2)
        ids = [tok.encode(t) for _, _, t in texts]
    lengths = np.array([len(x) for x in ids])
    bad = sum(not np.array_equal(_old_signature(x), minhash_signature(x)) for x in ids)
    print(f"files: {len(ids)}, {mb:.1f} MB, tokens per file: median {int(np.median(lengths))}, "
          f"mean {lengths.mean():.0f}; signatures differing between old and new: {bad}")
    old, new = [], []
    for _ in range(max(3, args.repeats)):  # interleaved, CPU time, medians
        for fn, out in ((_old_signature, old), (minhash_signature, new)):
            c0 = time.process_time()
            for x in ids:
                fn(x)
            out.append((time.process_time() - c0) / len(ids))
    o, n = float(np.median(old)), float(np.median(new))
    print(f"signature per file: old (np.unique + update_batch) {o * 1e3:.3f} ms, "
          f"new (vectorized) {n * 1e3:.3f} ms: {o / n:.2f}x cheaper "
          f"({len(old)} interleaved repeats, medians of CPU time)")


def planted_signatures(num_files: int, seed: int = 0) -> np.ndarray:
    """(num_files, 128) uint32 signatures: random ones, and 10% near copies of earlier ones with
    2-40% of their values changed (clusters of several members, pairs on both sides of 0.8)."""
    rng = np.random.RandomState(seed)
    sigs = rng.randint(0, 2 ** 32, (num_files, 128), dtype=np.uint64).astype(np.uint32)
    copies = np.flatnonzero(rng.rand(num_files) < 0.1)
    copies = copies[copies > 0]
    for i in copies:
        src = rng.randint(max(0, i - 5000), i)
        row = sigs[src].copy()
        change = rng.rand(128) < rng.choice([0.02, 0.1, 0.15, 0.2, 0.25, 0.4])
        row[change] = rng.randint(0, 2 ** 32, int(change.sum()), dtype=np.uint64).astype(np.uint32)
        sigs[i] = row
    return sigs


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def near_dup_index_child(kind: str, path: str, blocks: int) -> None:
    """One merge index over memory-mapped signatures, in a fresh process; prints JSON."""
    import hashlib
    import threading

    from ast_t5_preprocess.near_dup import NearDupIndex, ReferenceNearDupIndex

    mm = np.memmap(path, dtype=np.uint32, mode="r").reshape(-1, 128)
    n = len(mm)
    ReferenceNearDupIndex(0.8)  # imports datasketch (and scipy) before the baseline
    peak_anon = [_status_kb("RssAnon")]
    base = peak_anon[0]
    done = threading.Event()

    def sample():  # anonymous memory (the signature file's pages are page cache)
        while not done.wait(0.005):
            peak_anon[0] = max(peak_anon[0], _status_kb("RssAnon"))

    threading.Thread(target=sample, daemon=True).start()
    c0 = time.process_time()
    if kind == "old":  # the merge before: one add per file, signatures from the memory map
        index, kept, partner = ReferenceNearDupIndex(0.8), [], np.full(n, -1, dtype=np.int64)
        for e in range(n):
            m = index.add(mm[e])
            if m is None:
                kept.append(e)
            else:
                partner[e] = kept[m[0]]
    else:
        cuts = np.linspace(0, n, blocks + 1).astype(int)
        partner, _ = NearDupIndex(0.8, workdir=os.path.dirname(path)).run(
            [(mm[a:b], np.arange(b - a)) for a, b in zip(cuts, cuts[1:])])
    cpu = time.process_time() - c0
    done.set()
    peak_anon[0] = max(peak_anon[0], _status_kb("RssAnon"))
    print(json.dumps({"kind": kind, "files": n, "cpu_s": cpu, "removed": int((partner >= 0).sum()),
                      "decisions": hashlib.sha256(partner.astype(np.int64).tobytes()).hexdigest(),
                      "anon_base_kb": base, "anon_peak_kb": peak_anon[0],
                      "hwm_kb": _status_kb("VmHWM")}))


def near_dup_index_memory(args) -> None:
    """Merge near-dup index, old (datasketch MinHashLSH) and new (banded NumPy), each in its
    own process on the same memory-mapped signatures: peak memory, CPU time, same decisions."""
    import subprocess

    n = args.near_dup_index
    work = tempfile.mkdtemp(prefix="bench_near_dup_", dir=args.workdir)
    try:
        path = os.path.join(work, "signatures.u32")
        planted_signatures(n).tofile(path)
        runs = {}
        for kind in ("old", "new"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--near-dup-child", kind, path,
                                  "--near-dup-blocks", str(args.near_dup_blocks)],
                                 check=True, capture_output=True, text=True).stdout
            runs[kind] = json.loads(out.strip().splitlines()[-1])
        old, new = runs["old"], runs["new"]
        print(f"signatures: {n} files (10% planted near copies), {os.path.getsize(path) / 1e6:.0f} MB "
              f"on disk, memory-mapped, {args.near_dup_blocks} blocks (shards) for the new index")
        print(f"{'':28s}{'old (MinHashLSH)':>18s}{'new (banded)':>16s}{'old / new':>11s}")
        for label, key in (("peak RSS (VmHWM), MB", "hwm_kb"), ("peak anonymous RSS, MB", "anon_peak_kb")):
            print(f"{label:28s}{old[key] / 1024:18.1f}{new[key] / 1024:16.1f}{old[key] / new[key]:11.2f}")
        grow = {k: (r["anon_peak_kb"] - r["anon_base_kb"]) * 1024 / n for k, r in runs.items()}
        print(f"{'anonymous growth, B/file':28s}{grow['old']:18.0f}{grow['new']:16.0f}"
              f"{grow['old'] / max(grow['new'], 1e-9):11.2f}")
        print(f"{'CPU time, s':28s}{old['cpu_s']:18.2f}{new['cpu_s']:16.2f}{old['cpu_s'] / new['cpu_s']:11.2f}")
        same = old["decisions"] == new["decisions"]
        print(f"removed: old {old['removed']}, new {new['removed']}; identical decisions: {same}")
        if not same:
            raise SystemExit("the two indexes decided differently")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", help="run the at-size benchmark on a generated corpus of this size "
                    "(e.g. 200MB, 1GB)")
    ap.add_argument("--workers", type=int, default=2, help="workers of the at-size run (2)")
    ap.add_argument("--planted-rate", type=float, default=0.05,
                    help="share of files that get a planted near copy (0.05)")
    ap.add_argument("--workdir", help="keep the generated corpus and outputs here")
    ap.add_argument("--scaling", action="store_true",
                    help="at size: also run the shard with one worker and print the wall-clock speed-up of "
                         "--workers over one (side by side in the same run)")
    ap.add_argument("--compare", action="store_true",
                    help="also run the shard without near-dup removal, side by side")
    ap.add_argument("--max-mb", type=float, default=30.0,
                    help="MB of source code to use (30: about the whole standard library); small "
                         "runs understate scaling, since worker start-up and the last chunk weigh more")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=2, help="best of this many timings (2)")
    ap.add_argument("--signatures", action="store_true",
                    help="time the worker's MinHash signature per file, old and new, side by side")
    ap.add_argument("--near-dup-index", type=int, metavar="FILES",
                    help="peak memory of the merge near-dup index, old and new, on this many "
                         "generated signatures (e.g. 200000)")
    ap.add_argument("--near-dup-blocks", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--near-dup-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.near_dup_child:
        return near_dup_index_child(*args.near_dup_child, args.near_dup_blocks)
    if args.near_dup_index:
        return near_dup_index_memory(args)
    if args.signatures:
        return signature_cost(args)
    if args.size:
        return at_size(args)
    docs, texts, mb = select_documents(args.max_mb)
    print(f"files: {len(docs)}, {mb:.2f} MB (standard library of Python {sys.version.split()[0]} + samples)")
    with tempfile.TemporaryDirectory() as work:
        tok = train_sentencepiece((t for _, _, t in texts), work, args.vocab_size, 256, num_threads=2)
        spm = os.path.join(work, "spm.model")
        best = lambda f: min(f() for _ in range(args.repeats))
        t_parse = best(lambda: time_floor(texts, tok)[0])
        t_enc = best(lambda: time_floor(texts, tok)[1])
        t_one = best(lambda: time_pipeline(docs, work, spm, 256, 1))
        t_two = best(lambda: time_pipeline(docs, work, spm, 256, 2))
    floor = mb / (t_parse + t_enc)
    one, two = mb / t_one, mb / t_two
    print(f"tree-sitter parse        {mb / t_parse:8.2f} MB/s")
    print(f"sentencepiece encode     {mb / t_enc:8.2f} MB/s")
    print(f"floor (parse + encode)   {floor:8.2f} MB/s")
    print(f"pipeline, 1 worker       {one:8.2f} MB/s   {one / floor:.2f} x floor   (target >= 0.60)")
    print(f"pipeline, 2 workers      {two:8.2f} MB/s   {two / one:.2f} x 1 worker (target >= 1.70)")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
