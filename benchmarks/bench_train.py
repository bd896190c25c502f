"""Pre-training throughput through the real trainer, against the compiled Hugging Face recipe.

    python benchmarks/bench_train.py --device cuda               # T5-base, bf16, compiled (minutes)
    python benchmarks/bench_train.py --device cuda --profile     # + the time budget of one update
    python benchmarks/bench_train.py --device cpu                # tiny shape, what CI runs (seconds)
    python benchmarks/bench_train.py --device cuda --no-hf --versus "++model.attention_backend=triton"
                                                                 # a variant of ours beside it, in one run

Ours is exactly what ``fairseq-hydra-train --config-name base`` runs per update: the config is
composed from config/pretrain/<config>.yaml with Hydra, and fairseq's ``Trainer.train_step`` runs
our task (``ast_t5_pretraining``), criterion (``ast_t5_span_cross_entropy``), optimizer
(``adamw_scale``, through fairseq's bf16 wrapper with fp32 master weights when
``common.bf16=true``), clipping and lr schedule, on batches made in memory (random tokens in
span-corruption shape: the source right-padded by a different amount per row, the target
starting with ``</s>``; the task needs only a dictionary, so no corpus is read).

In the same run, Hugging Face ``T5ForConditionalGeneration`` of the same shape and weights trains
with the nanoT5 recipe: fp32 weights, bf16 autocast, ``torch.compile``, the loss computed by the
model from its labels (inside the compiled graph), ``torch.optim.AdamW``, gradient clipping at the
same norm, on identical batches. Each is warmed up (compilation included; its peak memory above
what was resident before it is measured there), then ``--repeats`` blocks of ``--updates`` updates
alternate between the two, first one then the other first; the median seconds per update of each
is reported. ``--json`` is first written with ours alone (one block of updates right after its
warm-up, ``"partial"`` says so), before Hugging Face's model is built and compiled, then again with
the comparison and again with the profile, so that a run stopped by a time limit keeps what it
measured. ``--versus OVERRIDES`` (repeatable) builds one more trainer of ours per variant (the Hydra
overrides after ours', e.g. another attention backend or ``+optimizer.compiled=true``), warms it up,
and times it in the same interleaved blocks: each variant's tokens/s over ours', side by side in one
run (``"variants"`` in the JSON). A variant that raises while it is built or warmed up (a compile
error, out of memory) is logged and listed with its error in ``"failed_variants"``; the others run.

FLOPs per update: `ast_t5.models.flops.training_flops` (what the training log's ``tflops`` and
``mfu`` count), from the padded batch shapes (what the hardware computes): ``6 x ((encoder
matrices + the decoder's cross-attention K/V matrices) x B x S + other decoder matrices incl. the
output head x B x T)`` plus attention's ``3 x 4 x B x heads x head_dim x (enc_layers x S^2 +
dec_layers x (T^2 + T x S))`` (q k^T and p v, forward and backward; lookups excluded, causal
attention counted in full). MFU divides by the device's dense bf16 peak (H100 SXM: 989 TFLOP/s;
``--peak-tflops`` overrides). Tokens/s counts
non-pad source plus target tokens.

``--profile`` splits one update of ours into forward (criterion call), backward, optimizer (clip and
step), data (making and collating a batch with the real masking code on one core, and the copy to
the device), and the rest of ``Trainer.train_step`` (fairseq's bookkeeping, host syncs, log
reduction), each timed with device synchronization around it, beside its floor (FLOPs at the
measured matrix-multiply rate; optimizer bytes at the measured copy bandwidth). On CUDA it also
lists every host synchronization in one update (``torch.cuda.set_sync_debug_mode``) by call site,
and the GPU time of one profiled update by aten op and by kind of kernel (matrix products,
attention, inductor's fused kernels, copies, optimizer...: `KERNEL_KINDS`), with the GPU's busy
share of the update's span.
"""
import argparse
import contextlib
import copy
import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import PAD, model_flops_per_step, peak_tflops  # noqa: E402
from bench_recipe import DEFAULTS as RECIPE_DEFAULTS  # noqa: E402
from ast_t5_preprocess.tokenizer import DEFAULT_NUM_SENTINELS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, "config", "pretrain")
logger = logging.getLogger("bench_train")

