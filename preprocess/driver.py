"""What the ``ast-t5-preprocess`` subcommands do (argument parsing lives in cli.py)."""
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict

from .decontamination import Decontaminator, load_benchmark_texts
from .inputs import ReadLimits, iter_documents, read_document
from .merge import merge_shards, missing_shards, package_version, remove_shards, write_outputs
from .shards import run_shard
from .tokenizer import (Tokenizer, TokenizerError, load_tokenizer, sample_documents, train_sentencepiece,
                        write_sample_list)

logger = logging.getLogger(__name__)

# Folders of the interpreter's library that are not the standard library.
DEFAULT_CORPUS_EXCLUDES = ("site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo")


def default_corpus():
    """The embedded default corpus: this interpreter's standard library plus bundled samples."""
    stdlib = sysconfig.get_paths()["stdlib"]
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_corpus")
    return [stdlib, bundled]


def resolve_inputs(args):
    if args.inputs:
        return list(args.inputs), ()
    inputs = default_corpus()
    logger.info("no inputs given: using the default corpus %s", inputs)
    return inputs, DEFAULT_CORPUS_EXCLUDES


def reader_columns(args):
    """The record-file columns named on the command line (None: The Stack's defaults)."""
    from .readers import Columns

    return Columns(getattr(args, "content_column", None), getattr(args, "path_column", None),
                   getattr(args, "lang_column", None))


def _documents(args):
    inputs, excludes = resolve_inputs(args)
    return lambda: iter_documents(inputs, args.language, excludes, reader_columns(args))


SPM_SAMPLE_SEED = 0


def train_tokenizer(args) -> Tokenizer:
    """Train sentencepiece on a reproducible sample of ``--spm-sample-mb`` of the inputs (one
    pass over all of them, see tokenizer.sample_documents) and list the sampled documents in
    ``spm.sample.jsonl``."""
    limits = ReadLimits(max_file_bytes=args.max_file_bytes)
    budget = args.spm_sample_mb * 1e6
    threads = args.spm_threads
    t0 = time.time()
    sample, skipped = sample_documents(_documents(args)(), lambda d: read_document(d, limits),
                                       budget, seed=SPM_SAMPLE_SEED)
    if not sample:
        raise TokenizerError("no readable source files in the inputs to train the tokenizer on "
                             "(check the paths, --language and the skip limits)")
    nbytes = sum(d.num_bytes for d in sample)
    logger.info("training sentencepiece (vocab %d, %d sentinels) on a sample of %d documents, "
                "%.1f MB (budget %.0f MB, seed %d)%s", args.vocab_size, args.num_sentinels,
                len(sample), nbytes / 1e6, args.spm_sample_mb, SPM_SAMPLE_SEED,
                "; unreadable while sampling: " + ", ".join(f"{k}={v}" for k, v in sorted(skipped.items()))
                if skipped else "")
    texts = [d.text for d in sample]
    tok = train_sentencepiece(texts, args.output, args.vocab_size, args.num_sentinels, threads)
    write_sample_list(args.output, sample, SPM_SAMPLE_SEED, budget, tok.sha256)
    logger.info("tokenizer written to %s in %.1fs", args.output, time.time() - t0)
    return tok


def prepare_tokenizer(args) -> Tokenizer:
    os.makedirs(args.output, exist_ok=True)
    target = os.path.join(args.output, "spm.model")
    if args.spm_model:
        if os.path.abspath(args.spm_model) != os.path.abspath(target):
            shutil.copyfile(args.spm_model, target + ".tmp")
            os.replace(target + ".tmp", target)
        tok = Tokenizer(target, args.num_sentinels)
        tok.write_vocab_files(args.output)
        return tok
    if os.path.exists(target):  # from train-spm or an earlier run: it wins over the flags
        if os.path.exists(os.path.join(args.output, "tokenizer.json")):
            return load_tokenizer(args.output)
        tok = Tokenizer(target, args.num_sentinels)
        tok.write_vocab_files(args.output)
        return tok
    if args.shard_id is not None:
        raise TokenizerError(f"no tokenizer in {args.output}: run `ast-t5-preprocess train-spm` "
                             "first so that every shard uses the same one")
    return train_tokenizer(args)


