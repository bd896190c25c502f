"""Every attention backend side by side: T5 relative-position-biased attention, forward + backward.

    python benchmarks/bench_attention.py                                  # CPU: tiny shape (smoke run)
    python benchmarks/bench_attention.py --device cuda --json OUT/attention.json

On CUDA the shapes are B16 H12 D64 bf16 at T = S = 512, 1024, 2048 (the issue's shape is 1024),
each with attention dropout 0 and 0.1, without and with key padding (each row keeps a seeded
random length in [T/2, T]). Every biased backend starts from the same (H, num_buckets) table
(T5 v1.1: 32 buckets, max distance 128) and its time includes the table lookup, the masks and the
gradient reaching the table, as in the model:

- eager: ``attention_backend=torch`` (softmax(qk + bias) v written out, dense bias);
- fused: the fused_ops softmax-dropout kernel (CUDA, when the extension loads);
- sdpa: PyTorch SDPA with bias + masks as one mask in q's dtype (no cuDNN kernel with masks);
- sdpa-prebuilt: the same SDPA call on a dense bias built once outside the timed call, as a stack
  builds it once for its 12 layers; the table gradient's reduction (once per stack in the model)
  is left out, so this is SDPA's per-layer cost, the issue's "SDPA with the bias as attn_mask"
  (2.62 ms at 1024): the fair base for the dropout target (column ``x pre``). Its rows leave part
  of the work out, so they never win a condition;
- flex: the ``flex`` backend, padding as a block mask (no dropout: rows with dropout show n/a
  rather than timing its sdpa fallback). With the table gradient (these rows) it reads a
  (1, H, T, S) float32 bias built once from the per-distance vector (FLEX_TABLE_GRAD="dense",
  the form measured at 1.52 ms in the issue); forward-only it reads the vector;
- flex-distance: the same with FLEX_TABLE_GRAD="distance": the kernel reads the (H, 2 M + 1)
  vector and its backward adds the table gradient atomically (decides whether training can drop
  the (1, H, T, S) tensor);
- triton: the ``triton`` backend (ast_t5/modules/triton_rpe_attention.py): our tiled Triton kernel
  reading the (H, 2 M + 1) vector, with dropout, padding and the table gradient reduced per
  distance in its backward (on CPU only under TRITON_INTERPRET=1: a correctness smoke run);
  ``--triton-blocks BM,BN,BB,WARPS[,STAGES[,BWD_WARPS[,BB_STEP[,BWD_STAGES]]]] ...`` adds one row per tile
  configuration (``triton:...``), to tune `triton_rpe_attention.default_blocks` from one run (a
  ``fused:`` prefix runs those tiles with the fused backward: a ``triton-fused:...`` row; ``one-loop:``,
  ``far:``, ``far-all:`` with `FAR_LOOPS` none, backward, all, and ``+`` joins them: ``fused+far:...``);
- triton-fused: the triton row with the fused backward (``triton_rpe_attention.BACKWARD = "fused"``:
  dQ added by the dK/dV kernel with atomic adds, 5 matrix products per tile instead of 7, and a
  band kernel for the table gradient of the tiles crossing the band (-M, M)), with one loop per
  kernel (``FAR_LOOPS`` = "none": with the far loops its dK/dV kernel spills);
- triton-one-loop: the triton row with one loop per kernel over every tile (``FAR_LOOPS`` = "none",
  the default until 2026-11-27), where the triton row's dK/dV and dQ kernels walk their far tiles
  in a loop of their own, adding the clamped bias as a scalar (``FAR_LOOPS`` = "backward", the
  default): what the far loops gain. (It was the triton row; the far loops were the triton-far row,
  which still names them explicitly.) triton-far-all: the forward's far tiles too (``FAR_LOOPS`` =
  "all"). The far rows are n/a at lengths where the kernels keep one loop (`far_loops_pay`). A
  ``one-loop:``, ``far:`` or ``far-all:`` prefix of ``--triton-blocks`` does the same for those tiles
  (``fused+far:`` with the fused backward);
- triton-bits: the triton row with its dropout keep mask drawn once per call into one bit per element,
  which the forward, dK/dV and dQ kernels read (``triton_rpe_attention.DROPOUT_MASK`` = "bits") instead
  of each running Philox itself; n/a without dropout (the triton row's kernels);
- triton-tiles: the triton row with each tile's bias read whole, 16 bytes at a time, from the head's bias tiles
  (``triton_rpe_attention.BIAS_LAYOUT`` = "tiles") instead of gathered per element from its row of distances:
  what the gather's L1 and shared-memory traffic costs;
- triton-frozen: the triton row with the bucket table frozen (no table gradient: the dQ kernel
  without its per-distance reduction): what that reduction costs. It leaves out work, so it never
  wins a condition;
- triton-prebuilt: the triton row timed as sdpa-prebuilt is, as a stack's layers call it: the stack's
  inputs (the per-distance bias rows and the padding counts, which the model builds once for its 12
  layers) are built by the first call and reused by the timed ones; each call runs the layer's kernels
  and the whole table gradient. Against the triton row (which builds them per call): what that
  per-stack work costs the host per call; against sdpa-prebuilt (``x pre``): the like-for-like
  comparison of the targets' base. It leaves that work out, so it never wins a condition;
- triton-baseline: the yardstick (`benchmarks/triton_flash_baseline.py`): bias-free FlashAttention-2
  in Triton at the triton backend's tiles, right padding as each row's end of keys, no dropout (n/a
  with it). triton - baseline is what the bias, the table gradient and the backend's host work cost;
  baseline - flash-nobias is what Triton's code at these tiles costs against PyTorch's flash kernels.
  Bias-free and not a backend: never a winner of either kind;
- cudnn: the ``cudnn`` backend (ast_t5/modules/cudnn_attention.py): cuDNN's fused attention kernels with the
  stack's (1, H, T, S) bias, whose gradient cuDNN returns summed over the batch (then reduced per distance,
  in the call: the model does it once per stack); the library option the triton kernels must beat. CUDA
  with nvidia-cudnn-frontend; elsewhere it runs sdpa (its ``ran`` column says so). Each new shape builds
  its cuDNN graphs first, in the untimed warm-up calls;
- cudnn-nondeterministic: the same with cuDNN free to choose non-deterministic backward plans
  (``cudnn_attention.DETERMINISTIC`` = False; the backend's default is deterministic);
- cudnn-nobias: the bias-free call with ``attention_backend=cudnn``: with padding, cuDNN's kernels with its
  padding mask (each sample's count of keys; no unpadding), else flash;
- auto: what ``attention_backend=auto`` dispatches (the ``ran`` column says which kernel);
- flash-nobias: bias-free attention on flash kernels (what the paper decoder and all cross
  attention run; the lower bound for a biased kernel). With padding it packs the real keys and
  runs a varlen kernel;
- sdpa-nobias, flex-nobias: the same bias-free call on SDPA with the padding as a mask, and on
  FlexAttention with the padding as a block mask (no dropout): the alternatives to the varlen
  packing for padded cross-attention;
- triton-nobias: the same bias-free call with ``attention_backend=triton``: with padding, the triton
  kernels without a bias (no table read, no table gradient; dropout too), each row stopping at its last
  key, no packing; without padding, flash (the ``ran`` column says which). A ``bias-free winner`` line
  names the fastest bias-free row of a condition.

With ``--kernel-times`` each triton row also lists the time of each kernel of one call
(torch.profiler): the forward, dK/dV and dQ kernels and the PyTorch work around them.

With ``--split`` each row also times its forward alone (without gradients): ``fwd ms``, and
``bwd ms`` = ms - fwd ms, so that the forward's and the backward's tiles can be chosen apart
(gpu_check's tile sweep uses it).

With ``--graph`` (CUDA; nothing on CPU) each triton row, and the flash-nobias, triton-nobias,
triton-baseline, sdpa and sdpa-prebuilt rows (`GRAPH_ROWS`; the dense rows take tens of ms,
GPU-bound), is also captured once in a CUDA graph and its replays timed: ``graph ms``, the GPU time
of the call without the host's. Such a run works on one side stream from its first tensor to its last
capture (see `graph_ms` for why). A row whose capture or replay raises is tried once more (`graph_ms_retried`);
one that fails twice keeps its other figures and gets a ``graph_note`` (printed after the
condition's rows) instead, and one that worked at the second try a ``graph_first_try`` (printed too).

Columns: median ms of fwd+bwd (forward only where a backend has no backward on this device; CUDA
events around one call, then a synchronize), ``host ms``: the median host time of the same calls,
from just before the call to its return (time.perf_counter, before the synchronize: what the CPU
spends issuing the PyTorch operations and kernel launches; on CPU the same as ms; where it is
close to ms, ms is the host's time, not the kernels'), ``graph ms`` with ``--graph`` (n/a without
a value), TFLOP/s at the nominal 3.5 x 4 B H T S D FLOPs (padding not subtracted), the floor (those
FLOPs at ``--peak-tflops``), and ``err/ref``: the largest error of output and gradients against a float64
(CPU) or float32 (CUDA) evaluation of the same function, divided by the error of PyTorch's eager
path in the same dtype (dropout-free rows only; 1.0 = as accurate as PyTorch itself), and
``x sdpa``: sdpa's time divided by the row's, ``x pre``: sdpa-prebuilt's divided by the row's
(the issue's targets: <= 1.0 ms at T=S=1024 without dropout, >= 2x SDPA-with-bias, i.e. ``x pre``,
with dropout 0.1). After each condition a ``winner`` line names the fastest
biased backend that ran as itself (its ``ran`` column; flash-nobias excluded, it is the bias-free
lower bound); the JSON has them under ``winners``, from which `AUTO_TABLE` is written.
"""
import argparse
import json
import logging
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ast_t5.modules import attention_backends as ab  # noqa: E402
from ast_t5.modules.relative_position_bias import RelativePositionBias  # noqa: E402

