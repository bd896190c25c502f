"""Generate with a trained AST-T5 checkpoint: Python API and the ``ast-t5-generate`` command.

Python::

    from ast_t5.generate import AstT5Generator
    gen = AstT5Generator.from_checkpoint("checkpoints/bugs2fix")          # file or directory
    gen.translate("public void f() { ... }", beam=5)                       # fine-tuned models
    gen.infill("def add(a, b):\\n    <extra_id_0>\\n")                       # filled code
    gen.complete("def add(a, b):\\n    ", sampling=True, top_p=0.95, seed=1)

Command line (JSONL out; prompts from ``--prompt``, a JSONL file, or stdin)::

    ast-t5-generate CHECKPOINT --mode infill --prompt $'def f(x):\\n    <extra_id_0>'
    ast-t5-generate CHECKPOINT --input test.jsonl --field source --beam 5 --output hyps.jsonl
    cat code.py | ast-t5-generate CHECKPOINT --mode complete

The evaluation harness (``ast-t5-eval ... --checkpoint``) uses :func:`load_completion_fn`.
"""
import argparse
import json
import logging
import sys
from typing import Callable, List, Optional, Sequence, Tuple

from .eval.jsonl_io import iter_jsonl
from .generation.checkpoints import CheckpointError
from .generation.generator import AstT5Generator, GenerationOptions  # noqa: F401  (public API)

logger = logging.getLogger(__name__)

PROG = "ast-t5-generate"
MODES = ("translate", "infill", "complete")
CompletionFn = Callable[[List[str], int], List[List[str]]]


def load_completion_fn(checkpoint_dir: str, beam: int = 1, sampling: bool = False,
                       temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 256,
                       length_penalty: float = 1.0, seed: int = 0, tokenizer: Optional[str] = None,
                       device: Optional[str] = None, batch_size: int = 8) -> CompletionFn:
    """The evaluation harness's completion function (see ``ast_t5.eval.completions``).

    ``fn(prompts, num_samples)`` returns, per prompt, ``num_samples`` decoded targets (sentinel
    strings kept; the harness post-processes them). Beam search returns the best beams (the beam
    is widened to ``num_samples`` if needed); sampling returns independent samples.
    """
    generator = AstT5Generator.from_checkpoint(
        checkpoint_dir, tokenizer, device, beam=beam, sampling=sampling, temperature=temperature,
        top_p=top_p, max_new_tokens=max_new_tokens, length_penalty=length_penalty, seed=seed,
        batch_size=batch_size)

    def completion_fn(prompts: List[str], num_samples: int) -> List[List[str]]:
        overrides = {"num_return": num_samples}
        if not sampling:
            overrides["beam"] = max(beam, num_samples)
        sources = [generator.encode_source(p) for p in prompts]
        outputs = generator.generate_ids(sources, **overrides)
        return [[generator.codec.decode(ids) for ids in outs] for outs in outputs]

    return completion_fn


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Generate with an AST-T5 checkpoint; "
                                "writes one JSON object per prompt with a 'generations' list.")
    p.add_argument("checkpoint", help="checkpoint file or directory")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (default: found "
                   "from the checkpoint)")
    p.add_argument("--mode", choices=MODES, default="translate",
                   help="translate: source -> output; infill: fill <extra_id_N> holes; "
                   "complete: continue the prompt (default %(default)s)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--input", metavar="FILE", help="JSONL file of prompts ('-' = stdin)")
    p.add_argument("--field", default="prompt", help="prompt field of --input records "
                   "(default %(default)s; 'source' is used when absent)")
    p.add_argument("--output", metavar="FILE", help="JSONL output (default stdout)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="weights dtype (half precision for GPUs)")
    g = p.add_argument_group("decoding")
    g.add_argument("--beam", type=int, default=1)
    g.add_argument("--sample", action="store_true", help="sampling instead of beam search")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--num-return", type=int, default=1, help="outputs per prompt")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--length-penalty", type=float, default=1.0)
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--seed", type=int, default=0)
    return p


def read_prompts(args) -> Tuple[List[dict], List[str]]:
    """Output records and prompt texts: from --prompt, a JSONL file (records are kept and get
    the generations added), or the whole of stdin as one prompt."""
    if args.prompt:
        return [{"prompt": text} for text in args.prompt], list(args.prompt)
    if not args.input:
        text = sys.stdin.read()
        return [{"prompt": text}], [text]
    stream = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    records, texts = [], []
    with stream:
        for lineno, record in iter_jsonl(stream, args.input):
            field = args.field if args.field in record else "source"
            if not isinstance(record.get(field), str):
                raise ValueError(f"{args.input}:{lineno}: needs a string field {args.field!r}")
            records.append(record)
            texts.append(record[field])
    return records, texts


def run(args) -> int:
    records, texts = read_prompts(args)
    generator = AstT5Generator.from_checkpoint(
        args.checkpoint, args.tokenizer, args.device, args.dtype, beam=args.beam,
        sampling=args.sample, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        num_return=args.num_return, max_new_tokens=args.max_new_tokens,
        length_penalty=args.length_penalty, batch_size=args.batch_size, seed=args.seed)
    outputs = getattr(generator, args.mode)(texts) if texts else []
    lines = []
    for record, out in zip(records, outputs):
        record["generations"] = out if isinstance(out, list) else [out]
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    write_lines(args.output, lines)
    return 0


def write_lines(path: Optional[str], lines: Sequence[str]) -> None:
    """To stdout, or to ``path`` atomically."""
    if not path:
        sys.stdout.write("".join(lines))
        return
    from .eval.jsonl_io import write_text_atomic

    write_text_atomic(path, "".join(lines))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; returns the exit status (2 with a one-line message on bad input)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
