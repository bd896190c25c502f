"""Run the pipeline over one shard of the corpus, and merge finished shards into the dataset.

A source file of a directory belongs to shard ``hash(key) % num_shards``; record files (Parquet,
JSONL, Arrow) are split into units (a Parquet row group, a JSONL file, an Arrow file) assigned by
size (units.py), and a shard job opens and decompresses only its own units. Shards can run
independently (one per cluster job). Each shard is written to a temporary folder and renamed when complete; a rerun
skips complete shards, so a killed run finishes where it stopped and gives the same bytes as an
uninterrupted one. Exact duplicates (same content hash) are dropped inside a shard while it runs
and across shards when merging (the copy in the lowest shard, earliest in walk order, is kept).
Each shard also stores the MinHash signature of every kept file (``<lang>/<split>.minhash.u32``:
rows of uint32, streamed to disk, for near-duplicate removal at merge, see near_dup.py) and ``skipped.jsonl``, one line per skipped
file and per kept file with parse errors (the ``--report``).
"""
import contextlib
import glob
import itertools
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
from collections import Counter, defaultdict, deque
from typing import Dict, Iterable, List, Optional

import numpy as np

from .formats import AST_DTYPE, IndexedWriter, token_dtype
from .inputs import input_bytes, iter_documents, stable_hash
from .pipeline import FileResult, WorkerContext, process_document

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_CTX: Optional[WorkerContext] = None  # one per worker process, set by the pool initializer
IMAP_CHUNKSIZE = 32  # documents per task sent to a worker: fewer round trips through the pipes
MAX_POOL_RESTARTS = 3  # a lost worker (OOM killer, kill -9) reruns the batches in flight
SKIPPED_FILE = "skipped.jsonl"  # per shard: every skipped file, and kept files with parse errors
ERROR_RATIO_BINS = ((0.0, "0"), (0.01, "le_0.01"), (0.05, "le_0.05"), (0.2, "le_0.2"),
                    (0.5, "le_0.5"), (1.0, "le_1"))


def shard_dir(out_dir: str, shard_id: int, num_shards: int) -> str:
    return os.path.join(out_dir, "shards", f"shard-{shard_id:05d}-of-{num_shards:05d}")


def shard_of(key: str, num_shards: int) -> int:
    return stable_hash("shard:" + key) % num_shards if num_shards > 1 else 0


def shard_documents(inputs, language, shard_id: int, num_shards: int, exclude_dirs=(), columns=None,
                    counter=None, assignment=None):
    """The documents of one shard, reading only its units of record files; ``counter``
    (progress.InputCounter) sees every document read. ``assignment`` (units.Assignment of the
    same inputs and ``num_shards``) is listed from the inputs when not given."""
    select = None
    if num_shards > 1:
        from .units import Assignment

        if assignment is None:
            assignment = Assignment.of(inputs, language, exclude_dirs, num_shards)
        select = assignment.selection(shard_id)
    docs = iter_documents(inputs, language, exclude_dirs, columns, select=select)
    if counter is not None:
        docs = counter.count(docs)
    yield from docs


def _init_worker(ctx_args) -> None:
    global _CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the main process ends the pool, quietly
    _CTX = WorkerContext(*ctx_args)


def _results(docs: Iterable, ctx_args, workers: int) -> Iterable[FileResult]:
    """Results in document order, from a process pool when workers > 1."""
    if workers <= 1:
        ctx = WorkerContext(*ctx_args)
        for doc in docs:
            yield process_document(doc, ctx)
        return
    yield from _pool_results(docs, ctx_args, workers)


def _work_batch(batch) -> List[FileResult]:
    return [process_document(doc, _CTX) for doc in batch]