BACKENDS = ("eager", "fused", "sdpa", "sdpa-prebuilt", "flex", "flex-distance", "triton", "triton-fused",
            "triton-one-loop", "triton-far", "triton-far-all", "triton-bits", "triton-tiles", "triton-frozen",
            "triton-prebuilt", "triton-baseline", "cudnn", "cudnn-nondeterministic", "auto", "flash-nobias",
            "sdpa-nobias", "flex-nobias", "triton-nobias", "cudnn-nobias")
NOBIAS = ("flash-nobias", "sdpa-nobias", "flex-nobias", "triton-nobias", "cudnn-nobias", "eager-nobias")
BASELINE = "triton-baseline"  # bias-free like NOBIAS (same reference), but no backend: never a winner
# the kernel name in DISPATCH_COUNTS that shows each backend ran as itself (not a fallback)
OWN_KERNELS = {"eager": ("torch",), "fused": ("fused",), "sdpa": ("sdpa", "sdpa-masked-no-cudnn"),
               "sdpa-prebuilt": ("sdpa", "sdpa-masked-no-cudnn"), "flex": ("flex",), "flex-distance": ("flex",),
               "triton": ("triton-rpe",), "cudnn": ("cudnn",),
               "cudnn-nondeterministic": ("cudnn",)}  # every triton row (TRITON_ROWS) too
# the triton backend's rows and the settings of triton_rpe_attention each runs with (BACKWARD, FAR_LOOPS,
# DROPOUT_MASK, BIAS_LAYOUT; the rest at the module's defaults, as the triton row); a tile row is one of them (not
# triton-frozen or triton-prebuilt) followed by its tiles, triton-fused-far:64x64x64x4x2 (--triton-blocks)
TRITON_ROWS = {"triton": {}, "triton-fused": {"BACKWARD": "fused", "FAR_LOOPS": "none"}, "triton-frozen": {},
               "triton-prebuilt": {},
               "triton-one-loop": {"FAR_LOOPS": "none"},
               "triton-fused-one-loop": {"BACKWARD": "fused", "FAR_LOOPS": "none"},
               "triton-far": {"FAR_LOOPS": "backward", "FAR_LOOPS_MIN_LENGTH": 2},
               "triton-far-all": {"FAR_LOOPS": "all", "FAR_LOOPS_MIN_LENGTH": 2},
               "triton-fused-far": {"BACKWARD": "fused", "FAR_LOOPS": "backward", "FAR_LOOPS_MIN_LENGTH": 2},
               "triton-fused-far-all": {"BACKWARD": "fused", "FAR_LOOPS": "all", "FAR_LOOPS_MIN_LENGTH": 2},
               "triton-bits": {"DROPOUT_MASK": "bits"},
               "triton-tiles": {"BIAS_LAYOUT": "tiles"}}
