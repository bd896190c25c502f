"""Host work between two updates of fairseq's trainer: fairseq's own code against ours, side by side.

    python benchmarks/bench_host_overhead.py                  # CPU: T5-base's module structure, narrow
    python benchmarks/bench_host_overhead.py --device cuda    # the same on a GPU (host-bound by design)
    python benchmarks/bench_host_overhead.py --device cuda --full-width --batch 32 --src-len 512 --tgt-len 114

Every update ends with host synchronizations in fairseq's trainer: ``torch.isfinite(grad_norm)``
before the optimizer step, and the rounding of the logged values (``.item()``) after it. From the
first of them until the next forward is launched, a GPU runs only what the host launches in that
window (the optimizer's kernels), so the host's time there is GPU time lost, once per update.

Two arms run the same config (``config/pretrain/<config>.yaml`` as ``fairseq-hydra-train`` composes
it, bf16 with fp32 master weights, no compilation) through ``Trainer.train_step`` inside
``metrics.aggregate("train_inner")``, as fairseq's train loop calls it:
- ``fairseq``: ``FairseqTask.optimizer_step`` (``FP16Optimizer.step``: one ``copy_`` per parameter
  back into the bf16 weights; the next ``zero_grad``: one ``zero_`` per master gradient),
  ``nn.Module.train`` and ``BaseFairseqModel.set_num_updates`` (a walk over every module each);
- ``ours``: the tasks' ``optimizer_step`` (ast_t5/optim/mixed_precision.py: one batched copy, master
  gradients released) and the model's ``train`` / ``set_num_updates`` (one cheap walk).

Reported per arm (medians of ``--repeats`` interleaved blocks of ``--updates`` updates): ms per
update; host ms from the end of gradient clipping (the first sync follows it at once) to the next
forward's start, and from the last sync (the end of fairseq's ``_reduce_and_log_stats``) to it;
and the ops dispatched in the first window (on a GPU each one that computes is a kernel launch),
counted with a TorchDispatchMode over one update. By default the model is T5-base's structure
(12+12 layers: 198 parameter tensors, 339 modules) at narrow widths, so that the host's work is
what is timed; ``--full-width`` trains the real T5-base.
"""
import argparse
import collections
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train  # noqa: E402

logger = logging.getLogger("bench_host_overhead")
NARROW = ("++model.embed_dim=16", "++model.ffn_dim=32", "++model.head_dim=4")


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops dispatched while it is entered, by name (also used by the tests)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


# ops that dispatch but launch no kernel on a GPU (views, autograd bookkeeping, profiler marks)
NO_KERNEL = {"detach", "alias", "view", "_record_function_enter_new", "_record_function_exit", "lift_fresh"}


class Arm:
    """One trainer, its clock marks, and (for ``fairseq``) fairseq's implementations restored."""

    def __init__(self, name, args, data_dir, device):
        from fairseq.models import BaseFairseqModel
        from fairseq.tasks import FairseqTask

        overrides = ["common.bf16=true", "++model.compile=false", "common.log_interval=1000000",
                     f"common.cpu={str(device.type == 'cpu').lower()}"]
        if not args.full_width:
            overrides += list(NARROW)
        _, task, self.trainer, _ = bench_train.build_trainer(args.config, data_dir, overrides + list(args.override))
        self.name, self.device, self.marks, self.counter = name, device, {}, None
        model = self.trainer.model
        if name == "fairseq":
            task.optimizer_step = types.MethodType(FairseqTask.optimizer_step, task)
            model.train = types.MethodType(torch.nn.Module.train, model)
            model.set_num_updates = types.MethodType(BaseFairseqModel.set_num_updates, model)
        model.register_forward_pre_hook(self._forward_starts)
        clip, reduce_ = self.trainer.optimizer.clip_grad_norm, self.trainer._reduce_and_log_stats

        def clipped(*a, **k):
            out = clip(*a, **k)
            self._mark("clip_end")
            return out

        def reduced(*a, **k):
            out = reduce_(*a, **k)
            self._mark("reduce_end")
            return out

        self.trainer.optimizer.clip_grad_norm = clipped
        self.trainer._reduce_and_log_stats = reduced
        self.windows = {"after_clip": [], "after_last_sync": []}

    def _mark(self, key):
        self.marks[key] = time.perf_counter()
        if key == "clip_end" and self.counter is not None:
            self.counter.__enter__()

    def _forward_starts(self, module, inputs):
        if "forward" not in self.marks:  # the first forward of the update (update_freq > 1: more)
            self.marks["forward"] = time.perf_counter()
        return None

    def update(self, sample):
        from fairseq.logging import metrics

        previous, self.marks = self.marks, {}
        with metrics.aggregate("train_inner"):
            self.trainer.train_step([sample])
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.counter = None
        if "clip_end" in previous and "forward" in self.marks:
            self.windows["after_clip"].append(self.marks["forward"] - previous["clip_end"])
            self.windows["after_last_sync"].append(self.marks["forward"] - previous["reduce_end"])

    def count_ops(self, batches):
        """Ops dispatched from the end of one update's clipping to the next forward's start."""
        self.marks = {}
        self.counter = first = OpCounter()  # entered at the clip's end, left after the train_step
        self.update(batches[0])
        rest = OpCounter()
        state = {"open": True}

        def close(module, inputs):
            if state["open"]:
                rest.__exit__(None, None, None)
                state["open"] = False

        hook = self.trainer.model.register_forward_pre_hook(close)
        rest.__enter__()  # fairseq's loop and the next update's prologue, up to its forward
        try:
            self.update(batches[1 % len(batches)])
        finally:
            hook.remove()
            if state["open"]:
                rest.__exit__(None, None, None)
        return first.ops + rest.ops


