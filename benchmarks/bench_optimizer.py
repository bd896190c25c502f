"""One `adamw_scale` step over a model's parameters: the foreach update, the fused kernel, the compiled update.

Under the GPU recipes (``common.bf16``) fairseq's FP16Optimizer hands `AdamWScale` the fp32 master
weights and their fp32 gradients, and the step is a pass of memory-bound element-wise work over
about 1 GB per tensor (T5-base: 248M parameters). Two implementations of the same update
(`ast_t5.optim.adamw_scale`), timed side by side in one run on the same tensors' copies:

- ``foreach``: torch's multi-tensor kernels, ten passes, 23 reads or writes of a tensor the size
  of the parameters;
- ``fused``: torch's fused AdamW kernel, one call per parameter with its RMS-scaled learning rate
  as a device tensor, after a foreach norm: 8 reads or writes (the default on CUDA);
- ``compiled`` (``optimizer.compiled=true``): the foreach update traced by torch.compile, whose
  kernels fuse each parameter's chain and take many parameters per launch: 8 reads or writes too.
  Its first (warm-up) step compiles it; ``compile_s`` is that step's time.

For each: the median ms per step over interleaved repeats, the bytes it moves, and their rate;
the floor is the fused step's bytes at the device's copy bandwidth measured in the same run (a
``copy_`` of the parameters' size). On CUDA one more step of each runs under torch.profiler
(``--no-kernel-times`` leaves it out): the GPU's busy time in that step (its kernels' durations
summed), how many kernels it launched, and the largest ones. Busy time well under the step's time
means the host bounds the step (its launches); busy time near it, the kernels themselves (most of
T5-base's parameters are 9 to 24 of torch's 65,536-element chunks, one thread block each: too few
to fill the GPU one call at a time). The parameters are the shapes of ``--arch`` (built on the
meta device, then allocated on ``--device``), fp32, with random gradients; both optimizers start
from the same state and take the same steps, and their results are compared (max relative error).

    python benchmarks/bench_optimizer.py --device cuda                   # t5_v11_base, 20 repeats
    python benchmarks/bench_optimizer.py                                 # CPU: t5_v11_tiny, a smoke run
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

IMPLEMENTATIONS = {"foreach": {"fused": False}, "fused": {"fused": True},  # name -> AdamWScale's arguments
                   "compiled": {"compiled": True}}
PASSES = {"foreach": 23, "fused": 8, "compiled": 8}  # reads and writes of a parameter-sized fp32 tensor per step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--arch", default=None, help="model preset whose parameter shapes are used "
                   "(default: t5_v11_base on cuda, t5_v11_tiny on cpu)")
    p.add_argument("--vocab", type=int, default=32128, help="vocabulary (the embedding's rows)")
    p.add_argument("--repeats", type=int, default=0, help="timed steps per implementation (default: 20 cuda, 5 cpu)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--json", default="", help="write the figures here (atomically)")
    p.add_argument("--no-kernel-times", dest="kernel_times", action="store_false",
                   help="on CUDA, leave out the profiled step of each implementation (GPU busy time, kernels)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    args.arch = args.arch or ("t5_v11_base" if args.device == "cuda" else "t5_v11_tiny")
    args.repeats = args.repeats or (20 if args.device == "cuda" else 5)
    if args.repeats < 1 or args.warmup < 0 or args.vocab < 8:
        p.error("--repeats must be >= 1, --warmup >= 0, --vocab >= 8")
    return args


def parameter_shapes(arch: str, vocab: int):
    """The shapes of the model's parameters, in its order (built on the meta device: no memory)."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    with torch.device("meta"):
        model = AstT5Model.from_dictionary(d, arch=arch)
    return [tuple(p.shape) for p in model.parameters()]


def _time_steps(args, runs, times, current, device, first):
    """Warm-up, then timed steps of each implementation, interleaved (who goes first alternates).
    ``first`` gets each one's first step's seconds (the compiled one's compile), never timed."""
    for i in range(max(args.warmup, 1) + args.repeats):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]
        for name in order:
            current[0] = name
            _sync(device)
            t0 = time.perf_counter()
            runs[name][1].step()
            _sync(device)
            if i == 0:
                first[name] = time.perf_counter() - t0
            elif i >= max(args.warmup, 1):
                times[name].append(time.perf_counter() - t0)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(numel: int, device) -> float:
    """Bytes per second of one device copy (read + write) of ``numel`` fp32 values, median of 5."""
    src = torch.empty(numel, device=device)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        copies.append(time.perf_counter() - t0)
    return 8 * numel / statistics.median(copies)