DROPOUT_ROWS = ("triton-bits",)  # rows that differ from the triton row only with dropout: n/a without
TILE_PREFIXES = ("fused", "one-loop", "far", "far-all")  # --triton-blocks prefixes, joined by "+": fused+far:...
LOOP_PREFIXES = ("one-loop", "far", "far-all")  # FAR_LOOPS none, backward, all: one of them at most
# the far rows pin the far loops on every call whose programs all have far tiles (T > 2 (M + tile): 384 at sm90's
# tiles), where the triton row takes them only past 4 (M + tile) (`far_loops_pay`, since 2026-11-27 night: one
# loop won the T5-base step at 512), so that a run at 512 measures both sides of that rule
# triton-far is the triton row's structure at 1024 (FAR_LOOPS' default since 2026-11-27) named explicitly;
# triton-far-all
# (the forward's far loop too) is a default row since 2026-11-27: the forward is the kernel furthest from the
# yardstick (0.395 ms against 0.151 on the H200, 2026-11-26), and its far loop is the yardstick's loop
# triton-fused and triton-one-loop leave the default rows for triton-tiles (2026-11-27: measured on the H200 the day
# before, fused slower than the split backward, one loop slower than the far loops; the kernels to compile stay
# within the step's cap)
DEFAULT_BACKENDS = tuple(b for b in BACKENDS if b not in ("triton-far", "triton-fused", "triton-one-loop"))
# rows that leave out part of the work (the table gradient's reduction; the stack's inputs, built outside
# the timed call): compared, never a winner
PARTIAL = ("sdpa-prebuilt", "triton-frozen", "triton-prebuilt")
# triton rows whose call is not the structured one of `step_fn` (settings, tiles)
OWN_CALL_ROWS = ("triton", "triton-frozen", "triton-prebuilt")
GRAPH_WARMUP = 3  # --graph: calls before the capture, on its stream (allocations, compilation, autotuning)
# --graph's rows: ours (whose host and GPU time we need apart), and the lower bound and base they are
# read against; the dense rows (tens of ms per call: GPU-bound, and a capture costs as much again) are left out
GRAPH_ROWS = ("flash-nobias", "sdpa-prebuilt", "sdpa", BASELINE, "triton-nobias", "cudnn", "cudnn-nondeterministic",
              "cudnn-nobias")


def graphed(name: str) -> bool:
    """Whether --graph times this row in a CUDA graph (`GRAPH_ROWS` and every triton row)."""
    base = name.partition(":")[0]
    return base in GRAPH_ROWS or base in TRITON_ROWS
NUM_BUCKETS, MAX_DISTANCE = 32, 128  # T5 v1.1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the full table (B16 H12 D64 bf16, T 512/1024/2048); cpu: a tiny smoke shape")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file (written atomically)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(DEFAULT_BACKENDS),
                   help="default: all but triton-far (the triton row's structure, named)")
    p.add_argument("--triton-blocks", nargs="+", default=[],
                   metavar="[PREFIX:]BM,BN,BB,WARPS[,STAGES[,BWD_WARPS[,BB_STEP[,BWD_STAGES]]]]",
                   help="extra `triton` rows with these tiles; PREFIX: fused (the fused backward), one-loop, far or "
                        "far-all (triton_rpe_attention.FAR_LOOPS none, backward or all), joined by + "
                        "(forward BLOCK_M, BLOCK_N, backward BLOCK, "
                        "num_warps[, num_stages: default 3[, backward num_warps: default num_warps[, backward "
                        "STEP: default BLOCK[, backward num_stages: default num_stages]]]]), e.g. 128,64,64,8 "
                        "64,64,32,4,3 128,64,128,8,3,8,32 64,64,128,4,2,8,64,3: to tune "
                        "triton_rpe_attention.default_blocks")
    p.add_argument("--split", action="store_true",
                   help="also time each row's forward alone (no gradient): the ``fwd ms`` column and the "
                        "backward as the difference, to choose forward and backward tiles separately")
    p.add_argument("--kernel-times", action="store_true",
                   help="for the triton rows, also the time of each kernel of one fwd+bwd (torch.profiler, "
                        "mean over the repeats): forward, dK/dV, dQ and the PyTorch work around them")
    p.add_argument("--graph", action="store_true",
                   help="CUDA: also capture the call of each triton row and of the rows of GRAPH_ROWS in a "
                        "CUDA graph and time its replays (the ``graph ms`` column: the GPU time without the host's, "
                        "against ``ms`` and ``host ms``); a row whose capture fails gets a graph_note. No effect "
                        "on CPU")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="T = S values (default by device)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="default: bf16 cuda, fp32 cpu")
    p.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1])
    p.add_argument("--padding", choices=("both", "none", "padded"), default="both")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (median reported)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--peak-tflops", type=float, default=800.0, help="for the floor column (H100 bf16 dense: ~800)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    # the issue's length first, so that a run cut short by a time limit still has it
    defaults = dict(lengths=[1024, 512, 2048] if cuda else [64], batch=16 if cuda else 2,
                    heads=12 if cuda else 2, head_dim=64 if cuda else 16, dtype="bf16" if cuda else "fp32",
                    repeats=20 if cuda else 3, warmup=5 if cuda else 1)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    specs, args.triton_blocks = args.triton_blocks, []
    for spec in specs:  # [prefix[+prefix]:]tiles: the row triton[-fused][-one-loop|-far|-far-all]:tiles
        prefix, _, tiles = spec.rpartition(":")
        flags = set(prefix.split("+")) if prefix else set()
        if not flags <= set(TILE_PREFIXES) or len(flags & set(LOOP_PREFIXES)) > 1:
            p.error(f"--triton-blocks {spec}: the prefixes are {', '.join(TILE_PREFIXES)} (at most one of "
                    f"{', '.join(LOOP_PREFIXES)}), joined by +")
        try:
            blocks = tuple(int(x) for x in tiles.split(","))
        except ValueError:
            p.error("--triton-blocks: each value is [PREFIX:]BM,BN,BB,WARPS[,STAGES[,BWD_WARPS[,BB_STEP"
                    "[,BWD_STAGES]]]] (integers)")
        base = "triton" + "".join(f"-{flag}" for flag in TILE_PREFIXES if flag in flags)
        args.triton_blocks.append((base, blocks))
    if args.triton_blocks:
        from ast_t5.modules.triton_rpe_attention import resolve_blocks

        try:
            for _, blocks in args.triton_blocks:
                resolve_blocks(blocks)
        except ValueError as e:
            p.error(f"--triton-blocks: {e}")
    args.backends = list(args.backends) + [f"{base}:" + "x".join(map(str, b)) for base, b in args.triton_blocks]
    if min(args.lengths) < 2 or args.batch < 1 or args.heads < 1 or args.head_dim < 1 or args.repeats < 1:
        p.error("lengths must be >= 2 and batch, heads, head-dim, repeats >= 1")
    return args


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def flops_fwd_bwd(b, h, t, s, d) -> float:
    """Two matmuls forward (4 B H T S D), backward 2.5x that (FlashAttention's convention)."""
    return 3.5 * 4.0 * b * h * t * s * d


