"""The host's work per attention call of the ``triton`` backend, its kernels left out (runs on CPU).

On a GPU a call of the triton backend costs the host (CPU) the PyTorch operations around the three
kernels (bias rows, padding counts, the table gradient's sum, allocations), the three Triton
launches, and autograd's bookkeeping. The GPU runs them as they are issued, so where issuing a call
takes longer than its kernels run, the call's time is the host's: on an H200 (2026-11-25) the
benchmark's triton times fitted 1.4 ms + c L^2 (1.58 ms at T = 512 whatever the tiles or dropout,
2.28 at 1024, 5.28 at 2048, B16 H12 D64 bf16, one synchronized call at a time).

This script measures that work without a GPU: the calls run on small CPU tensors with the three
kernel launches replaced by no-ops, so what is timed is PyTorch's and Python's part (it leaves out
the Triton launches themselves, and CUDA's launch latency of each operation, which the operation
count stands for). Two ways of calling, side by side in one run:

- ``call``: each call builds its own inputs (`triton_rpe_attention` with ``key_padding_mask``), as
  bench_attention.py's rows and any caller without a stack do;
- ``stack``: --layers layers sharing one `FoldedBias` (`attention_backends.fold_masks` once, then
  `attention` per layer), the model's path, where the layers after the first reuse the bias rows
  and padding counts (`triton_rpe_attention.SharedInputs`);
- ``cross`` (padded calls only): --layers bias-free calls over one padded mask (`attention` with
  ``backend="triton"``, no bias: a decoder's cross-attention layers), which run the kernels without
  a bias and keep the mask's inputs for the layers after the first. Its mask is a new tensor in each
  timed pass, as each step's is.

For each: the median host ms per layer call (forward and backward, the gradient reaching q, k, v
and the per-distance table) and the PyTorch operations per layer call (aten operations seen by a
dispatch mode, views and detaches left out; each is at least one kernel launch on a GPU, several
microseconds of host time).

    python benchmarks/bench_triton_host.py                  # B1 H12 T=S=64 D64, padded, 12 layers
    python benchmarks/bench_triton_host.py --dropout 0.1 --repeats 50
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors: the module's checks ask for the interpreter
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

KERNELS = ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel")
VIEWS = ("aten.detach.", "aten.view.", "aten.alias.", "aten.t.", "aten.unsqueeze.", "aten.select.",
         "aten.slice.", "aten.expand.", "aten._unsafe_view.", "aten.reshape.", "aten.transpose.")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--length", type=int, default=64,
                   help="T = S (small: the CPU computes what a GPU would, which is not the host's work measured)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=12, help="layers of the stack (T5-base: 12)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--no-padding", action="store_true", help="no key padding mask")
    p.add_argument("--repeats", type=int, default=30, help="timed stacks (and as many single calls x layers)")

    args = p.parse_args(argv)
    if min(args.batch, args.heads, args.length, args.head_dim, args.layers, args.repeats) < 1:
        p.error("sizes, --layers and --repeats must be >= 1")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must be in [0, 1)")
    return args


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not name.startswith(VIEWS):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def _inputs(args):
    """Each layer's own q, k, v leaves (a layer's gradients are not summed with another's), dO, the
    padding mask and the bucket table."""
    from ast_t5.modules.relative_position_bias import RelativePositionBias

    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.length, args.head_dim)
    layers = [[torch.randn(shape, generator=g).requires_grad_() for _ in range(3)]
              for _ in range(args.layers)]
    grad = torch.randn(shape, generator=g)
    pad = None
    if not args.no_padding:
        lengths = torch.randint(args.length // 2, args.length + 1, (args.batch,), generator=g)
        pad = (torch.arange(args.length)[None, :] >= lengths[:, None])
    torch.manual_seed(0)
    table = RelativePositionBias(args.heads, 32, 128, bidirectional=True)
    return layers, grad, pad, table


def measure(args) -> dict:
    """{"call": ..., "stack": ..., "cross": ... (padded only)}: each with ``ms_per_call`` (median host ms
    per layer call, fwd+bwd) and ``ops_per_call`` (PyTorch operations per layer call, views left out),
    kernels not run."""
    from ast_t5.modules import attention_backends as ab
    from ast_t5.modules import triton_rpe_attention as tra

    reason = tra.unsupported_reason(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1),
                                    torch.zeros(1, 3))
    if reason is not None:
        raise SystemExit(f"bench_triton_host: the triton backend cannot be called here: {reason}")
    saved = {name: getattr(tra, name) for name in KERNELS}
    for name in KERNELS:
        setattr(tra, name, _NoLaunch())
    qkv, grad, pad, table = _inputs(args)
    layers = args.layers
    leaves = [t for layer in qkv for t in layer] + [table.embedding.weight]

    def call():  # each call on its own
        for q, k, v in qkv:
            rel = table(args.length, args.length)
            out = tra.triton_rpe_attention(q, k, v, rel.per_distance, key_padding_mask=pad, dropout_p=args.dropout)
            torch.autograd.grad(out, [q, k, v, table.embedding.weight], grad)

    def stack():  # one stack: the table and masks folded once, then every layer
        folded, _, _ = ab.fold_masks("triton", table(args.length, args.length), pad, False)
        outs = [ab.attention(q, k, v, bias=folded, dropout_p=args.dropout, backend="triton") for q, k, v in qkv]
        torch.autograd.grad(outs, leaves, [grad] * layers)

    def cross():  # a decoder's bias-free cross-attention over one padded source: the mask's inputs kept
        mask = pad.clone()  # a new mask tensor per pass, as each step's
        outs = [ab.attention(q, k, v, key_padding_mask=mask, dropout_p=args.dropout, backend="triton")
                for q, k, v in qkv]
        torch.autograd.grad(outs, leaves[:-1], [grad] * layers)

    paths = (("call", call), ("stack", stack)) + ((("cross", cross),) if pad is not None else ())
    results = {}
    try:
        for name, fn in paths:
            fn()  # warm-up (caches, the first call's checks)
            with _CountOps() as counter:
                fn()
            results[name] = dict(ops_per_call=len(counter.ops) / layers, samples=[])
        for _ in range(args.repeats):  # interleaved, so that a drift of the machine's speed hits both
            for name, fn in paths:
                t0 = time.perf_counter()
                fn()
                results[name]["samples"].append((time.perf_counter() - t0) * 1000.0 / layers)
    finally:
        for name, kernel in saved.items():
            setattr(tra, name, kernel)
    for entry in results.values():
        entry["ms_per_call"] = statistics.median(entry.pop("samples"))
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    results = measure(args)
    print(f"# triton backend's host work per layer call, fwd+bwd, kernels not launched: B{args.batch} H{args.heads} "
          f"T=S={args.length} D{args.head_dim} fp32 CPU, {'no padding' if args.no_padding else 'padded'}, dropout "
          f"{args.dropout:g}, {args.layers} layers, median of {args.repeats}; torch {torch.__version__}")
    print(f"{'path':<6} {'host ms':>8} {'ops':>6}")
    for name, entry in results.items():
        print(f"{name:<6} {entry['ms_per_call']:>8.3f} {entry['ops_per_call']:>6.1f}")
    call, stack = results["call"], results["stack"]
    print(f"# stack / call: host ms {stack['ms_per_call'] / call['ms_per_call']:.2f}x, "
          f"operations {stack['ops_per_call'] / call['ops_per_call']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