def measure(args) -> dict:
    from ast_t5.optim.adamw_scale import AdamWScale

    device = torch.device(args.device)
    shapes = parameter_shapes(args.arch, args.vocab)
    numel = sum(torch.Size(s).numel() for s in shapes)
    g = torch.Generator(device=device).manual_seed(0)
    start = [torch.randn(s, generator=g, device=device) * 0.05 for s in shapes]
    grads = [torch.randn(s, generator=g, device=device) for s in shapes]
    runs = {}
    for name, options in IMPLEMENTATIONS.items():
        params = [torch.nn.Parameter(t.clone()) for t in start]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()  # each its own: torch's fused kernel declares its gradients writable
        runs[name] = (params, AdamWScale(params, lr=0.01, **options))
    times = {name: [] for name in runs}
    kernel, calls = torch._fused_adamw_, {name: 0 for name in runs}  # which steps really ran the fused kernel
    current = [None]

    def counted(*a, **k):
        calls[current[0]] += 1
        return kernel(*a, **k)

    torch._fused_adamw_ = counted
    first = {}
    try:
        _time_steps(args, runs, times, current, device, first)
    finally:
        torch._fused_adamw_ = kernel

    kernels = {}
    if device.type == "cuda" and args.kernel_times:  # every implementation takes the same extra steps
        for name in runs:
            kernels[name] = kernel_times(runs[name][1].step, device)
    bandwidth = copy_bandwidth(numel, device)  # measured now: one copy of the parameters' size
    reference = runs["foreach"][0]

    def error(name):
        return max(float(((p.detach() - q.detach()).abs().max() / q.detach().abs().max().clamp_min(1e-12)))
                   for p, q in zip(runs[name][0], reference))
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "arch": args.arch, "parameters": numel, "tensors": len(shapes),
           "repeats": args.repeats, "copy_gb_per_s": bandwidth / 1e9, "fused_vs_foreach_max_rel_error": error("fused"),
           "compiled_vs_foreach_max_rel_error": error("compiled"), "compile_s": first["compiled"],
           "fused_calls_per_step": {name: n / (max(args.warmup, 1) + args.repeats) for name, n in calls.items()},
           "steps": {}}
    for name in runs:
        ms = 1e3 * statistics.median(times[name])
        moved = 4 * PASSES[name] * numel
        out["steps"][name] = {"ms": ms, "gb_moved": moved / 1e9, "gb_per_s": moved / 1e6 / ms}
        if name in kernels:
            out["steps"][name]["gpu"] = kernels[name]
    out["floor_ms"] = 1e3 * 4 * PASSES["fused"] * numel / bandwidth
    out["speedup_fused"] = out["steps"]["foreach"]["ms"] / out["steps"]["fused"]["ms"]
    out["speedup_compiled_vs_fused"] = out["steps"]["fused"]["ms"] / out["steps"]["compiled"]["ms"]
    return out


def kernel_summary(events, top: int = 3) -> dict:
    """From (name, start us, duration us) of each GPU event of one step: the busy time (durations
    summed), the span from the first start to the last end, the number of kernels (bench_train's
    `kernel_kinds`), and the ``top`` kernels of any kind by summed time as [name, ms, launches]."""
    from bench_train import kernel_kinds

    kinds = kernel_kinds(events, top=top)
    if not kinds:
        return {"busy_ms": 0.0, "span_ms": 0.0, "kernels": 0, "largest": []}
    largest = sorted((row for rows in kinds["largest"].values() for row in rows), key=lambda row: -row[1])[:top]
    return {"busy_ms": kinds["busy_ms"], "span_ms": kinds["span_ms"], "kernels": kinds["kernels"], "largest": largest}


def kernel_times(step, device) -> dict:
    """`kernel_summary` of one ``step()`` on a CUDA ``device`` (the second of two profiled calls)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    from bench_train import device_events, profile_second_call

    prof = profile_second_call(step, device, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    return kernel_summary(device_events(prof, DeviceType.CUDA))


def report(out: dict) -> str:
    lines = [f"# adamw_scale step: {out['arch']} ({out['parameters'] / 1e6:.1f}M parameters in {out['tensors']} "
             f"tensors, fp32) on {out['device']}, torch {out['torch']}; median of {out['repeats']} interleaved steps",
             f"# copy bandwidth {out['copy_gb_per_s']:.0f} GB/s; floor (the fused step's bytes at it) "
             f"{out['floor_ms']:.2f} ms",
             "impl      ms/step   GB moved   GB/s"]
    for name, s in out["steps"].items():
        lines.append(f"{name:<9} {s['ms']:8.2f}   {s['gb_moved']:8.2f}   {s['gb_per_s']:5.0f}")
    lines.append(f"fused / foreach speed-up: {out['speedup_fused']:.2f}x   "
                 f"(max relative difference of the results: {out['fused_vs_foreach_max_rel_error']:.1e}; "
                 f"fused kernel calls per step: {out['fused_calls_per_step']['fused']:.0f} fused, "
                 f"{out['fused_calls_per_step']['foreach']:.0f} foreach)")
    for name, s in out["steps"].items():
        gpu = s.get("gpu")
        if gpu:
            largest = "; ".join(f"{n} {ms:.2f} ms x{runs}" for n, ms, runs in gpu["largest"])
            lines.append(f"{name} on the GPU (one profiled step): busy {gpu['busy_ms']:.2f} ms of the step's "
                         f"{s['ms']:.2f} ({gpu['busy_ms'] / s['ms']:.0%}), {gpu['kernels']} kernels; "
                         f"largest: {largest}")
    lines.append(f"compiled / fused speed-up: {out['speedup_compiled_vs_fused']:.2f}x   (compile "
                 f"{out['compile_s']:.1f} s, once per run; max relative difference from foreach: "
                 f"{out['compiled_vs_foreach_max_rel_error']:.1e}; fused kernel calls per step: "
                 f"{out['fused_calls_per_step']['compiled']:.0f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = measure(args)
    print(report(out))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