def make_case(args, length, padded, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(args.batch, args.heads, length, args.head_dim, generator=g).to(device, dtype)
               for _ in range(3))
    pad = None
    if padded:
        lengths = torch.randint(length // 2, length + 1, (args.batch,), generator=g)
        pad = (torch.arange(length)[None, :] >= lengths[:, None]).to(device)
    torch.manual_seed(seed)
    table = RelativePositionBias(args.heads, NUM_BUCKETS, MAX_DISTANCE, bidirectional=True).to(device)
    with torch.no_grad():
        table.embedding.weight.normal_(0.0, 1.0)
    grad_out = torch.randn(q.shape, generator=g).to(device, dtype)
    return q, k, v, pad, table, grad_out


def step_fn(name: str, q, k, v, pad, table, grad_out, dropout: float, backward: bool) -> Optional[Callable]:
    """A closure running one fwd(+bwd) of backend ``name`` and returning (out, grads), or None when
    the backend does not apply (flex with dropout)."""
    length = q.size(2)
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    dtype = q.dtype

    def finish(out):
        if not backward:
            return out, []
        grads = torch.autograd.grad(out, [*leaves, table.embedding.weight], grad_out, allow_unused=True)
        return out, list(grads)

    if name in ("flex", "flex-distance", "flex-nobias", BASELINE) and dropout > 0:
        return None
    if name == BASELINE:
        tfb = _baseline_module()
        kv_end = None if pad is None else tfb.kv_end_from_padding(pad)  # once, as a stack would

        def run_baseline():
            return finish(tfb.baseline_attention(*leaves, kv_end))
        return run_baseline if backward else _without_grad(run_baseline)
    if name == "flex-nobias":  # what `attention` never dispatches itself: bias-free flex, padding as a block mask
        def run_flex():
            ab._count("flex")
            block_mask = ab.flex_block_mask(pad, False, length, length, leaves[0].device)
            return finish(ab._flex_compiled(leaves[0].device.type)(*leaves, None, None, block_mask, 1.0))
        return run_flex if backward else _without_grad(run_flex)
    if name in NOBIAS:
        nobias_backend = {"flash-nobias": "flash", "sdpa-nobias": "sdpa", "eager-nobias": "torch",
                          "triton-nobias": "triton", "cudnn-nobias": "cudnn"}[name]

        def run():
            return finish(ab.attention(*leaves, key_padding_mask=pad, dropout_p=dropout, backend=nobias_backend))
        return run if backward else _without_grad(run)
    base, _, tiles = name.partition(":")
    if base in TRITON_ROWS and base not in OWN_CALL_ROWS or (base == "triton" and tiles):
        # settings (BACKWARD, FAR_LOOPS, DROPOUT_MASK, BIAS_LAYOUT) and/or tiles under test (--triton-blocks)
        from ast_t5.modules import triton_rpe_attention as tra

        if base in DROPOUT_ROWS and dropout == 0:
            return None
        settings = dict(TRITON_ROWS[base], BLOCKS_OVERRIDE=tuple(int(x) for x in tiles.split("x")) if tiles
                        else tra.BLOCKS_OVERRIDE)

        def run_structured():
            saved = {name: getattr(tra, name) for name in settings}
            for name, value in settings.items():
                setattr(tra, name, value)
            try:
                folded, _, _ = ab.fold_masks("triton", table(length, length), pad, False, dtype=dtype)
                return finish(ab.attention(*leaves, bias=folded, dropout_p=dropout, backend="triton"))
            finally:
                for name, value in saved.items():
                    setattr(tra, name, value)
        return run_structured if backward else _without_grad(run_structured)
    if name == "sdpa-prebuilt":
        # the dense (1, H, T, S) bias with the masks folded in, built once outside the timed call, as a
        # stack builds it once for all its layers; the call returns the dense tensor's gradient, and the
        # reduction of that gradient to the table (per layer in the model: `TappedMask`) is left out
        with torch.no_grad():
            folded, fpad, fcausal = ab.fold_masks("sdpa", table(length, length), pad, False, dtype=dtype,
                                                  dropout_p=dropout)
        dense = folded.requires_grad_(backward)

        def run_prebuilt():
            out = ab.attention(*leaves, bias=dense, key_padding_mask=fpad, causal=fcausal, dropout_p=dropout,
                               backend="sdpa")
            if not backward:
                return out, []
            grads = torch.autograd.grad(out, [*leaves, dense], grad_out)
            return out, [*grads[:3], None]  # no table gradient to compare
        return run_prebuilt if backward else _without_grad(run_prebuilt)
    if name == "triton-prebuilt":
        # the triton row as a stack's layers call it, timed as sdpa-prebuilt is: the stack's inputs (the
        # per-distance bias rows and the padding counts: `fold_masks` and the first call's `SharedInputs`,
        # kept by `folded`) are built by the first call and reused by the timed ones, as the model's 12
        # layers reuse them; each call runs the layer's kernels and returns the whole table gradient (the
        # kernels' per-distance sums, then the distances' scatter to the buckets: in the model once per
        # stack, here per call)
        rel = table(length, length)
        distances = rel.per_distance.detach().requires_grad_(backward)
        folded, _, _ = ab.fold_masks("triton", rel._replace(per_distance=distances), pad, False, dtype=dtype)

        def run_prebuilt_triton():
            out = ab.attention(*leaves, bias=folded, dropout_p=dropout, backend="triton")
            if not backward:
                return out, []
            *grads, per_distance = torch.autograd.grad(out, [*leaves, distances], grad_out)
            table_grad, = torch.autograd.grad(rel.per_distance, table.embedding.weight, per_distance,
                                              retain_graph=True)
            return out, [*grads, table_grad]
        return run_prebuilt_triton if backward else _without_grad(run_prebuilt_triton)
    if name == "triton-frozen":
        # the triton row with the bucket table frozen: no table gradient, so the dQ kernel runs without
        # its per-distance reduction; the difference to the triton row is what that reduction costs
        def run_frozen():
            with torch.no_grad():
                bias = table(length, length)
            folded, _, _ = ab.fold_masks("triton", bias, pad, False, dtype=dtype)
            out = ab.attention(*leaves, bias=folded, dropout_p=dropout, backend="triton")
            return (out, list(torch.autograd.grad(out, leaves, grad_out))) if backward else (out, [])
        return run_frozen if backward else _without_grad(run_frozen)
    if name == "cudnn-nondeterministic":
        # the cudnn row with cuDNN free to pick its non-deterministic backward plans (`DETERMINISTIC`)
        from ast_t5.modules import cudnn_attention as ca

        def run_nondeterministic():
            saved, ca.DETERMINISTIC = ca.DETERMINISTIC, False
            try:
                folded, _, _ = ab.fold_masks("cudnn", table(length, length), pad, False, dtype=dtype)
                return finish(ab.attention(*leaves, bias=folded, dropout_p=dropout, backend="cudnn"))
            finally:
                ca.DETERMINISTIC = saved
        return run_nondeterministic if backward else _without_grad(run_nondeterministic)
    if name == "flex-distance":
        def run_distance():
            saved, ab.FLEX_TABLE_GRAD = ab.FLEX_TABLE_GRAD, "distance"
            try:
                folded, _, _ = ab.fold_masks("flex", table(length, length), pad, False, dtype=dtype)
                return finish(ab.attention(*leaves, bias=folded, backend="flex"))
            finally:
                ab.FLEX_TABLE_GRAD = saved
        return run_distance if backward else _without_grad(run_distance)
    backend = {"eager": "torch"}.get(name, name)

    def run():
        folded, fpad, fcausal = ab.fold_masks(backend, table(length, length), pad, False, dtype=dtype,
                                              dropout_p=dropout)  # as the model's stacks call it
        return finish(ab.attention(*leaves, bias=folded, key_padding_mask=fpad, causal=fcausal,
                                   dropout_p=dropout, backend=backend))
    return run if backward else _without_grad(run)


def _baseline_module():
    """benchmarks/triton_flash_baseline.py, imported from this folder (also when loaded by path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import triton_flash_baseline

    return triton_flash_baseline


def _without_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


class Timing(NamedTuple):
    """Median milliseconds per call: ``ms`` until the device finished it (CUDA events; on CPU the wall
    time), ``host_ms`` until ``fn`` returned (the host's time to issue the call)."""
    ms: float
    host_ms: float


def time_ms(fn, device, warmup, repeats) -> Timing:
    """``fn`` timed ``repeats`` times after ``warmup`` calls, one call at a time. On CUDA each call
    sits between two events and a synchronize, so when issuing it takes the host longer than the
    kernels take the GPU, ms is the host's time (``host_ms``), not the kernels'."""
    for _ in range(warmup):
        fn()
    samples, host = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1000.0)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1000.0)
            host.append(samples[-1])
    return Timing(statistics.median(samples), statistics.median(host))


