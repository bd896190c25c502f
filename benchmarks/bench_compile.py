"""What ``model.compile_scope`` costs and saves: the first training step (torch.compile's time) and
the steady-state step of T5-base, with the whole training forward in one graph (``model``) against
one graph per layer class (``layers``), eager beside them.

    python benchmarks/bench_compile.py                       # CPU, T5-base, B2 x 128/64
    python benchmarks/bench_compile.py --device cuda         # GPU: B32 x 512/128, bf16 autocast

Each variant runs in a fresh process with inductor's caches off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES``
and an empty cache folder), so every first step compiles from nothing, as a run on a new machine
does; the variants alternate over ``--repeats`` rounds. Per variant: the first step's seconds (its
compile, logged by the model as ``compile_seconds``), the graphs dynamo made, and the median of
``--steps`` later steps (AdamW, cross-entropy on the logits, `bench_model.make_step`); then the
ratios of ``layers`` to ``model``, on medians over the rounds. ``--json`` writes every figure
(atomically).
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model  # noqa: E402

logger = logging.getLogger("bench_compile")
VARIANTS = ("eager", "model", "layers")


def worker(args) -> dict:
    """One variant in this process: the first step, then ``args.steps`` timed steps."""
    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import _compiled_graph_count

    device = torch.device(args.device)
    shape = bench_model.Shape(args.vocab, args.batch, args.src_len, args.tgt_len)
    torch.manual_seed(0)
    compiled = args.worker != "eager"
    model = AstT5Model.from_dictionary(
        bench_model.make_dictionary(shape.vocab), arch=args.arch, dropout=0.0, attention_dropout=0.0,
        attention_backend=args.backend, compile=compiled, compile_backend=args.compile_backend,
        compile_scope=args.worker if compiled else "model").to(device).train()
    step = bench_model.make_step(model, bench_model.ours_logits, bench_model.make_batch(shape, device),
                                 torch.bfloat16 if device.type == "cuda" else None)
    graphs_before = _compiled_graph_count()  # dynamo's counter is the process's (a fresh one here, not in tests)
    start = time.perf_counter()
    first_loss = float(step())
    first = time.perf_counter() - start
    seconds = [bench_model.time_steps(step, 1, device) for _ in range(args.steps)]
    return {"variant": args.worker, "first_step_s": first, "compile_s": model.compile_seconds,
            "graphs": _compiled_graph_count() - graphs_before, "step_ms": statistics.median(seconds) * 1e3,
            "first_loss": first_loss}


def run_variant(variant: str, args) -> dict:
    """`worker` for ``variant`` in a child process with empty, unshared inductor caches."""
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as cache:
        out = os.path.join(cache, "result.json")
        env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCHINDUCTOR_CACHE_DIR=cache,
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--result", out,
               "--device", args.device, "--arch", args.arch, "--vocab", str(args.vocab), "--batch", str(args.batch),
               "--src-len", str(args.src_len), "--tgt-len", str(args.tgt_len), "--steps", str(args.steps),
               "--backend", args.backend, "--compile-backend", args.compile_backend]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SystemExit(f"bench_compile: the {variant} run failed (exit {proc.returncode}): {tail[0]}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--arch", default="t5_v11_base")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=0, help="default: 32 on cuda, 2 on cpu")
    p.add_argument("--src-len", type=int, default=0, help="default: 512 on cuda, 128 on cpu")
    p.add_argument("--tgt-len", type=int, default=0, help="default: 128 on cuda, 64 on cpu")
    p.add_argument("--steps", type=int, default=5, help="timed steps after the first (median)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; each runs every variant in a new process")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--backend", default="auto", help="model.attention_backend")
    p.add_argument("--compile-backend", default="inductor", help="model.compile_backend")
    p.add_argument("--json", default="", help="write every figure to this JSON file")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.batch = args.batch or (32 if cuda else 2)
    args.src_len = args.src_len or (512 if cuda else 128)
    args.tgt_len = args.tgt_len or (128 if cuda else 64)
    if min(args.steps, args.repeats, args.batch, args.src_len, args.tgt_len) < 1:
        p.error("--steps, --repeats, --batch, --src-len and --tgt-len must be >= 1")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        bench_model.write_json(args.result, worker(args))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    runs = {v: [] for v in args.variants}
    for r in range(args.repeats):
        for variant in (args.variants if r % 2 == 0 else args.variants[::-1]):
            result = run_variant(variant, args)
            runs[variant].append(result)
            logger.info("round %d %-6s first step %.1f s (compile %.1f s, %d graphs), step %.1f ms",
                        r + 1, variant, result["first_step_s"], result["compile_s"], result["graphs"],
                        result["step_ms"])
            if args.json:  # after every run: a time limit on the next one keeps this one's figures
                bench_model.write_json(args.json, {"device": device, "torch": torch.__version__, "args": vars(args),
                                                   "runs": runs, "partial": "not every run has finished"})
    median = {v: {k: statistics.median(x[k] for x in rs) for k in ("first_step_s", "compile_s", "step_ms")}
              for v, rs in runs.items()}
    logger.info("%s, torch %s; %s B%d x %d/%d, %s attention, %s; medians of %d rounds:", device,
                torch.__version__, args.arch, args.batch, args.src_len, args.tgt_len, args.backend,
                args.compile_backend, args.repeats)
    for v, m in median.items():
        logger.info("  %-6s first step %7.1f s   compile %7.1f s   step %9.1f ms   graphs %d", v,
                    m["first_step_s"], m["compile_s"], m["step_ms"], runs[v][0]["graphs"])
    ratios = {}
    if "model" in median and "layers" in median:
        ratios = {"compile_layers_over_model": median["layers"]["compile_s"] / median["model"]["compile_s"],
                  "step_layers_over_model": median["layers"]["step_ms"] / median["model"]["step_ms"]}
        logger.info("layers / model: compile time %.2fx, step time %.2fx",
                    ratios["compile_layers_over_model"], ratios["step_layers_over_model"])
    if args.json:
        bench_model.write_json(args.json, {"device": device, "torch": torch.__version__, "args": vars(args),
                                           "runs": runs, "median": median, "ratios": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