def _pool_results(docs: Iterable, ctx_args, workers: int) -> Iterable[FileResult]:
    """Batches of documents through a process pool, results in order, a bounded window in flight.

    When a worker dies (the OOM killer, kill -9), ``multiprocessing.Pool`` waits forever for its
    task; ``ProcessPoolExecutor`` reports it instead (``BrokenProcessPool``). The batches in
    flight then run again on a new pool, up to MAX_POOL_RESTARTS times, after which the run stops
    with one line. The output is the same as without the loss, since results keep their order.
    """
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    mp_ctx = mp.get_context("fork" if hasattr(os, "fork") else "spawn")

    def new_pool():
        return ProcessPoolExecutor(workers, mp_context=mp_ctx, initializer=_init_worker,
                                   initargs=(ctx_args,))

    def submit(batch):
        # The executor forks its workers inside submit(); a Ctrl-C inside fork's hooks would be
        # swallowed (printed, ignored), so it is held there and raised after.
        with deferred_sigint():
            return pool.submit(_work_batch, batch)

    it = iter(docs)
    window = 4 * workers
    pending: deque = deque()  # [batch, future]
    restarts = 0
    pool = new_pool()
    try:
        while True:
            while len(pending) < window:
                batch = list(itertools.islice(it, IMAP_CHUNKSIZE))
                if not batch:
                    break
                pending.append([batch, submit(batch)])
            if not pending:
                return
            try:
                results = pending[0][1].result()
            except BrokenProcessPool:
                restarts += 1
                pool.shutdown(wait=True, cancel_futures=True)
                if restarts > MAX_POOL_RESTARTS:
                    raise RuntimeError(
                        f"a worker process died {restarts} times (killed, or out of memory: see "
                        "dmesg); lower --workers or --max-file-bytes and rerun") from None
                logger.warning("a worker process died; rerunning its %d batch(es) on a new pool "
                               "(%d/%d)", len(pending), restarts, MAX_POOL_RESTARTS)
                pool = new_pool()
                for item in pending:
                    item[1] = submit(item[0])
                continue
            pending.popleft()
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def deferred_sigint():
    """Hold a Ctrl-C that arrives inside the block and raise it (KeyboardInterrupt) at its end.

    Python runs at-fork callbacks (logging's lock handling) where an exception is only printed,
    so a Ctrl-C while the pool forks its workers would otherwise be lost and the run go on.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class ShardWriter:
    """Per (language, split) token and AST datasets of one shard, plus per-file records."""

    def __init__(self, root: str, vocab_size: int):
        self.root, self.dtype = root, token_dtype(vocab_size)
        self.writers: Dict[tuple, tuple] = {}
        self.files: Dict[str, List[list]] = defaultdict(list)  # "lang/split" -> [hash, segs, toks]
        self.keys: Dict[str, List[str]] = defaultdict(list)  # "lang/split" -> document keys
        self.signatures: Dict[str, object] = {}  # "lang/split" -> open signature file

    def add(self, res: FileResult, eos: int) -> None:
        key = (res.language, res.split)
        if key not in self.writers:
            os.makedirs(os.path.join(self.root, res.language), exist_ok=True)
            prefix = os.path.join(self.root, res.language, res.split)
            self.writers[key] = (IndexedWriter(prefix, self.dtype), IndexedWriter(prefix + ".ast", AST_DTYPE))
        tok_w, ast_w = self.writers[key]
        for toks, rows in zip(res.tokens, res.asts):
            tok_w.add(_with_eos(toks, eos))
            ast_w.add(rows.reshape(-1))
        ntok = sum(len(t) + 1 for t in res.tokens)
        group = f"{res.language}/{res.split}"
        self.files[group].append([res.content_hash.hex(), len(res.tokens), ntok])
        self.keys[group].append(res.key)
        if res.minhash is not None:
            if group not in self.signatures:
                self.signatures[group] = open(signature_path(self.root, group), "wb")
            self.signatures[group].write(np.ascontiguousarray(res.minhash, dtype=np.uint32).tobytes())

    def close(self) -> None:
        for tok_w, ast_w in self.writers.values():
            tok_w.close()
            ast_w.close()
        for f in self.signatures.values():
            f.close()


def signature_path(root: str, group: str) -> str:
    return os.path.join(root, group + ".minhash.u32")


def read_signatures(root: str, group: str, num_files: int):
    """(num_files, num_perm) uint32 signatures of a group, memory-mapped."""
    path = signature_path(root, group)
    flat = np.memmap(path, dtype=np.uint32, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint32)
    if num_files == 0 or flat.size % num_files:
        raise RuntimeError(f"{path}: {flat.size} values for {num_files} files")
    return flat.reshape(num_files, -1)


def report_entry(res: FileResult) -> dict:
    """One line of the skip report (``--report``)."""
    entry = {"path": res.key, "language": res.language, "reason": res.skip or "kept_with_parse_errors",
             "skipped": bool(res.skip), "error_ratio": round(res.error_ratio, 4)}
    if res.decontaminated_by:
        entry["benchmark"] = res.decontaminated_by
    return entry


def _with_eos(toks, eos):
    import numpy as np

    out = np.empty(len(toks) + 1, dtype=np.int64)
    out[:-1], out[-1] = toks, eos
    return out


def new_stats() -> Counter:
    return Counter()


def record(stats: Dict[str, Counter], res: FileResult) -> None:
    s = stats[res.language or "unknown"]
    s["files_seen"] += 1
    if res.skip == "parse_errors" or (not res.skip and res.num_nodes):
        s["error_ratio_" + next(name for hi, name in ERROR_RATIO_BINS if res.error_ratio <= hi)] += 1
    if res.decontaminated_by:
        s["decontaminated_by_" + res.decontaminated_by] += 1
    if res.skip:
        s["skipped_" + res.skip] += 1
        return
    s["ast_subtrees_cut_depth"] += res.ast_depth_cut
    s["files_kept"] += 1
    s["bytes"] += res.num_bytes
    s["tokens"] += sum(len(t) + 1 for t in res.tokens)
    s["segments"] += len(res.tokens)
    s["files_split"] += len(res.tokens) > 1
    s["files_with_parse_errors"] += res.had_parse_errors
    s["nodes"] += res.num_nodes
    s["broken_nodes_ast"] += res.broken_ast
    s["broken_nodes_naive"] += res.broken_naive


def run_shard(inputs, language, out_dir: str, shard_id: int, num_shards: int, ctx_args,
              workers: int, fingerprint: str, progress: bool = True, exclude_dirs=(),
              documents=None, columns=None, log_interval: float = 60.0, assignment=None) -> dict:
    """Process one shard if it is not complete yet; return its stats.

    ``documents`` replaces the walk of ``inputs`` (benchmarks and tests pass a fixed list).
    ``assignment`` (units.Assignment) is which record units each shard reads; its digest must be
    part of ``fingerprint`` (driver.fingerprint does it) so that shards never mix assignments.
    ``progress`` shows a bar on a terminal, else logs a line every ``log_interval`` seconds.
    """
    final = shard_dir(out_dir, shard_id, num_shards)
    done = _load_complete(final, fingerprint)
    if done is not None:
        logger.info("shard %d/%d already complete, skipping", shard_id, num_shards)
        return done
    remove_stale_temporaries(final)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        out = _run_shard(inputs, language, tmp, shard_id, num_shards, ctx_args, workers, fingerprint,
                         progress, exclude_dirs, documents, columns, log_interval, assignment)
    except BaseException:  # Ctrl-C, a fatal error: leave no half-written shard behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return out


def remove_stale_temporaries(final: str) -> None:
    """Temporary folders of this shard left by killed runs (``shard-...tmp-PID``)."""
    for stale in glob.glob(glob.escape(final) + ".tmp-*"):
        logger.info("removing %s, left by an interrupted run", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _run_shard(inputs, language, tmp, shard_id, num_shards, ctx_args, workers, fingerprint,
               progress, exclude_dirs, documents, columns, log_interval, assignment=None) -> dict:
    from .progress import InputCounter, Progress

    spm_model, num_sentinels = ctx_args[0], ctx_args[1]
    from .tokenizer import Tokenizer

    tok = Tokenizer(spm_model, num_sentinels)
    writer = ShardWriter(tmp, tok.vocab_size)
    stats: Dict[str, Counter] = defaultdict(new_stats)
    seen = set()
    counter = InputCounter()
    if documents is not None:
        docs, total = counter.count(documents), 0
    else:
        if num_shards > 1 and assignment is None:
            from .units import Assignment

            assignment = Assignment.of(inputs, language, exclude_dirs, num_shards)
        docs = shard_documents(inputs, language, shard_id, num_shards, exclude_dirs, columns, counter,
                               assignment)
        total = shard_input_bytes(inputs, language, exclude_dirs, shard_id, assignment) if progress else 0
    bar = Progress(f"shard {shard_id + 1}/{num_shards}", total, counter, enabled=progress,
                   log_interval=log_interval)
    report = open(os.path.join(tmp, SKIPPED_FILE), "w", encoding="utf-8")
    for res in _results(docs, ctx_args, workers):
        if not res.skip and res.content_hash in seen:
            res = FileResult(res.language, skip="duplicate", key=res.key)
        if res.skip or res.error_ratio > 0:
            report.write(json.dumps(report_entry(res), sort_keys=True) + "\n")
            if res.skip:
                logger.debug("skipped %s (%s): %s", res.key, res.language, res.skip)
        if not res.skip:
            seen.add(res.content_hash)
            writer.add(res, eos=2)
        record(stats, res)
        bar.update(not res.skip, res.num_bytes if not res.skip else 0)
    bar.close()
    report.close()
    writer.close()
    out = {"fingerprint": fingerprint, "stats": {k: dict(v) for k, v in sorted(stats.items())},
           "files": dict(sorted(writer.files.items())), "keys": dict(sorted(writer.keys.items()))}
    with open(os.path.join(tmp, "shard.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, sort_keys=True)
    return out


def shard_input_bytes(inputs, language, exclude_dirs, shard_id: int, assignment=None) -> int:
    """Bytes of input one shard job reads (the progress total): its record units, plus its share
    of the source files (estimated as an even split: they are hashed one by one)."""
    total = input_bytes(inputs, language, exclude_dirs)
    if assignment is None or assignment.num_shards <= 1:
        return total
    source = max(0, total - sum(u.size for u in assignment.units))
    return assignment.unit_bytes(shard_id) + source // assignment.num_shards


def _load_complete(path: str, fingerprint: str) -> Optional[dict]:
    meta = os.path.join(path, "shard.json")
    if not os.path.exists(meta):
        return None
    with open(meta, encoding="utf-8") as f:
        done = json.load(f)
    if done.get("fingerprint") != fingerprint:
        raise RuntimeError(f"{path} was made with other options, inputs or shard assignment "
                           "(input sizes, or an older version's scheme); use another --output "
                           "directory or --overwrite")
    return done