def graph_ms(fn, repeats) -> Tuple[Optional[float], Optional[str]]:
    """(median ms of one replay of ``fn`` captured in a CUDA graph, None): the call's GPU time without
    the host's, its kernels launched back to back; or (None, why) when the capture or a replay raised
    (a host sync inside the call, an operation that cannot be captured). Warmed up and captured on the
    current stream, which `run` makes a side stream for the whole --graph run: the rows' tensors, and
    the autograd nodes of their leaves (kept alive by the result of each row's first call), were made
    on it. The autograd engine makes the caller's stream wait for each gradient's stream; for tensors
    made on the legacy default stream that records an event there inside the capture, which CUDA
    refuses: the likely cause of "operation would make the legacy stream depend on a capturing
    blocking stream" (the first rows with a table gradient, H200, 2026-11-26 and 2026-11-28; read
    from PyTorch's engine, not yet seen to go away on a GPU). One untimed replay (the
    graph's upload). After a failed capture the CUDA generators are reset (`reset_cuda_generators`).
    The graph and its private memory pool are dropped before returning."""
    graph = None
    try:
        stream = torch.cuda.current_stream()
        for _ in range(GRAPH_WARMUP):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            fn()
        graph.replay()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples), None
    except Exception as e:  # noqa: BLE001 - any failure to capture or replay is this row's note, not the run's end
        # an error inside the capture makes its end raise too ("... during capture"): name the first one
        while e.__context__ is not None and not e.__suppress_context__:
            e = e.__context__
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
        try:
            reset_cuda_generators()
        except Exception as reset_error:  # noqa: BLE001 - said in the note; the next random draw will fail loudly
            why += f"; the CUDA generators could not be reset ({type(reset_error).__name__}: {reset_error})"[:240]
        return None, why
    finally:
        torch.cuda.synchronize()
        graph = None  # frees the graph's pool (the captured call's outputs and workspace) for empty_cache
        torch.cuda.empty_cache()


