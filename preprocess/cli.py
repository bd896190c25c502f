"""``ast-t5-preprocess``: turn a corpus of code into AST-T5 training data.

Examples::

    # everything in one go (trains the tokenizer, processes all shards, merges)
    ast-t5-preprocess run ~/code/repos corpus.jsonl -o data/bin --workers 8

    # no input: the embedded default corpus (this interpreter's standard library + samples)
    ast-t5-preprocess run -o data/default

    # on a cluster: tokenizer once, then one job per shard, then merge
    ast-t5-preprocess train-spm ~/code -o data/bin --vocab-size 32000
    ast-t5-preprocess run ~/code -o data/bin --num-shards 64 --shard-id $SLURM_ARRAY_TASK_ID
    ast-t5-preprocess merge ~/code -o data/bin --num-shards 64
"""
import argparse
import logging
import os
import sys

from .inputs import ReadLimits
from .parsing import ErrorPolicy
from .pipeline import PipelineOptions
from .tokenizer import DEFAULT_NUM_SENTINELS, DEFAULT_VOCAB_SIZE, TokenizerError

logger = logging.getLogger("ast_t5_preprocess")

SPM_THREADS = 4


def _add_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="*", help="directories (recursive), JSONL files (one record per "
                   "file: content + path/lang fields) or single files; none = the default corpus")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--language", help="force this language for every input (default: from the "
                   "extension, or the JSONL record's lang/language field)")


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
    p.add_argument("--parse-error-policy", choices=[e.value for e in ErrorPolicy], default="skip",
                   help="what to do with files whose error ratio exceeds --max-error-ratio: skip "
                   "them, keep the tree with ERROR nodes, or keep the tokens flat (root only)")
    p.add_argument("--max-error-ratio", type=float, default=0.05,
                   help="share of bytes under ERROR nodes tolerated as is (0.05)")
    p.add_argument("--exclude-benchmark", action="append", default=[], metavar="FILE",
                   help="drop files sharing a 13-word run with this text/JSONL file (repeatable)")
    p.add_argument("--no-dedup", action="store_true", help="keep exact duplicate files")
    p.add_argument("--keep-shards", action="store_true", help="keep shards/ after merging")
    p.add_argument("--overwrite", action="store_true", help="delete previous outputs first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    return parser


def options_from_args(args) -> PipelineOptions:
    return PipelineOptions(
        max_tokens=args.max_tokens, valid_ratio=args.valid_ratio, test_ratio=args.test_ratio,
        error_policy=ErrorPolicy(args.parse_error_policy), max_error_ratio=args.max_error_ratio,
        limits=ReadLimits(args.max_file_bytes, args.max_line_length, args.max_mean_line_length),
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
        (args.vocab_size > 4, "--vocab-size must be > 4"),
        (args.num_sentinels >= 1, "--num-sentinels must be >= 1"),
    ]
    for ok, msg in checks:
        if not ok:
            raise SystemExit(f"ast-t5-preprocess: error: {msg}")
    if args.language:
        from .languages import LANGUAGES, normalize_language

        lang = normalize_language(args.language)
        if lang is None:
            raise SystemExit(f"ast-t5-preprocess: error: unknown --language {args.language!r} "
                             f"(known: {', '.join(sorted(LANGUAGES))})")
        args.language = lang
    for inp in args.inputs:
        if not os.path.exists(inp):
            raise SystemExit(f"ast-t5-preprocess: error: input not found: {inp}")
    for f in getattr(args, "exclude_benchmark", []):
        if not os.path.isfile(f):
            raise SystemExit(f"ast-t5-preprocess: error: benchmark file not found: {f}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    validate(args)
    from . import driver

    try:
        if args.command == "train-spm":
            driver.train_tokenizer(args)
        elif args.command == "run":
            driver.run(args)
        else:
            driver.merge(args)
    except (TokenizerError, RuntimeError, FileNotFoundError) as e:
        print(f"ast-t5-preprocess: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
