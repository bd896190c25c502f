"""What the ``ast-t5-preprocess`` subcommands do (argument parsing lives in cli.py)."""
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import asdict

from .decontamination import Decontaminator, load_benchmarks, resolve_benchmark
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
                "%s (budget %.0f MB, seed %d)%s", args.vocab_size, args.num_sentinels,
                len(sample), human_size(nbytes), args.spm_sample_mb, SPM_SAMPLE_SEED,
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


def human_size(num_bytes: float) -> str:
    """``532 B``, ``12.3 KB``, ``64.0 MB``, ``1.20 GB``: what the logs print."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{int(num_bytes)} B"


def _benchmark_digests(specs):
    out = []
    for spec in specs:
        name, path = resolve_benchmark(spec)
        with open(path, "rb") as f:
            out.append([name, hashlib.sha256(f.read()).hexdigest()])
    return out


def shard_assignment(args):
    """Which record units each shard reads (units.Assignment), None for an unsharded run."""
    if args.num_shards <= 1:
        return None
    from .units import Assignment

    inputs, excludes = resolve_inputs(args)
    return Assignment.of(inputs, args.language, excludes, args.num_shards)


def fingerprint(args, tok: Tokenizer, options, assignment=None) -> str:
    """What a shard was made with; a sharded run adds its assignment (scheme and every unit's
    size and shard, see units.py), so shards of another assignment are refused, never mixed."""
    inputs, excludes = resolve_inputs(args)
    bench = _benchmark_digests(args.exclude_benchmark)
    state = dict(inputs=[os.path.abspath(i) for i in inputs], excludes=list(excludes),
                 columns=_jsonable_columns(args),
                 language=args.language, num_shards=args.num_shards, options=_jsonable(options),
                 spm=tok.sha256, num_sentinels=tok.num_sentinels, dedup=not args.no_dedup,
                 benchmarks=bench, version=package_version())
    if args.num_shards > 1:
        state["assignment"] = (assignment or shard_assignment(args)).digest()
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


def request_fingerprint(args) -> str:
    """Hash of what a ``run`` was asked for (inputs, options, tokenizer flags), known before any
    work: a finished output directory refuses a rerun that asks for something else."""
    from .cli import options_from_args

    inputs, excludes = resolve_inputs(args)
    spm = None
    if args.spm_model and os.path.exists(args.spm_model):
        with open(args.spm_model, "rb") as f:
            spm = hashlib.sha256(f.read()).hexdigest()
    state = dict(inputs=[os.path.abspath(i) for i in inputs], excludes=list(excludes),
                 language=args.language, num_shards=args.num_shards,
                 options=_jsonable(options_from_args(args)), dedup=not args.no_dedup,
                 benchmarks=_benchmark_digests(args.exclude_benchmark), spm_model=spm,
                 vocab_size=args.vocab_size, num_sentinels=args.num_sentinels,
                 spm_sample_mb=args.spm_sample_mb, spm_threads=args.spm_threads)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _finished_output(args, manifest_path: str) -> bool:
    """True if ``args.output`` is finished with the same request; refuses if it differs."""
    if not os.path.exists(manifest_path) or args.shard_id is not None:
        return False
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    done = manifest.get("request_fingerprint")
    if done is not None and done != request_fingerprint(args):
        raise RuntimeError(f"{args.output} is finished with other inputs or options; use "
                           "another --output or --overwrite")
    logger.info("%s is complete already (use --overwrite to redo it)", args.output)
    print_summary(manifest)
    return True


def run(args) -> None:
    """``run``, removing the output directory again if this run created it and failed."""
    created = not os.path.exists(args.output) or (args.overwrite and args.shard_id is None)
    try:
        _run(args)
    except Exception:
        if created and args.shard_id is None and not _has_kept_work(args.output):
            shutil.rmtree(args.output, ignore_errors=True)
        raise


def _has_kept_work(out: str) -> bool:
    """Whether a complete shard of ``out`` kept a file (work that a rerun would resume)."""
    root = os.path.join(out, "shards")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        meta = os.path.join(root, name, "shard.json")
        if os.path.exists(meta):
            with open(meta, encoding="utf-8") as f:
                if any(s.get("files_kept", 0) for s in json.load(f)["stats"].values()):
                    return True
    return False


def _run(args) -> None:
    from .cli import options_from_args

    if args.overwrite:
        _clear_output(args.output)
    manifest_path = os.path.join(args.output, "manifest.json")
    if _finished_output(args, manifest_path):
        return
    options = options_from_args(args)
    tok = prepare_tokenizer(args)
    assignment = shard_assignment(args)
    fp = fingerprint(args, tok, options, assignment)
    inputs, excludes = resolve_inputs(args)
    decon = Decontaminator(load_benchmarks(args.exclude_benchmark)) if args.exclude_benchmark else None
    ctx_args = (os.path.join(args.output, "spm.model"), tok.num_sentinels, options, decon)
    shard_ids = [args.shard_id] if args.shard_id is not None else range(args.num_shards)
    t0 = time.time()
    for sid in shard_ids:
        run_shard(inputs, args.language, args.output, sid, args.num_shards, ctx_args, args.workers,
                  fp, progress=not args.no_progress, exclude_dirs=excludes,
                  columns=reader_columns(args), log_interval=getattr(args, "log_interval", 60.0),
                  assignment=assignment)
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
    stats, info = merge_shards(args.output, args.num_shards, fp, dedup=not args.no_dedup,
                               near_dup_threshold=options.near_dup_threshold,
                               valid_ratio=options.valid_ratio, report_path=getattr(args, "report", None))
    _check_usable(stats)
    opts = dict(_jsonable(options), num_shards=args.num_shards, dedup=not args.no_dedup,
                language=args.language,
                exclude_benchmark=[resolve_benchmark(b)[0] for b in args.exclude_benchmark])
    manifest = write_outputs(args.output, stats, opts, tok, extra=_manifest_extra(args, stats, info))
    if not args.keep_shards:
        remove_shards(args.output)
    print_summary(manifest)
    if getattr(args, "report", None):
        logger.info("skip report: %s", args.report)


def _check_usable(stats) -> None:
    """No kept file at all is a failed run (one line, non-zero exit), not an empty dataset."""
    if any(s.get("files_kept", 0) > 0 for s in stats.values()):
        return
    seen = sum(s.get("files_seen", 0) for s in stats.values())
    reasons = sum((Counter({k[8:]: v for k, v in s.items() if k.startswith("skipped_") and v})
                   for s in stats.values()), Counter())
    why = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "no source files found"
    raise RuntimeError(f"no usable input: {seen} file(s) seen, none kept ({why}); "
                       "-v or --report FILE lists them")


def _manifest_extra(args, stats, info) -> dict:
    """Manifest entries of near-duplicate removal, decontamination and the parse-error policy."""
    from .parsing import DEFAULT_MAX_ERROR_RATIO, FALLBACK_MAX_ERROR_RATIO

    benchmarks = {}
    for spec in args.exclude_benchmark:
        name = resolve_benchmark(spec)[0]
        benchmarks[name] = sum(s.get("decontaminated_by_" + name, 0) for s in stats.values())
    thresholds = {l: (args.max_error_ratio if args.max_error_ratio is not None
                      else DEFAULT_MAX_ERROR_RATIO.get(l, FALLBACK_MAX_ERROR_RATIO))
                  for l in sorted(stats) if l not in ("text", "unknown")}
    return {"request_fingerprint": request_fingerprint(args), "near_duplicates": info["near_duplicates"],
            "decontamination": benchmarks, "max_error_ratio": thresholds,
            "no_valid_split": info["no_valid_split"]}


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