# The vocabulary of bench_recipe.py's corpus on CUDA (the default corpus preprocessed at 32000
# pieces, plus the preprocessing's sentinels: 32256 symbols). With it the model has the very shapes of
# the recipe's, so after `bench_recipe.py --device cuda` on the same machine (scripts/gpu_check.sh
# runs it first) our compilation loads its graphs from inductor's on-disk cache instead of compiling
# T5-base again (136 s on an H200; on CPU the tiny model's 34 s became 4.3 s). nanoT5 uses T5's
# 32128 (0.4% fewer output-layer FLOPs, the same for both models compared).
RECIPE_VOCAB = RECIPE_DEFAULTS["cuda"][4] + DEFAULT_NUM_SENTINELS
# (config, vocabulary, batch, source length, target length) per device: the GPU shape is nanoT5's
# and the (B64 x 512/114); the CPU shape is the tiny config, fast enough for CI.
SHAPES = {"cuda": ("base", RECIPE_VOCAB, 64, 512, 114), "cpu": ("tiny", 512, 4, 64, 16)}
NUM_SENTINELS = 100
OPTIMIZER_BYTES_PER_PARAM = 36  # fp32 master p, m, v read + written (24), fp32 grad read (4),
# bf16 grad read and bf16 weight write (4), the fp32 grad written by the bf16 wrapper (4)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def write_task_dir(root: str, vocab: int, num_sentinels: int = NUM_SENTINELS) -> str:
    """The three files ast_t5_pretraining reads at setup: dict.txt, tokenizer.json, data_weights.json."""
    from fairseq.data import Dictionary

    n_pieces = vocab - len(Dictionary()) - num_sentinels
    with open(os.path.join(root, "dict.txt"), "w", encoding="utf-8") as f:
        for i in range(n_pieces):
            f.write(f"piece{i} 1\n")
        for i in range(num_sentinels):
            f.write(f"<sentinel_{i}> 1\n")
    with open(os.path.join(root, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump({"vocab_size": vocab, "num_sentinels": num_sentinels}, f)
    with open(os.path.join(root, "data_weights.json"), "w", encoding="utf-8") as f:
        json.dump({"python": 1.0}, f)
    return root


def compose(config: str, overrides):
    """The config fairseq-hydra-train would run (Hydra 1.1 semantics, fairseq's schema)."""
    import hydra_plugins.ast_t5_hydra  # noqa: F401  (the ${ast_t5_user_dir:} resolver)
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    hydra_init(config)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.1"):
        cfg = hydra_compose(config_name=config, overrides=list(overrides))
    add_defaults(cfg)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(cfg, True)
    return cfg


def build_trainer(config: str, data_dir: str, overrides=()):
    """fairseq's Trainer with our task, model, criterion and optimizer, as fairseq_cli.train builds it."""
    from fairseq import tasks, utils
    from fairseq.trainer import Trainer

    cfg = compose(config, [f"task.data={data_dir}", "dataset.num_workers=0", "optimization.update_freq=[1]",
                           "common.tensorboard_logdir=null", *overrides])
    utils.import_user_module(cfg.common)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    initial = copy.deepcopy(model.state_dict())
    trainer = Trainer(cfg, task, model, criterion)
    trainer.lr_step(0)  # builds the optimizer and sets the first lr, as train.py's begin
    return cfg, task, trainer, initial


def make_batches(count: int, batch: int, src_len: int, tgt_len: int, vocab: int, seed: int = 0):
    """Batches in the task's collated format; the source rows padded by different amounts."""
    g = torch.Generator().manual_seed(seed)
    first_regular, eos = 4, 2
    out = []
    for k in range(count):
        src = torch.randint(first_regular, vocab - NUM_SENTINELS, (batch, src_len), generator=g)
        tgt = torch.randint(first_regular, vocab - NUM_SENTINELS, (batch, tgt_len), generator=g)
        lengths = torch.full((batch,), src_len)
        for i in range(batch):
            cut = src_len - ((i + k) % batch) * src_len // (4 * batch)
            src[i, cut:] = PAD
            lengths[i] = cut
        src[torch.arange(batch), lengths - 1] = eos
        tgt[:, -1] = eos
        prev = torch.cat([torch.full((batch, 1), eos), tgt[:, :-1]], dim=1)
        out.append({"id": torch.arange(batch), "nsentences": batch, "ntokens": int(tgt.ne(PAD).sum()),
                    "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
                    "target": tgt})
    return out


def batch_tokens(sample) -> int:
    return int(sample["net_input"]["src_tokens"].ne(PAD).sum() + sample["target"].ne(PAD).sum())


def flops_per_update(model, sample) -> float:
    n = sample["net_input"]
    return model_flops_per_step(model, (n["src_tokens"], n["prev_output_tokens"], sample["target"]))


def _warm_up(update, batches, count, device, resident_before=0):
    """Run ``count`` untimed updates (compilation happens here); seconds and the peak memory
    above ``resident_before`` bytes (CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for k in range(count):
        update(batches[k % len(batches)])
    _sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - resident_before) / 2**30 if device.type == "cuda" else None
    return seconds, peak


def interleaved_blocks(updates_by_name, batches, updates, repeats, device):
    """Median seconds per update per name: ``repeats`` blocks of ``updates`` updates each,
    alternating which one goes first, so that load drifts hit both alike."""
    times = {name: [] for name in updates_by_name}
    names = list(updates_by_name)
    k = 0
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            _sync(device)
            start = time.perf_counter()
            for _ in range(updates):
                updates_by_name[name](batches[k % len(batches)])
                k += 1
            _sync(device)
            times[name].append((time.perf_counter() - start) / updates)
    return {name: statistics.median(t) for name, t in times.items()}, times


def setup_ours(args, device, data_dir, extra=()):
    """fairseq's Trainer for ``args.config`` and an update function over it; ``extra``: more Hydra
    overrides, after all others (a ``--versus`` variant's: the last value of a key wins)."""
    overrides = [f"common.cpu={'true' if device.type == 'cpu' else 'false'}",
                 f"common.bf16={'true' if args.bf16 else 'false'}",
                 f"++model.compile={'true' if args.compile else 'false'}",
                 f"++model.attention_backend={args.backend}",
                 f"++criterion.fused_cross_entropy={args.fused_ce}",
                 "common.log_interval=1000000"]
    if args.compile_backend:
        overrides.append(f"++model.compile_backend={args.compile_backend}")
    _, _, trainer, initial = build_trainer(args.config, data_dir, overrides + list(args.override) + list(extra))
    # on CUDA fairseq's train_step resets the peak memory statistics at the end of every update (to log
    # gb_free), so the warm-up's peak would be what the last update left allocated, not its peak; without
    # its CUDA environment record it neither resets nor logs that
    trainer.cuda_env = None
    losses, ooms = [], []
    log_oom = trainer._log_oom
    trainer._log_oom = lambda e: (ooms.append(1), log_oom(e))  # count fairseq's OOM recoveries

    def update(sample):
        log = trainer.train_step([sample])
        if log is not None and "loss" in log:
            losses.append(float(log["loss"]))

    def info():
        model = trainer.model
        return {"num_updates": trainer.get_num_updates(), "loss_last": losses[-1] if losses else None,
                "compile_seconds": getattr(model, "compile_seconds", 0.0),
                "compile_cache_hits": getattr(model, "compile_cache_hits", 0),
                "compile_cache_misses": getattr(model, "compile_cache_misses", 0),
                "ce_path": getattr(trainer.criterion, "last_path", None),
                "attention_backend": str(model.cfg.attention_backend),
                "optimizer_compiled": bool(trainer.cfg.optimizer.get("compiled", False)),
                "param_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                "oom_recoveries": len(ooms)}
    return trainer, initial, update, info


def setup_hf(args, device, initial, ours_cfg, vocab):
    """nanoT5's recipe: fp32 weights, bf16 autocast, torch.compile, AdamW, clipping."""
    from transformers import T5ForConditionalGeneration

    from ast_t5.models.hf_conversion import hf_t5_config, ours_to_hf_state_dict

    model = T5ForConditionalGeneration(hf_t5_config(ours_cfg, vocab))
    model.load_state_dict(ours_to_hf_state_dict(initial))
    model = model.to(device).train()
    forward = torch.compile(model) if args.hf_compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.hf_lr)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    losses = []

    def update(sample):
        n = sample["net_input"]
        src = n["src_tokens"].to(device, non_blocking=True)
        prev = n["prev_output_tokens"].to(device, non_blocking=True)
        tgt = sample["target"].to(device, non_blocking=True)
        with autocast:  # nanoT5's way: the labels in, the loss computed inside the compiled model
            loss = forward(input_ids=src, attention_mask=src.ne(PAD), decoder_input_ids=prev,
                           labels=tgt.masked_fill(tgt.eq(PAD), -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    def info():
        return {"loss_last": float(losses[-1]) if losses else None}
    return update, info


def measured_ceilings(device):
    """Matrix-multiply rate (bf16 on CUDA, fp32 on CPU) and device copy bandwidth, measured here."""
    n = 8192 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    reps = 20 if device.type == "cuda" else 5
    for _ in range(2):
        a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    flops = 2 * n ** 3 * reps / (time.perf_counter() - start)
    x = torch.empty(2**28 if device.type == "cuda" else 2**24, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    _sync(device)
    bandwidth = 2 * x.numel() * reps / (time.perf_counter() - start)
    return flops, bandwidth


def profile_update(args, trainer, batches, device):
    """Seconds per part of one update (median over repeats) and each part's floor."""
    from fairseq import utils as fairseq_utils

    model, criterion, optimizer = trainer.model, trainer.criterion, trainer.optimizer
    sample = batches[0]
    cast = (lambda t: t.to(torch.bfloat16) if t.dtype == torch.float32 else t) if args.bf16 else (lambda t: t)
    parts = {k: [] for k in ("forward", "backward", "optimizer", "data_copy", "train_step")}

    def timed(fn):
        _sync(device)
        start = time.perf_counter()
        out = fn()
        _sync(device)
        return out, time.perf_counter() - start

    for r in range(args.repeats + 1):
        on_device, t_copy = timed(lambda: fairseq_utils.apply_to_sample(
            cast, fairseq_utils.move_to_cuda(sample) if device.type == "cuda" else sample))
        model.train()
        optimizer.zero_grad()
        (loss, _, _), t_fwd = timed(lambda: criterion(model, on_device))
        _, t_bwd = timed(lambda: optimizer.backward(loss))

        def opt_step():  # as Trainer.train_step runs it: clipping, then the task's optimizer step
            optimizer.clip_grad_norm(trainer.cfg.optimization.clip_norm)
            trainer.task.optimizer_step(optimizer, model=model, update_num=trainer.get_num_updates())
        _, t_opt = timed(opt_step)
        optimizer.zero_grad()  # outside the timed step: train_step zeroes at its start, timed in its own row
        _, t_step = timed(lambda: trainer.train_step([sample]))
        if r:  # the first round warms up
            for key, value in zip(parts, (t_fwd, t_bwd, t_opt, t_copy, t_step)):
                parts[key].append(value)
    seconds = {k: statistics.median(v) for k, v in parts.items()}
    seconds["data_make"] = data_make_seconds(sample)
    seconds["trainer_rest"] = max(0.0, seconds["train_step"] - seconds["forward"] - seconds["backward"]
                                  - seconds["optimizer"] - seconds["data_copy"])
    flop_rate, bandwidth = measured_ceilings(device)
    fwd_flops = flops_per_update(model, sample) / 3.0
    n_params = sum(p.numel() for p in model.parameters())
    floors = {"forward": fwd_flops / flop_rate, "backward": 2 * fwd_flops / flop_rate,
              "optimizer": OPTIMIZER_BYTES_PER_PARAM * n_params / bandwidth,
              "data_copy": 3 * 8 * sample["net_input"]["src_tokens"].numel() / bandwidth,
              "data_make": 0.0, "trainer_rest": 0.0, "train_step": 3 * fwd_flops / flop_rate}
    syncs = sync_sites(trainer, sample) if device.type == "cuda" else None
    ops, kinds = op_shares(trainer, sample) if device.type == "cuda" else (None, None)
    return {"seconds": seconds, "floors": floors, "matmul_flops_per_s": flop_rate,
            "copy_bytes_per_s": bandwidth, "params": n_params, "host_syncs": syncs, "gpu_op_shares": ops,
            "gpu_kernel_kinds": kinds}


def op_shares(trainer, sample, top: int = 12):
    """One profiled train_step (torch.profiler): the share of the GPU time per aten op (the top ones
    and copy_; under model.compile inductor's kernels belong to no aten op, so these cover only the
    rest) and, per kind of GPU kernel, `kernel_kinds` of every kernel the step ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    prof = profile_second_call(lambda: trainer.train_step([sample]), torch.device("cuda"),
                               [ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def device_time(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    ops = [(e.key, device_time(e)) for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(t for _, t in ops) or 1
    shares = {k: t / total for k, t in sorted(ops, key=lambda x: -x[1])[:top]}
    shares["aten::copy_ (all)"] = sum(t for k, t in ops if k == "aten::copy_") / total
    return shares, kernel_kinds(device_events(prof, DeviceType.CUDA))


def profile_second_call(fn, device, activities):
    """A finished torch.profiler run over two calls of ``fn`` that recorded the second only: the
    profiler's own start-up (CUPTI's, on CUDA) falls in the first."""
    from torch.profiler import profile, schedule

    _sync(device)
    # one cycle (repeat=1): with cycles repeating, leaving the context would start and stop an empty one
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
        for _ in range(2):
            fn()
            _sync(device)
            prof.step()
    return prof


def device_events(prof, device_type) -> list:
    """(name, start us, duration us) of every event a finished torch.profiler ``prof`` recorded on
    ``device_type`` (torch.autograd.DeviceType.CUDA: the kernels, copies and fills the GPU ran).
    The ranges of ``record_function`` (ProfilerStep#N, and bench_train's forward, backward,
    optimizer...) are left out: the profiler mirrors them on the GPU's timeline as events spanning
    the kernels they hold, which counted the same time twice (a 115 ms update read "269 ms busy,
    233%" with 60% of it "other" on the H200, 2026-11-27)."""
    events = prof.events()
    ranges = {e.name for e in events if getattr(e, "is_user_annotation", False) or e.name.startswith("ProfilerStep")}
    return [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in events
            if e.device_type == device_type and not getattr(e, "is_user_annotation", False) and e.name not in ranges]


# Kinds of GPU kernels by name, the first match winning: (kind, substrings of the lower-cased name).
# Inductor names its kernels triton_{poi,red,per}_fused_<ops> (pointwise, reduction, persistent
# reduction) and triton_tem_fused_<ops> for templates (matrix products; flex_attention). Its fused
# kernels are named after every op they took in, so one that builds SDPA's mask or reduces its bias
# gradient reads "..._scaled_dot_product_efficient_attention_...": they are matched as inductor's
# before the attention names, which would otherwise count them as attention. Ours are the triton
# backend's (_fwd_kernel, _bwd_dkdv_kernel, _bwd_dq_kernel, _dropout_bits_kernel) and fused_ops'
# softmax_dropout; liger-kernel's carry their op's name (and element_mul_kernel, its cross-entropy's
# gradient scaling).
KERNEL_KINDS = (
    ("inductor fused (pointwise, reductions)", ("triton_poi_", "triton_red_", "triton_per_")),
    ("attention", ("flash", "fmha", "attention", "attn", "_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel",
                   "_dropout_bits_kernel", "softmax_dropout", "cudnn_generated_fort_native_sdpa")),
    ("matrix products", ("gemm", "xmma", "cutlass", "cublas", "wgmma", "triton_tem_fused_mm",
                         "triton_tem_fused_addmm", "triton_tem_fused_bmm", "matmul", "splitk", "nvjet")),
    ("loss (cross-entropy)", ("cross_entropy", "log_softmax", "logsoftmax", "nll_loss", "liger",
                              "element_mul_kernel")),
    ("optimizer", ("multi_tensor_apply", "foreach", "adam", "fused_sgd")),
    ("communication", ("nccl",)),
    ("inductor templates and other Triton kernels", ("triton_",)),
    ("copies and fills", ("memcpy", "memset", "copy", "cat_", "catarray", "fill")),
    ("eager pointwise and reductions", ("elementwise", "reduce", "vectorized", "unrolled", "norm", "softmax")),
)


def kernel_kind(name: str) -> str:
    """The `KERNEL_KINDS` kind of a GPU kernel's name, or "other"."""
    low = name.lower()
    return next((kind for kind, parts in KERNEL_KINDS if any(p in low for p in parts)), "other")


def kernel_kinds(kernels, top_other: int = 5, top: int = 3) -> dict:
    """Per kind of GPU kernel (`kernel_kind`), its share of the GPU's busy time in one step, from
    (name, start us, duration us) per kernel run; ``busy_of_span`` is that busy time over the span from
    the first kernel's start to the last one's end (under the profiler's own host overhead, so a
    lower bound of a host-bound step's busy share), ``other`` names the largest unmatched kernels,
    and ``largest`` gives each kind's ``top`` kernels by their time summed over runs: [name, ms,
    runs] (which of inductor's fused kernels, say, the share is)."""
    busy, by_kind, by_name = 0.0, {}, {}
    first, last = None, None
    for name, start, duration in kernels:
        busy += duration
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + duration
        total, runs = by_name.get(name, (0.0, 0))
        by_name[name] = (total + duration, runs + 1)
        first = start if first is None else min(first, start)
        last = start + duration if last is None else max(last, start + duration)
    if not busy:
        return {}
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    largest = {}
    for name, (total, runs) in ranked:
        rows = largest.setdefault(kernel_kind(name), [])
        if len(rows) < top:
            rows.append([name[:120], total / 1e3, runs])
    shares = {k: v / busy for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
    return {"shares": shares, "busy_ms": busy / 1e3, "span_ms": (last - first) / 1e3,
            "busy_of_span": busy / (last - first), "kernels": len(kernels),
            "other": [n[:120] for n, _ in ranked if kernel_kind(n) == "other"][:top_other],
            "largest": {kind: largest[kind] for kind in shares}}


def data_make_seconds(sample, repeats: int = 3) -> float:
    """One core making this batch's samples with the real T5 span corruption, then collating."""
    from ast_t5.data.span_corruption_dataset import collate_seq2seq
    from ast_t5.data.t5_span_masking import t5_span_corruption
    from ast_t5.data.sentinels import SentinelSpec

    src = sample["net_input"]["src_tokens"]
    vocab = int(src.max()) + NUM_SENTINELS + 1
    spec = SentinelSpec(vocab, NUM_SENTINELS, 2)
    rows = [r[r.ne(PAD)].numpy() for r in src]
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        samples = []
        for i, row in enumerate(rows):
            rng = np.random.default_rng([k, i])
            s, t = t5_span_corruption(row, 0.15, 3.0, rng, sentinels=spec)
            samples.append({"id": i, "source": torch.as_tensor(s), "target": torch.as_tensor(t)})
        collate_seq2seq(samples, PAD, 2)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_sites(trainer, sample):
    """Call sites of every host synchronization in one CUDA train_step (sync debug mode 'warn')."""
    sites = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train_step([sample])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" not in str(w.message).lower():
            continue
        where = f"{os.path.relpath(w.filename, REPO) if w.filename.startswith(REPO) else w.filename}:{w.lineno}"
        sites[where] = sites.get(where, 0) + 1
    return sites


def report(args, device, shape, ours, hf, flops, tokens, variants=()):
    """The run's figures (returned as the JSON payload) and their log lines, the profile aside
    (`report_profile`); ``variants``: the ``--versus`` runs, each a dict with its "overrides" and
    "flops_per_update" beside the figures of ``ours``."""
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = peak_tflops(name, args.peak_tflops) if device.type == "cuda" else float("nan")
    config, vocab, batch, src_len, tgt_len = shape
    out = {"device": name, "torch": torch.__version__, "config": config, "vocab": vocab, "batch": batch,
           "src_len": src_len, "tgt_len": tgt_len, "bf16": args.bf16, "compile": args.compile,
           "backend": args.backend, "flops_per_update": flops, "tokens_per_update": tokens, "peak_tflops": peak}
    logger.info("%s, torch %s: config %s, batch %d x source %d / target %d, vocab %d, bf16 %s, compile %s; "
                "%.3g FLOP/update (6 x params x padded tokens per stack + attention, fwd+bwd)", name,
                torch.__version__, config, batch, src_len, tgt_len, vocab, args.bf16, args.compile, flops)
    rows = [("ours (fairseq Trainer.train_step)", "ours", ours)]
    if hf is not None:
        rows.append(("HF T5 (nanoT5 recipe)", "hf", hf))
    rows += [(f"ours + {v['overrides']}", None, v) for v in variants]
    for label, key, r in rows:
        r["tokens_per_s"] = tokens / r["seconds_per_update"]
        r["mfu"] = r.get("flops_per_update", flops) / r["seconds_per_update"] / (peak * 1e12)
        if key is not None:
            out[key] = r
        mem = f", peak memory {r['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in r else ""
        logger.info("%-34s %8.1f ms/update  %10.0f tokens/s  MFU %5.1f%%%s  (warm-up %.1f s)", label,
                    1e3 * r["seconds_per_update"], r["tokens_per_s"], 100 * r["mfu"], mem, r["warmup_seconds"])
    if hf is not None:
        out["ratio_tokens_per_s"] = ours["tokens_per_s"] / hf["tokens_per_s"]
        logger.info("ours / HF tokens/s: %.2fx (target >= 1.5x on an H100)", out["ratio_tokens_per_s"])
        if "peak_memory_gib" in ours:
            out["ratio_peak_memory"] = ours["peak_memory_gib"] / hf["peak_memory_gib"]
            logger.info("ours / HF peak memory: %.2fx (target <= 1.0x)", out["ratio_peak_memory"])
    logger.info("ours: compile %.1f s%s, cross-entropy %s, parameters in %s, oom recoveries %d",
                ours["compile_seconds"], cache_note(ours), ours["ce_path"], ours["param_dtype"], ours["oom_recoveries"])
    if variants:
        out["variants"] = list(variants)
    for v in variants:  # each timed in the same blocks as ours: the ratio is side by side in one run
        v["speedup_vs_ours"] = ours["seconds_per_update"] / v["seconds_per_update"]
        logger.info("ours + %s / ours: %.3fx tokens/s (%.1f against %.1f ms/update); compile %.1f s%s, "
                    "oom recoveries %d", v["overrides"], v["speedup_vs_ours"], 1e3 * v["seconds_per_update"],
                    1e3 * ours["seconds_per_update"], v["compile_seconds"], cache_note(v), v["oom_recoveries"])
    return out


def cache_note(r) -> str:
    """' (N of M graphs from inductor's cache)' when the compilation looked graphs up there, else ''."""
    hits, misses = r.get("compile_cache_hits", 0), r.get("compile_cache_misses", 0)
    return f" ({hits} of {hits + misses} graphs from inductor's cache)" if hits + misses else ""


def report_profile(args, out, profile):
    """Add ``profile`` (`profile_update`) to the payload ``out`` and log its time budget."""
    out["profile"] = profile
    s, f = profile["seconds"], profile["floors"]
    logger.info("time budget of one update (median of %d; floors at %.3g FLOP/s matmul, %.3g B/s copy):",
                args.repeats, profile["matmul_flops_per_s"], profile["copy_bytes_per_s"])
    for key, label in (("forward", "forward (criterion call)"), ("backward", "backward"),
                       ("optimizer", "optimizer (clip + step)"), ("data_copy", "data: copy to device"),
                       ("data_make", "data: mask + collate, 1 core"),
                       ("trainer_rest", "rest of train_step (syncs, logs)"),
                       ("train_step", "whole Trainer.train_step")):
        logger.info("  %-34s %9.2f ms   floor %8.2f ms", label, 1e3 * s[key], 1e3 * f[key])
    if profile["host_syncs"] is not None:
        logger.info("host synchronizations in one update: %s", profile["host_syncs"] or "none")
    if profile.get("gpu_op_shares"):
        logger.info("GPU time by op in one update: %s", ", ".join(
            f"{k} {100 * v:.1f}%" for k, v in profile["gpu_op_shares"].items()))
    kinds = profile.get("gpu_kernel_kinds")
    if kinds:
        logger.info("GPU time by kind of kernel in one update (%d kernels, %.1f ms busy in a %.1f ms span: %.0f%%): %s",
                    kinds["kernels"], kinds["busy_ms"], kinds["span_ms"], 100 * kinds["busy_of_span"],
                    ", ".join(f"{k} {100 * v:.1f}%" for k, v in kinds["shares"].items()))
        for kind, rows in (kinds.get("largest") or {}).items():
            if kind != "other":
                logger.info("  largest %s: %s", kind,
                            "; ".join(f"{name} {ms:.2f} ms x{runs}" for name, ms, runs in rows))
        if kinds["other"]:
            logger.info("largest kernels of no known kind: %s", "; ".join(kinds["other"]))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--config", default=None, help="config/pretrain/<name>.yaml (default: base on cuda, tiny on cpu)")
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--src-len", type=int, default=0)
    p.add_argument("--tgt-len", type=int, default=0)
    p.add_argument("--updates", type=int, default=0, help="timed updates per repeat (default: 10 cuda, 2 cpu)")
    p.add_argument("--repeats", type=int, default=0, help="timed blocks (default: 3 cuda, 2 cpu)")
    p.add_argument("--warmup", type=int, default=0, help="untimed updates first, compilation included "
                   "(default: 5 cuda, 1 cpu)")
    p.add_argument("--backend", default="auto", help="model.attention_backend")
    p.add_argument("--fused-ce", default="auto", choices=("auto", "eager", "liger"),
                   help="criterion.fused_cross_entropy")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="model.compile=true (default on cuda)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--compile-backend", default="", help="model.compile_backend (default inductor)")
    p.add_argument("--bf16", dest="bf16", action="store_true", default=None,
                   help="common.bf16 for ours, bf16 autocast for HF (default on cuda)")
    p.add_argument("--no-bf16", dest="bf16", action="store_false")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip the Hugging Face run")
    p.add_argument("--hf-compile", dest="hf_compile", action="store_true", default=None,
                   help="torch.compile the HF model (default on cuda)")
    p.add_argument("--hf-lr", type=float, default=2e-4)
    p.add_argument("--clip-norm", type=float, default=1.0, help="HF's clipping (ours: the config's)")
    p.add_argument("--profile", action="store_true", help="time budget of one update of ours")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="override the GPU's peak bf16 TFLOP/s")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads with --device cpu (0: torch's default; 1 keeps timings stable on a "
                        "shared machine)")
    p.add_argument("--json", default="", help="write every figure to this JSON file")
    p.add_argument("--override", action="append", default=[], help="extra Hydra override for ours (repeatable)")
    p.add_argument("--versus", action="append", default=[], metavar="OVERRIDES",
                   help="a variant of ours timed beside it, in the same interleaved blocks: Hydra overrides "
                        "separated by spaces, after ours' (e.g. '++model.attention_backend=triton' or "
                        "'+optimizer.compiled=true'); repeatable, one trainer each; reports each one's "
                        "tokens/s over ours'")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    config, vocab, batch, src_len, tgt_len = SHAPES[args.device]
    args.config = args.config or config
    args.vocab, args.batch = args.vocab or vocab, args.batch or batch
    args.src_len, args.tgt_len = args.src_len or src_len, args.tgt_len or tgt_len
    args.updates = args.updates or (10 if cuda else 2)
    args.repeats = args.repeats or (3 if cuda else 2)
    args.warmup = args.warmup or (5 if cuda else 1)
    args.compile = cuda if args.compile is None else args.compile
    args.bf16 = cuda if args.bf16 is None else args.bf16
    args.hf_compile = cuda if args.hf_compile is None else args.hf_compile
    for name in ("vocab", "batch", "src_len", "tgt_len", "updates", "repeats", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    args.versus = [" ".join(v.split()) for v in args.versus]
    if any(not v for v in args.versus) or len(set(args.versus)) != len(args.versus):
        p.error("each --versus names one variant: Hydra overrides, not empty, not repeated")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    for noisy in ("fairseq", "ast_t5", "fused_ops", "transformers", "hydra"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("ast_t5.models.ast_t5_model").setLevel(logging.INFO)  # compile times
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        logger.error("--device cuda: no CUDA device available")
        return 1
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    shape = (args.config, args.vocab, args.batch, args.src_len, args.tgt_len)
    batches = make_batches(4, args.batch, args.src_len, args.tgt_len, args.vocab)
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        trainer, initial, ours_update, ours_info = setup_ours(args, device, write_task_dir(tmp, args.vocab))
    if args.hf:  # Hugging Face T5 has one dropout rate: refuse to compare two different models
        from ast_t5.models.hf_conversion import hf_dropout_rate
        try:
            hf_dropout_rate(trainer.model.cfg)
        except ValueError as e:
            logger.error("bench_train: %s (or pass --no-hf)", e)
            return 2
    ours = {}
    ours["warmup_seconds"], ours["peak_memory_gib"] = _warm_up(ours_update, batches, args.warmup, device)
    flops = flops_per_update(trainer.model, batches[0])
    tokens = statistics.mean(batch_tokens(b) for b in batches)
    partial = None
    if args.json and (args.hf or args.versus):  # ours alone first: the other compiles may not fit a time limit
        alone, alone_blocks = interleaved_blocks({"ours": ours_update}, batches, args.updates, 1, device)
        early = dict(ours, seconds_per_update=alone["ours"], blocks=alone_blocks["ours"], **ours_info())
        if early["peak_memory_gib"] is None:
            del early["peak_memory_gib"]
        partial = report(args, device, shape, early, None, flops, tokens)
        partial["partial"] = "ours alone (one block after its warm-up), before " + " and ".join(
            (["the variants' runs"] if args.versus else []) + (["Hugging Face's run"] if args.hf else []))
        write_json(args.json, partial)
    updates = {"ours": ours_update}
    variants, failed = [], []
    for overrides in args.versus:  # each a trainer of its own, warmed up (compiled) before any timing
        resident = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        v_trainer = v_update = v_info = None
        try:
            with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
                v_trainer, _, v_update, v_info = setup_ours(args, device, write_task_dir(tmp, args.vocab),
                                                            overrides.split())
            v = {"overrides": overrides, "flops_per_update": flops_per_update(v_trainer.model, batches[0])}
            v["warmup_seconds"], v["peak_memory_gib"] = _warm_up(v_update, batches, args.warmup, device, resident)
        except Exception as e:  # one variant that cannot build, compile or fit leaves the others' figures
            v_trainer = v_update = v_info = None
            failed.append(_variant_failure(overrides, e, device))
            if partial is not None:
                partial["failed_variants"] = failed
                write_json(args.json, partial)
            continue
        v["info"] = v_info
        variants.append(v)
        updates[f"ours + {overrides}"] = v_update
        if partial is not None:  # one block beside ours now, kept if a time limit cuts the run after it
            quick, _ = interleaved_blocks({"ours": ours_update, "variant": v_update}, batches, args.updates, 1,
                                          device)
            partial.setdefault("variants", []).append(dict(
                overrides=overrides, seconds_per_update=quick["variant"], tokens_per_s=tokens / quick["variant"],
                mfu=v["flops_per_update"] / quick["variant"] / (partial["peak_tflops"] * 1e12),
                speedup_vs_ours=quick["ours"] / quick["variant"], warmup_seconds=v["warmup_seconds"],
                partial="one block beside ours right after its warm-up"))
            write_json(args.json, partial)
    hf = None
    if args.hf:
        resident = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        hf_update, hf_info = setup_hf(args, device, initial, trainer.model.cfg, args.vocab)
        hf = {}
        hf["warmup_seconds"], hf["peak_memory_gib"] = _warm_up(hf_update, batches, args.warmup, device, resident)
        updates["hf"] = hf_update
    median, blocks = interleaved_blocks(updates, batches, args.updates, args.repeats, device)
    ours.update(seconds_per_update=median["ours"], blocks=blocks["ours"], **ours_info())
    if hf is not None:
        hf.update(seconds_per_update=median["hf"], blocks=blocks["hf"], **hf_info())
    for v in variants:
        name = f"ours + {v['overrides']}"
        v.update(seconds_per_update=median[name], blocks=blocks[name], **v.pop("info")())
    for r in (ours, hf, *variants):
        if r is not None and r["peak_memory_gib"] is None:
            del r["peak_memory_gib"]
    out = report(args, device, shape, ours, hf, flops, tokens, variants)
    if failed:
        out["failed_variants"] = failed
    cudnn = sys.modules.get("ast_t5.modules.cudnn_attention")
    if cudnn is not None and cudnn.GRAPHS:  # the cudnn backend ran (ours or a variant): what its graphs cost once
        out["cudnn_graphs"] = {"built": len(cudnn.GRAPHS), "build_seconds": cudnn.BUILD_SECONDS[0]}
        logger.info("cuDNN attention graphs: %d built in %.1f s in all (each (batch, length) shape builds its own)",
                    len(cudnn.GRAPHS), cudnn.BUILD_SECONDS[0])
    if args.json:  # now, and again with the profile: a time limit during the profile keeps the comparison
        write_json(args.json, out)
    if args.profile:
        report_profile(args, out, profile_update(args, trainer, batches, device))
        if args.json:
            write_json(args.json, out)
    return 0


def _variant_failure(overrides: str, error: BaseException, device) -> dict:
    """Log a ``--versus`` variant that raised while it was built or warmed up, free what it held, and
    return its record for the JSON (``"failed_variants"``): its overrides and the error's first line."""
    first = (str(error).strip().splitlines() or [""])[0][:500]
    reason = f"{type(error).__name__}: {first}" if first else type(error).__name__
    logger.error("ours + %s: failed before its timing (%s); the other variants still run", overrides, reason)
    logger.debug("ours + %s: traceback", overrides, exc_info=error)
    error.__traceback__ = None  # the frames hold the variant's trainer and its CUDA memory
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"overrides": overrides, "failed": reason}


def write_json(path: str, payload: dict) -> None:
    """``payload`` to ``path`` atomically (a temporary file, then a rename)."""
    tmp_path = path + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp_path, path)


if __name__ == "__main__":
    sys.exit(main())