def fingerprint(args, tok: Tokenizer, options) -> str:
    inputs, excludes = resolve_inputs(args)
    bench = [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in args.exclude_benchmark]
    state = dict(inputs=[os.path.abspath(i) for i in inputs], excludes=list(excludes),
                 columns=_jsonable_columns(args),
                 language=args.language, num_shards=args.num_shards, options=_jsonable(options),
                 spm=tok.sha256, num_sentinels=tok.num_sentinels, dedup=not args.no_dedup,
                 benchmarks=bench, version=package_version())
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _jsonable_columns(args):
    cols = reader_columns(args)
    return None if cols == type(cols)() else asdict(cols)  # the defaults keep old fingerprints


def _jsonable(options) -> dict:
    d = asdict(options)
    d["error_policy"] = options.error_policy.value
    return d


def _clear_output(out: str) -> None:
    ours = {"manifest.json", "shards", "spm.model", "dict.txt", "tokenizer.json"}
    if os.path.isdir(out) and os.listdir(out) and not ours & set(os.listdir(out)):
        raise RuntimeError(f"--overwrite refused: {out} does not look like a preprocessed directory")
    shutil.rmtree(out, ignore_errors=True)


def run(args) -> None:
    from .cli import options_from_args

    if args.overwrite:
        _clear_output(args.output)
    manifest_path = os.path.join(args.output, "manifest.json")
    if os.path.exists(manifest_path) and args.shard_id is None:
        logger.info("%s is complete already (use --overwrite to redo it)", args.output)
        with open(manifest_path, encoding="utf-8") as f:
            print_summary(json.load(f))
        return
    options = options_from_args(args)
    tok = prepare_tokenizer(args)
    fp = fingerprint(args, tok, options)
    inputs, excludes = resolve_inputs(args)
    decon = Decontaminator(load_benchmark_texts(args.exclude_benchmark)) if args.exclude_benchmark else None
    ctx_args = (os.path.join(args.output, "spm.model"), tok.num_sentinels, options, decon)
    shard_ids = [args.shard_id] if args.shard_id is not None else range(args.num_shards)
    t0 = time.time()
    for sid in shard_ids:
        run_shard(inputs, args.language, args.output, sid, args.num_shards, ctx_args, args.workers,
                  fp, progress=not args.no_progress, exclude_dirs=excludes,
                  columns=reader_columns(args), log_interval=getattr(args, "log_interval", 60.0))
    logger.info("processed %d shard(s) in %.1fs", len(shard_ids), time.time() - t0)
    if args.shard_id is not None:
        left = missing_shards(args.output, args.num_shards)
        logger.info("shard %d done; %d shard(s) still missing%s", args.shard_id, len(left),
                    "" if left else " -> run `ast-t5-preprocess merge` with the same arguments")
        return
    _merge(args, tok, options, fp)


def merge(args) -> None:
    from .cli import options_from_args

    options = options_from_args(args)
    tok = load_tokenizer(args.output)
    _merge(args, tok, options, fingerprint(args, tok, options))


def _merge(args, tok, options, fp) -> None:
    stats = merge_shards(args.output, args.num_shards, fp, dedup=not args.no_dedup)
    opts = dict(_jsonable(options), num_shards=args.num_shards, dedup=not args.no_dedup,
                language=args.language, exclude_benchmark=[os.path.basename(f) for f in args.exclude_benchmark])
    manifest = write_outputs(args.output, stats, opts, tok)
    if not args.keep_shards:
        remove_shards(args.output)
    print_summary(manifest)


def print_summary(manifest: dict, file=None) -> None:
    file = file or sys.stdout  # looked up now: sys.stdout may have been replaced since import
    cols = ("language", "files", "skipped", "MB", "tokens", "segments", "train/valid/test", "broken AST/naive")
    rows = []
    for lang, s in sorted(manifest["languages"].items()):
        skipped = sum(v for k, v in s.items() if k.startswith("skipped_"))
        rows.append((lang, f"{s.get('files_kept', 0)}/{s.get('files_seen', 0)}", str(skipped),
                     f"{s.get('bytes', 0) / 1e6:.2f}", str(s.get("tokens", 0)), str(s.get("segments", 0)),
                     "/".join(str(s.get(f"{x}_segments", 0)) for x in ("train", "valid", "test")),
                     f"{s.get('broken_nodes_ast', 0)}/{s.get('broken_nodes_naive', 0)}"))
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda r: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
    print(line(cols), file=file)
    for r in rows:
        print(line(r), file=file)
    reasons = {k[8:]: v for k, v in manifest["totals"].items() if k.startswith("skipped_") and v}
    if reasons:
        print("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())), file=file)
