"""Run the pipeline over one shard of the corpus, and merge finished shards into the dataset.

A document belongs to shard ``hash(key) % num_shards``, so shards can run independently (one per
cluster job). Each shard is written to a temporary folder and renamed when complete; a rerun
skips complete shards, so a killed run finishes where it stopped and gives the same bytes as an
uninterrupted one. Exact duplicates (same content hash) are dropped inside a shard while it runs
and across shards when merging (the copy in the lowest shard, earliest in walk order, is kept).
"""
import contextlib
import glob
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Optional

from .formats import AST_DTYPE, IndexedWriter, token_dtype
from .inputs import input_bytes, iter_documents, stable_hash
from .pipeline import FileResult, WorkerContext, process_document

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_CTX: Optional[WorkerContext] = None  # one per worker process, set by the pool initializer
IMAP_CHUNKSIZE = 32  # documents per task sent to a worker: fewer round trips through the pipes


def shard_dir(out_dir: str, shard_id: int, num_shards: int) -> str:
    return os.path.join(out_dir, "shards", f"shard-{shard_id:05d}-of-{num_shards:05d}")


def shard_of(key: str, num_shards: int) -> int:
    return stable_hash("shard:" + key) % num_shards if num_shards > 1 else 0


def shard_documents(inputs, language, shard_id: int, num_shards: int, exclude_dirs=(), columns=None,
                    counter=None):
    """The documents of one shard; ``counter`` (progress.InputCounter) sees every document."""
    docs = iter_documents(inputs, language, exclude_dirs, columns)
    if counter is not None:
        docs = counter.count(docs)
    for doc in docs:
        if num_shards == 1 or shard_of(doc.key, num_shards) == shard_id:
            yield doc


def _init_worker(ctx_args) -> None:
    global _CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the main process ends the pool, quietly
    _CTX = WorkerContext(*ctx_args)


def _work(doc) -> FileResult:
    return process_document(doc, _CTX)


def _results(docs: Iterable, ctx_args, workers: int) -> Iterable[FileResult]:
    """Results in document order, from a process pool when workers > 1."""
    if workers <= 1:
        ctx = WorkerContext(*ctx_args)
        for doc in docs:
            yield process_document(doc, ctx)
        return
    with deferred_sigint():  # a Ctrl-C inside fork's hooks would be swallowed (printed, ignored)
        pool = mp.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(
            workers, initializer=_init_worker, initargs=(ctx_args,))
    with pool:
        yield from pool.imap(_work, docs, chunksize=IMAP_CHUNKSIZE)


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
        self.files[f"{res.language}/{res.split}"].append([res.content_hash.hex(), len(res.tokens), ntok])

    def close(self) -> None:
        for tok_w, ast_w in self.writers.values():
            tok_w.close()
            ast_w.close()


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
    if res.skip:
        s["skipped_" + res.skip] += 1
        return
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
              documents=None, columns=None, log_interval: float = 60.0) -> dict:
    """Process one shard if it is not complete yet; return its stats.

    ``documents`` replaces the walk of ``inputs`` (benchmarks and tests pass a fixed list).
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
                         progress, exclude_dirs, documents, columns, log_interval)
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
               progress, exclude_dirs, documents, columns, log_interval) -> dict:
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
        docs = shard_documents(inputs, language, shard_id, num_shards, exclude_dirs, columns, counter)
        total = input_bytes(inputs, language, exclude_dirs) if progress else 0
    bar = Progress(f"shard {shard_id + 1}/{num_shards}", total, counter, enabled=progress,
                   log_interval=log_interval)
    for res in _results(docs, ctx_args, workers):
        if not res.skip and res.content_hash in seen:
            res = FileResult(res.language, skip="duplicate")
        if not res.skip:
            seen.add(res.content_hash)
            writer.add(res, eos=2)
        record(stats, res)
        bar.update(not res.skip, res.num_bytes if not res.skip else 0)
    bar.close()
    writer.close()
    out = {"fingerprint": fingerprint, "stats": {k: dict(v) for k, v in sorted(stats.items())},
           "files": dict(sorted(writer.files.items()))}
    with open(os.path.join(tmp, "shard.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, sort_keys=True)
    return out


def _load_complete(path: str, fingerprint: str) -> Optional[dict]:
    meta = os.path.join(path, "shard.json")
    if not os.path.exists(meta):
        return None
    with open(meta, encoding="utf-8") as f:
        done = json.load(f)
    if done.get("fingerprint") != fingerprint:
        raise RuntimeError(f"{path} was made with other options or inputs; "
                           "use another --output directory or --overwrite")
    return done