def reset_cuda_generators() -> None:
    """Make PyTorch's CUDA generators usable again after a failed capture. A capture marks each
    generator's state as capturing, and only a capture that ends well unmarks it; after a failed one
    (PyTorch 2.11 on an H200, 2026-11-28) every later random draw of the process raised "Offset
    increment outside graph capture encountered unexpectedly": the rest of the benchmark, and 50 more
    tests in the same pytest worker. A clone of the state (the same seed and offset, not capturing)
    replaces it."""
    for generator in torch.cuda.default_generators:
        generator.graphsafe_set_state(generator.clone_state())


def graph_ms_retried(fn, repeats) -> Tuple[Optional[float], Optional[str], Optional[str]]:
    """`graph_ms`, tried once more when the first capture fails: (ms, None, None) from a first try
    that worked; (ms, None, why the first failed) from a second; (None, why, None) when both failed.
    On the H200 (2026-11-26) the first condition's captures of the rows with a table gradient failed
    ("operation would make the legacy stream depend on a capturing blocking stream") where the same
    rows captured in every later condition. Its likely cause (tensors made on the legacy stream, see
    `graph_ms`) is avoided since, and a second try still outlives a one-time failure."""
    replay_ms, why = graph_ms(fn, repeats)
    if why is None:
        return replay_ms, None, None
    again, why_again = graph_ms(fn, repeats)
    if why_again is None:
        return again, None, why
    return None, why, None


def kernel_times(fn, device, repeats: int) -> Dict[str, float]:
    """Milliseconds per call of each kernel (CUDA) or operator (CPU) that ``fn`` runs, by name, from
    torch.profiler over ``repeats`` calls (the triton backend's three kernels, `_dropout_bits_kernel`
    with DROPOUT_MASK "bits", and the small PyTorch operations around them: bias rows, padding counts,
    the table gradient's sum; delta too with the fused backward). Names that take under 1% of the total
    are summed as "other"."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
        if cuda:
            torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        total = event.self_device_time_total if cuda else event.self_cpu_time_total
        if total > 0:
            times[event.key] = total / 1000.0 / repeats
    whole = sum(times.values()) or 1.0
    kept = {k: v for k, v in times.items() if v >= 0.01 * whole}
    other = whole - sum(kept.values())
    if other > 0:
        kept["other"] = other
    return dict(sorted(kept.items(), key=lambda kv: -kv[1]))


def max_error(result, reference) -> float:
    """Largest abs error over output and gradients, each relative to its reference's largest value."""
    worst = 0.0
    for got, ref in zip([result[0], *result[1]], [reference[0], *reference[1]]):
        if got is None or ref is None:
            continue
        scale = ref.abs().max().item() or 1.0
        worst = max(worst, (got.to(ref.dtype) - ref).abs().max().item() / scale)
    return worst


def reference_result(name, case, backward, device):
    """The same function evaluated in float64 (CPU) or float32 (CUDA) with the eager backend."""
    wide = torch.float64 if device.type == "cpu" else torch.float32
    q, k, v, pad, table, grad_out = case
    table_wide = RelativePositionBias(table.num_heads, table.num_buckets, table.max_distance, True).to(device, wide)
    table_wide.load_state_dict(table.state_dict())
    wide_case = (q.to(wide), k.to(wide), v.to(wide), pad, table_wide, grad_out.to(wide))
    return step_fn("eager-nobias" if bias_free(name) else "eager", *wide_case, 0.0, backward)()


def bias_free(name: str) -> bool:
    """Whether the row computes attention without the bias (its reference is the bias-free one)."""
    return name in NOBIAS or name == BASELINE


def backward_supported(name, device) -> bool:
    return device.type == "cuda" or name not in ("flex", "flex-distance", "flex-nobias")


