"""The relative-position bias's gradient as the model's dense backends make it, eager and compiled.

Every backend that takes the bias as a tensor (sdpa, torch, fused, and flex's dense fallback) builds
the (H, T, S) bias from the per-distance table (H, 2 M + 1) and gets back the bias's gradient, one
value per (b, h, i, j); the table's gradient is its sum over the batch and along each diagonal.
Two ways to get it, timed side by side in one run on the same tensors:

- ``gather``: autograd through a plain gather ``table[:, index]``, whose backward is an
  accumulating index_put of every element onto the H (2 M + 1) entries. Eager CUDA sorts the
  indices first; inductor (torch.compile) makes it one atomic add per element, fused with the batch
  sum, all landing on a few thousand addresses (on an H200, 2026-11-27, 1.3 s of a 1.4 s T5-base
  update). The model used this until 2026-11-27.
- ``diagonals``: `RelativeBias.dense`, whose backward is `distance_grad` (rows shifted into
  columns, a sum over rows, the fold at +-M as a small matrix product): reductions only.

Each is timed eager and compiled (inductor, one graph per length), the call being the bias built,
cast to the compute dtype and broadcast over the batch, times a gradient tensor of the batch's
shape, summed, and its backward: ms per call (median of interleaved repeats), the ratio gather /
diagonals, and the largest difference of the table gradients (relative to its largest entry).
The floor is one read of the (B, H, T, S) gradient at the copy bandwidth measured in the same run.

    python benchmarks/bench_bias_grad.py --device cuda          # 512 1024 2048, 65536 tokens per call
    python benchmarks/bench_bias_grad.py                        # CPU: 256 512, 4096 tokens per call
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_optimizer's copy_bandwidth

import torch  # noqa: E402

from ast_t5.ablate.train import atomic_write_json  # noqa: E402
from ast_t5.modules.relative_position_bias import RelativeBias, distance_index  # noqa: E402
from bench_optimizer import copy_bandwidth  # noqa: E402

VARIANTS = ("gather", "diagonals")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="T = S of each call (default: 512 1024 2048 cuda, 256 512 cpu)")
    p.add_argument("--tokens", type=int, default=0,
                   help="query tokens per call: batch = tokens // T (default: 65536 cuda, 4096 cpu)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--max-distance", type=int, default=128, help="M: the table has 2 M + 1 entries per head")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="compute dtype (default: bf16 cuda, fp32 cpu)")
    p.add_argument("--repeats", type=int, default=0, help="timed calls per variant (default: 20 cuda, 3 cpu)")
    p.add_argument("--budget-s", type=float, default=5.0,
                   help="seconds of timed calls per variant and length, after which a variant stops at 3 calls")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--json", default="", help="write the figures here (atomically)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    cuda = args.device == "cuda"
    args.lengths = args.lengths or ([512, 1024, 2048] if cuda else [256, 512])
    args.tokens = args.tokens or (65536 if cuda else 4096)
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    args.repeats = args.repeats or (20 if cuda else 3)
    if args.repeats < 1 or args.heads < 1 or args.max_distance < 1 or min(args.lengths) < 1:
        p.error("--repeats, --heads, --max-distance and --lengths must be >= 1")
    if any(args.tokens < t for t in args.lengths):
        p.error("--tokens must be at least every length (one sequence per call)")
    return args


def gather_bias(table, q_len, k_len):
    """The model's bias before 2026-11-27: a plain gather, autograd's backward (index_put)."""
    max_distance = (table.size(1) - 1) // 2
    return table[:, distance_index(q_len, k_len, 0, max_distance, table.device)].unsqueeze(0)


def diagonals_bias(table, q_len, k_len):
    return RelativeBias(table, q_len, k_len).dense()


def make_call(build, dtype):
    def call(table, grad):
        bias = build(table, grad.size(-2), grad.size(-1)).to(dtype).expand_as(grad)
        return (bias * grad).sum(dtype=torch.float32)
    return call


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, table, grad, device):
    table.grad = None
    _sync(device)
    t0 = time.perf_counter()
    fn(table, grad).backward()
    _sync(device)
    return time.perf_counter() - t0


def measure(args) -> dict:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    g = torch.Generator(device=device).manual_seed(0)
    modes = ("eager",) if args.no_compile else ("eager", "compiled")
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "dtype": args.dtype, "heads": args.heads, "max_distance": args.max_distance,
           "tokens": args.tokens, "repeats": args.repeats, "budget_s": args.budget_s, "lengths": {}}
    bandwidth = copy_bandwidth(1 << 26, device)
    out["copy_gb_per_s"] = bandwidth / 1e9
    for length in args.lengths:
        batch = args.tokens // length
        table = torch.randn(args.heads, 2 * args.max_distance + 1, generator=g, device=device).requires_grad_()
        grad = torch.randn(batch, args.heads, length, length, generator=g, device=device).to(dtype)
        torch._dynamo.reset()  # each length's graphs from scratch (and within the recompile limit)
        fns = {}
        for mode in modes:
            for name, build in (("gather", gather_bias), ("diagonals", diagonals_bias)):
                fn = make_call(build, dtype)
                fns[f"{name} {mode}"] = torch.compile(fn, dynamic=False) if mode == "compiled" else fn
        grads, compile_s = {}, {}
        for key, fn in fns.items():  # the first call compiles; its gradient is the one compared
            compile_s[key] = _timed(fn, table, grad, device)
            grads[key] = table.grad.detach().clone()
        times = {key: [] for key in fns}
        for i in range(args.repeats + 1):  # one untimed round first, then interleaved, alternating order
            for key in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
                if len(times[key]) >= 3 and sum(times[key]) > args.budget_s:
                    continue  # a slow variant stops at 3 calls once it has had its budget
                elapsed = _timed(fns[key], table, grad, device)
                if i:
                    times[key].append(elapsed)
        reference = grads["gather eager"]
        scale = float(reference.abs().max().clamp_min(1e-30))
        row = {"batch": batch, "floor_ms": 1e3 * grad.numel() * grad.element_size() / (bandwidth / 2),
               "ms": {key: 1e3 * statistics.median(v) for key, v in times.items()},
               "calls": {key: len(v) for key, v in times.items()},
               "first_call_s": compile_s,
               "max_rel_diff": {key: float((grads[key] - reference).abs().max()) / scale for key in grads}}
        row["speedup"] = {mode: row["ms"][f"gather {mode}"] / row["ms"][f"diagonals {mode}"] for mode in modes}
        out["lengths"][str(length)] = row
    torch._dynamo.reset()
    return out


def report(out: dict) -> str:
    lines = [f"# relative-bias gradient on {out['device']}, torch {out['torch']}: H {out['heads']}, "
             f"M {out['max_distance']}, {out['dtype']}, {out['tokens']} query tokens per call; median of "
             f"{out['repeats']} interleaved calls (bias built + its backward; at least 3 past --budget-s "
             f"{out['budget_s']:g}); copy {out['copy_gb_per_s']:.0f} GB/s",
             "T = S  batch   variant              ms     floor   max rel diff"]
    for length, row in out["lengths"].items():
        for key, ms in row["ms"].items():
            lines.append(f"{length:>5}  {row['batch']:>5}   {key:<18} {ms:8.3f}  {row['floor_ms']:7.3f}   "
                         f"{row['max_rel_diff'][key]:.1e}")
        lines.append(f"{length:>5}  gather / diagonals: " +
                     ", ".join(f"{mode} {ratio:.2f}x" for mode, ratio in row["speedup"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = measure(args)
    print(report(out))
    if args.json:
        atomic_write_json(args.json, out)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