def interleaved(arms, batches, updates, repeats, device):
    """Median seconds per update per arm over ``repeats`` blocks, alternating which arm goes first;
    each block starts its windows afresh (a window never spans the other arm's block)."""
    names, times, k = list(arms), {name: [] for name in arms}, 0
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            arm = arms[name]
            arm.marks = {}
            bench_train._sync(device)
            start = time.perf_counter()
            for _ in range(updates):
                arm.update(batches[k % len(batches)])
                k += 1
            bench_train._sync(device)
            times[name].append((time.perf_counter() - start) / updates)
    return {name: statistics.median(t) for name, t in times.items()}, times


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--config", default="base")
    p.add_argument("--full-width", action="store_true", help="the config's real widths (default: narrow)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=8)
    p.add_argument("--vocab", type=int, default=None, help="default: 32128 with --full-width, else 512")
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("fairseq", "ast_t5", "hydra"):
        logging.getLogger(name).setLevel(logging.WARNING)
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_host_overhead: --device cuda, but no CUDA device is visible", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    vocab = args.vocab or (32128 if args.full_width else 512)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = bench_train.write_task_dir(tmp, vocab)
        arms = {name: Arm(name, args, data_dir, device) for name in ("fairseq", "ours")}
    batches = bench_train.make_batches(4, args.batch, args.src_len, args.tgt_len, vocab)
    for arm in arms.values():
        for k in range(args.warmup):
            arm.update(batches[k % len(batches)])
        arm.windows = {key: [] for key in arm.windows}
    per_update, blocks = interleaved(arms, batches, args.updates, args.repeats, device)
    ops = {name: arm.count_ops(batches) for name, arm in arms.items()}
    params = len(arms["ours"].trainer.optimizer.fp32_params)
    modules = len(list(arms["ours"].trainer.model.modules()))
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "config": args.config,
           "full_width": args.full_width, "shape": [args.batch, args.src_len, args.tgt_len], "params": params,
           "modules": modules, "arms": {}}
    print(f"{args.config} ({'full width' if args.full_width else 'narrow'}; {params} parameter tensors, "
          f"{modules} modules), batch {args.batch} x {args.src_len}/{args.tgt_len}, bf16, {device.type}; "
          f"medians of {args.repeats} blocks of {args.updates} updates")
    print(f"{'arm':8} {'ms/update':>10} {'after clip ms':>14} {'after last sync ms':>19} {'ops after clip':>15}"
          f" {'launching':>10}")
    for name, arm in arms.items():
        launching = sum(c for op, c in ops[name].items() if op not in NO_KERNEL)
        row = {"ms_per_update": 1e3 * per_update[name],
               "after_clip_ms": 1e3 * statistics.median(arm.windows["after_clip"]),
               "after_last_sync_ms": 1e3 * statistics.median(arm.windows["after_last_sync"]),
               "ops_after_clip": sum(ops[name].values()), "launching_ops_after_clip": launching,
               "top_ops_after_clip": dict(ops[name].most_common(6)), "blocks_ms": [1e3 * t for t in blocks[name]]}
        out["arms"][name] = row
        print(f"{name:8} {row['ms_per_update']:10.2f} {row['after_clip_ms']:14.2f} {row['after_last_sync_ms']:19.2f}"
              f" {row['ops_after_clip']:15d} {launching:10d}")
    inner = getattr(getattr(arms["ours"].trainer.optimizer, "fp32_optimizer", None), "optimizer", None)
    if any(group.get("compiled") for group in getattr(inner, "param_groups", ())):
        out["optimizer_counted_eagerly"] = True
        print("optimizer.compiled: the ops were counted with a TorchDispatchMode, which torch.compile cannot run "
              "under, so the update ran eagerly there: its ops are counted as its foreach ops, not the few "
              "kernels of the compiled update (the times are the compiled update's)")
    f, o = out["arms"]["fairseq"], out["arms"]["ours"]
    out["after_clip_saved_ms"] = f["after_clip_ms"] - o["after_clip_ms"]
    out["speedup_per_update"] = f["ms_per_update"] / o["ms_per_update"]
    print(f"host time after clipping per update: ours saves {out['after_clip_saved_ms']:.2f} ms "
          f"({f['launching_ops_after_clip']} -> {o['launching_ops_after_clip']} launching ops); "
          f"update time ratio fairseq / ours {out['speedup_per_update']:.3f}x")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