def available(name, device, head_dim: int = 64, length: Optional[int] = None,
              dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """None, or why the backend cannot run here as itself: a triton row whose structure the kernels would
    not take, so that its time would be another's under its name (the fused backward falling back to the
    split one; FAR_LOOPS at a length where the kernels keep one loop, `far_loops_pay`)."""
    if name == "fused":
        import fused_ops

        ok, reason = fused_ops.fused_backend_status(device)
        return None if ok else reason
    base, _, tiles = name.partition(":")
    if base == BASELINE:
        tfb = _baseline_module()
        if tfb.triton is None:
            return "triton is not importable"
        from ast_t5.modules import triton_rpe_attention as tra

        if device.type == "cpu" and not tra.INTERPRETED:
            return "CPU: set TRITON_INTERPRET=1"
        if head_dim < 16 or head_dim & (head_dim - 1):
            return f"head size {head_dim}: the baseline takes powers of two >= 16"
    if base in TRITON_ROWS:
        from ast_t5.modules import triton_rpe_attention as tra

        if tra.triton is None:
            return f"triton is not importable ({tra.TRITON_IMPORT_ERROR})"
        if device.type == "cpu" and not tra.INTERPRETED:
            return "CPU: set TRITON_INTERPRET=1"
        far_loops = TRITON_ROWS[base].get("FAR_LOOPS", "none")
        if TRITON_ROWS[base].get("BACKWARD") == "fused":
            why = tra.fused_backward_unfit(device, head_dim)
            if why:
                return why
        if far_loops != "none" and length is not None:
            blocks = tra.resolve_blocks(tuple(int(x) for x in tiles.split("x")) if tiles else
                                        tra.BLOCKS_OVERRIDE or tra.default_blocks(head_dim, device, dtype=dtype))
            minimum = TRITON_ROWS[base].get("FAR_LOOPS_MIN_LENGTH", tra.FAR_LOOPS_MIN_LENGTH)
            if not tra.far_loops_pay(length, length, MAX_DISTANCE, blocks, minimum):
                return (f"T = {length} is within {minimum} (M + tile) = {minimum * (MAX_DISTANCE + max(blocks[:3]))}: "
                        "the kernels keep one loop there")
    return None


def condition_winner(rows: List[Dict]) -> Optional[Dict]:
    """The fastest biased backend of one condition that ran as itself (not through a fallback)."""
    def kind(row):
        base = row["backend"].split(":")[0]
        return "triton" if base in TRITON_ROWS else base
    own = [r for r in rows if r.get("ms") is not None and kind(r) in OWN_KERNELS and r["backend"] not in PARTIAL
           and r.get("ran", "").split("+")[0] in OWN_KERNELS[kind(r)]]
    if not own:
        return None
    best = min(own, key=lambda r: r["ms"])
    return dict(length=best["length"], dropout=best["dropout"], padded=best["padded"], backend=best["backend"],
                ms=best["ms"], x_sdpa=best.get("x_sdpa"), x_prebuilt=best.get("x_prebuilt"))


def run(args, on_condition: Optional[Callable[[Dict], None]] = None) -> Dict:
    """Every condition and backend; ``on_condition(payload so far)`` after each condition (the
    JSON is rewritten then, so a run cut short by a time limit still leaves what it measured). A
    --graph run on CUDA works on one side stream throughout: `graph_ms` captures on it."""
    if args.graph and torch.device(args.device).type == "cuda":
        with torch.cuda.stream(torch.cuda.Stream()):
            return run_conditions(args, on_condition)
    return run_conditions(args, on_condition)


def run_conditions(args, on_condition: Optional[Callable[[Dict], None]] = None) -> Dict:
    """`run`'s work, on the current stream."""
    from ast_t5.modules.triton_rpe_attention import KERNEL_ERRORS

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    paddings = {"both": (False, True), "none": (False,), "padded": (True,)}[args.padding]
    rows: List[Dict] = []
    winners: List[Dict] = []
    nobias_winners: List[Dict] = []
    print(f"# attention fwd+bwd, B{args.batch} H{args.heads} D{args.head_dim} {args.dtype} on "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
          f"median of {args.repeats}; floor at {args.peak_tflops:g} TFLOP/s")
    header = (f"{'T=S':>5} {'drop':>4} {'pad':>3} {'backend':<22} {'ran':<22} {'ms':>9} {'host ms':>8} "
              + (f"{'graph ms':>8} " if args.graph else "")
              + f"{'TFLOP/s':>8} {'floor ms':>8} {'err/ref':>7} {'x sdpa':>6} {'x pre':>6}")
    if args.split:
        header += f" {'fwd ms':>7} {'bwd ms':>7}"
    print(header)
    for length in args.lengths:
        # a fresh compile cache per length: flex's compiled call (fullgraph) recompiles per length,
        # dropout and padding, and a second length in one process went past dynamo's recompile
        # limit (FailOnRecompileLimitHit on an H200, 2026-11-25)
        torch._dynamo.reset()
        # unpadded conditions first, both dropout rates: the issue's targets (1.0 ms without dropout, 2x
        # SDPA-with-bias with it) are read there, and the JSON is rewritten after each condition, so a run
        # cut by gpu_check's time limit keeps them
        for padded, dropout in [(p, d) for p in paddings for d in args.dropouts]:
            case = make_case(args, length, padded, dtype, device)
            flops = flops_fwd_bwd(args.batch, args.heads, length, length, args.head_dim)
            floor_ms = flops / (args.peak_tflops * 1e12) * 1e3
            ref_cache = {}
            condition_rows = []
            for name in args.backends:
                row = dict(length=length, dropout=dropout, padded=padded, backend=name, dtype=args.dtype,
                           batch=args.batch, heads=args.heads, head_dim=args.head_dim, floor_ms=floor_ms)
                why = available(name, device, args.head_dim, length, dtype)
                backward = backward_supported(name, device)
                fn = None if why else step_fn(name, *case, dropout, backward)
                if fn is None:
                    row.update(ms=None, note=why or ("= triton (no dropout)" if name.partition(":")[0] in
                                                     DROPOUT_ROWS else "no dropout in the baseline"
                                                     if name == BASELINE else "no dropout in FlexAttention"))
                else:
                    try:
                        ab.DISPATCH_COUNTS.clear()
                        result = fn()
                        row["ran"] = "+".join(sorted(ab.DISPATCH_COUNTS)) or name
                        row["pass"] = "fwd+bwd" if backward else "fwd"
                        row["ms"], row["host_ms"] = time_ms(fn, device, args.warmup, args.repeats)
                        row["tflops"] = (flops if backward else flops / 3.5) / (row["ms"] * 1e-3) / 1e12
                        if args.split and backward:
                            row["fwd_ms"] = time_ms(step_fn(name, *case, dropout, False), device,
                                                    args.warmup, args.repeats).ms
                        if args.kernel_times and (name.split(":")[0] in TRITON_ROWS
                                                  or name in (BASELINE, "triton-nobias")):
                            row["kernels"] = kernel_times(fn, device, args.repeats)
                        if dropout == 0.0:
                            key = ("bias-free" if bias_free(name) else "biased", backward)
                            if key not in ref_cache:
                                ref = reference_result(name, case, backward, device)
                                own = step_fn("eager-nobias" if bias_free(name) else "eager",
                                              *case, 0.0, backward)()
                                ref_cache[key] = (ref, max_error(own, ref))
                            ref, own_err = ref_cache[key]
                            row["max_err"] = max_error(result, ref)
                            row["torch_err"] = own_err
                            row["err_ratio"] = row["max_err"] / own_err if own_err > 0 else None
                        if args.graph and device.type == "cuda" and graphed(name):  # last: a failed
                            # capture leaves the rest
                            replay_ms, why, first = graph_ms_retried(fn, args.repeats)
                            if why is None:
                                row["graph_ms"] = replay_ms
                            else:
                                row["graph_note"] = why
                            if first is not None:
                                row["graph_first_try"] = first
                    except KERNEL_ERRORS as e:  # OOM, kernel refusals, a tile needing too much shared memory
                        row.update(ms=None, note=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
                condition_rows.append(row)
            sdpa_ms = next((r["ms"] for r in condition_rows if r["backend"] == "sdpa" and r.get("ms")), None)
            pre_ms = next((r["ms"] for r in condition_rows if r["backend"] == "sdpa-prebuilt" and r.get("ms")),
                          None)
            for row in condition_rows:
                if sdpa_ms and row.get("ms"):
                    row["x_sdpa"] = sdpa_ms / row["ms"]
                if pre_ms and row.get("ms"):
                    row["x_prebuilt"] = pre_ms / row["ms"]
                print(format_row(row, args.graph), flush=True)
            for row in condition_rows:
                if row.get("graph_note"):
                    print(f"# graph of {row['backend']} (T={length} dropout {dropout:g} padded "
                          f"{'yes' if padded else 'no'}) not timed: {row['graph_note']}", flush=True)
                if row.get("graph_first_try"):
                    print(f"# graph of {row['backend']} (T={length} dropout {dropout:g} padded "
                          f"{'yes' if padded else 'no'}) captured at the second try; the first: "
                          f"{row['graph_first_try']}", flush=True)
                if row.get("kernels"):
                    print(f"# kernels of {row['backend']} (T={length} dropout {dropout:g} padded "
                          f"{'yes' if padded else 'no'}), ms per call: "
                          + ", ".join(f"{k[:40]} {v:.3f}" for k, v in list(row["kernels"].items())[:8]),
                          flush=True)
            winner = condition_winner(condition_rows)
            if winner is not None:
                winners.append(winner)
                vs = "" if winner["x_sdpa"] is None else f", {winner['x_sdpa']:.2f}x sdpa"
                vs += "" if winner["x_prebuilt"] is None else f", {winner['x_prebuilt']:.2f}x sdpa-prebuilt"
                print(f"# winner T={length} dropout {dropout:g} padded {'yes' if padded else 'no'}: "
                      f"{winner['backend']} {winner['ms']:.3f} ms{vs}", flush=True)
            free = [r for r in condition_rows if r["backend"] in NOBIAS and r.get("ms") is not None
                    and r.get("pass") == "fwd+bwd"]
            if len(free) > 1:
                best = min(free, key=lambda r: r["ms"])
                nobias_winners.append(dict(length=length, dropout=dropout, padded=padded,
                                           backend=best["backend"], ran=best.get("ran"), ms=best["ms"],
                                           others={r["backend"]: r["ms"] for r in free if r is not best}))
                print(f"# bias-free winner T={length} dropout {dropout:g} padded {'yes' if padded else 'no'}: "
                      f"{best['backend']} ({best.get('ran')}) {best['ms']:.3f} ms; "
                      + ", ".join(f"{r['backend']} {r['ms']:.3f}" for r in free if r is not best), flush=True)
            if on_condition is not None:
                on_condition(payload(args, device, rows, winners, nobias_winners))
    return payload(args, device, rows, winners, nobias_winners)


def triton_settings(device, head_dim: int, dtype: torch.dtype) -> Dict:
    """What the ``triton`` row ran with: triton_rpe_attention's settings (which its name does not say, and
    which changed: FAR_LOOPS "none" until 2026-11-27) and its default tiles at this head size."""
    from ast_t5.modules import triton_rpe_attention as tra

    if tra.triton is None:
        return {"error": f"triton is not importable ({tra.TRITON_IMPORT_ERROR})"}
    return {"FAR_LOOPS": tra.FAR_LOOPS, "BACKWARD": tra.BACKWARD, "DROPOUT_MASK": tra.DROPOUT_MASK,
            "BIAS_LAYOUT": tra.BIAS_LAYOUT,
            "tiles": list(tra.BLOCKS_OVERRIDE or tra.default_blocks(head_dim, device, dtype=dtype))}


def payload(args, device, rows, winners, nobias_winners=()) -> Dict:
    return dict(device=str(device), device_name=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                torch=torch.__version__, peak_tflops=args.peak_tflops, repeats=args.repeats, rows=rows,
                winners=winners, nobias_winners=list(nobias_winners),
                triton=triton_settings(device, args.head_dim, DTYPES[args.dtype]))


def format_row(row, graph: bool = False) -> str:
    """One line of the table; ``graph``: with the ``graph ms`` column (--graph)."""
    ms = "n/a" if row.get("ms") is None else f"{row['ms']:.3f}"
    host = "n/a" if row.get("host_ms") is None else f"{row['host_ms']:.3f}"
    graph_column = "" if not graph else ("n/a" if row.get("graph_ms") is None else f"{row['graph_ms']:.3f}")
    tf = "" if row.get("tflops") is None else f"{row['tflops']:.1f}"
    err = "" if row.get("err_ratio") is None else f"{row['err_ratio']:.2f}"
    xs = "" if row.get("x_sdpa") is None else f"{row['x_sdpa']:.2f}"
    xp = "" if row.get("x_prebuilt") is None else f"{row['x_prebuilt']:.2f}"
    ran = row.get("ran", row.get("note", ""))[:22]
    if row.get("pass") == "fwd":
        ran = (ran + " (fwd)")[:22]
    line = (f"{row['length']:>5} {row['dropout']:>4g} {'yes' if row['padded'] else 'no':>3} {row['backend']:<22} "
            f"{ran:<22} {ms:>9} {host:>8} " + (f"{graph_column:>8} " if graph else "")
            + f"{tf:>8} {row['floor_ms']:>8.3f} {err:>7} {xs:>6} {xp:>6}")
    if row.get("fwd_ms") is not None:
        line += f" {row['fwd_ms']:>7.3f} {row['ms'] - row['fwd_ms']:>7.3f}"
    return line


def write_json(path: str, payload: Dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("filelock").setLevel(logging.WARNING)  # inductor's cache locks log at DEBUG otherwise
    args = parse_args(argv)
    result = run(args, on_condition=(lambda partial: write_json(args.json, partial)) if args.json else None)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
