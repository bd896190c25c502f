"""Training-step throughput of our T5 v1.1 model vs Hugging Face T5ForConditionalGeneration.

    python benchmarks/bench_model.py                 # CPU fp32 comparison (about 1-2 minutes)
    python benchmarks/bench_model.py --device cuda   # + T5-base bf16 step: auto vs each single attention
                                     # backend at dropout 0 and 0.1, HF, MFU, memory; fused softmax
    python benchmarks/bench_model.py --device cuda --skip-cpu --norm-ffn   # only eager vs liger
                                     # RMSNorm / gated GELU (model.fused_norm_ffn); + --norm-ffn-compile
    python benchmarks/bench_model.py --device cuda --skip-cpu --gpu-compile --gpu-compile-scope layers \
        --gpu-backends triton --gpu-dropouts 0 --gpu-no-hf   # the step compiled, as the recipes train:
                                     # auto against the triton backend (gpu_check's bench_model_compiled)

Both models have identical shapes and weights (ours converted with hf_conversion), the same
batch, loss (token cross-entropy, pad ignored), optimizer (torch AdamW) and dropout. Measurements
are interleaved: each repeat times a few steps of each model, alternating which goes first, and
the median step time per model is reported. Target (DESIGN.md section 8): ours >= 1.0x HF.
"""
import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ast_t5.models.flops import peak_tflops_for, training_flops

logger = logging.getLogger("bench_model")

PAD, EOS, FIRST_REGULAR = 1, 2, 4  # fairseq Dictionary specials


@dataclass
class Shape:
    vocab: int
    batch: int
    src_len: int
    tgt_len: int


def make_dictionary(vocab_size: int):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab_size - len(d)):
        d.add_symbol(f"tok{i}")
    return d


def make_batch(shape: Shape, device, seed: int = 0):
    """Random tokens; every row right-padded by a different amount so masks are exercised."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_REGULAR, shape.vocab, (shape.batch, shape.src_len), generator=g)
    tgt = torch.randint(FIRST_REGULAR, shape.vocab, (shape.batch, shape.tgt_len), generator=g)
    for i in range(shape.batch):
        src[i, shape.src_len - (i * shape.src_len) // (4 * shape.batch):] = PAD
    tgt[:, -1] = EOS
    prev = torch.cat([torch.full((shape.batch, 1), EOS), tgt[:, :-1]], dim=1)
    return src.to(device), prev.to(device), tgt.to(device)


def build_pair(arch: str, shape: Shape, device, dtype, backend: str, dropout: float, hf: bool = True, **sizes):
    """Our model and an HF model holding the same weights (None without ``hf``)."""
    from transformers import T5ForConditionalGeneration

    from ast_t5.models import AstT5Model
    from ast_t5.models.hf_conversion import hf_t5_config, ours_to_hf_state_dict

    ours = AstT5Model.from_dictionary(make_dictionary(shape.vocab), arch=arch, attention_backend=backend,
                                      dropout=dropout, attention_dropout=dropout,
                                      activation_dropout=dropout, **sizes)
    if not hf:
        return ours.to(device, dtype).train(), None
    hf = T5ForConditionalGeneration(hf_t5_config(ours.cfg, shape.vocab))
    hf.load_state_dict(ours_to_hf_state_dict(ours.state_dict()))
    return ours.to(device, dtype).train(), hf.to(device, dtype).train()


def ours_logits(model, src, prev):
    return model(src, None, prev)[0]


def hf_logits(model, src, prev):
    return model(input_ids=src, attention_mask=src.ne(PAD), decoder_input_ids=prev).logits


def make_step(model, logits_fn, batch, autocast_dtype=None):
    src, prev, tgt = batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(src.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = logits_fn(model, src, prev)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1), ignore_index=PAD)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, steps: int, device) -> float:
    """Seconds per step over ``steps`` steps."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - start) / steps


def interleaved(steps_by_name, steps: int, repeats: int, warmup: int, device):
    """Median seconds/step per name, alternating the order of the models in each repeat."""
    if warmup > 0:  # --warmup 0: none (time_steps would divide by zero steps)
        for step in steps_by_name.values():
            time_steps(step, warmup, device)
    times = {name: [] for name in steps_by_name}
    names = list(steps_by_name)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(time_steps(steps_by_name[name], steps, device))
    return {name: statistics.median(t) for name, t in times.items()}, times


def step_peak_gib(step) -> float:
    """GiB that one run of ``step`` allocates at its peak above what is resident before it (CUDA)."""
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - resident) / 2**30


def tokens_per_step(batch) -> int:
    src, _, tgt = batch
    return int(src.ne(PAD).sum() + tgt.ne(PAD).sum())


def cpu_comparison(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = Shape(args.vocab, args.batch, args.src_len, args.tgt_len)
    device = torch.device("cpu")
    sizes = dict(embed_dim=args.d_model, ffn_dim=args.d_ff, num_heads=args.heads, head_dim=args.d_model // args.heads,
                 encoder_layers=args.layers, decoder_layers=args.layers)
    ours, hf = build_pair("t5_v11_tiny", shape, device, torch.float32, args.backend, 0.1, **sizes)
    batch = make_batch(shape, device)
    steps = {"ours": make_step(ours, ours_logits, batch), "hf": make_step(hf, hf_logits, batch)}
    median, raw = interleaved(steps, args.steps, args.repeats, args.warmup, device)
    tokens = tokens_per_step(batch)
    logger.info("CPU fp32, %d threads, torch %s, transformers %s; T5 v1.1 shape: d_model %d, d_ff %d, %d heads, "
                "%d+%d layers, vocab %d, batch %d x src %d / tgt %d (%d non-pad tokens/step); %d repeats x %d steps",
                torch.get_num_threads(), torch.__version__, _transformers_version(), args.d_model, args.d_ff,
                args.heads, args.layers, args.layers, args.vocab, args.batch, args.src_len, args.tgt_len, tokens,
                args.repeats, args.steps)
    for name in ("ours", "hf"):
        logger.info("%-4s: median %.3f s/step = %.0f tokens/s; best repeat %.3f s/step = %.0f tokens/s "
                    "(repeats: %s)", name, median[name], tokens / median[name], min(raw[name]),
                    tokens / min(raw[name]), ", ".join(f"{t:.3f}" for t in raw[name]))
    logger.info("ratio ours/hf tokens/s: %.2fx on medians, %.2fx on best repeats (target >= 1.0x)",
                median["hf"] / median["ours"], min(raw["hf"]) / min(raw["ours"]))


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def model_flops_per_step(model, batch) -> float:
    """Training FLOPs of one step on ``batch`` (`ast_t5.models.flops.training_flops`: padded shapes)."""
    src, prev, _ = batch
    return training_flops(model, src.size(0), src.size(1), prev.size(1))


def peak_tflops(name: str, override: float) -> float:
    """``override``, else the GPU's dense bf16 peak by name (`ast_t5.models.flops`), else NaN."""
    return override or peak_tflops_for(name) or float("nan")


# what a user can pin; auto is compared with them. The triton backend's other structures, not auto's yet:
# triton_rpe_attention's settings (BACKWARD, FAR_LOOPS, DROPOUT_MASK) during their own models' steps
# (`with_structure`); those of DROPOUT_ONLY differ from the triton model only with dropout (left out without).
# triton-one-loop: one loop per kernel (FAR_LOOPS "none"); triton-far: the far loops of the backward at every
# length where each program has far tiles (past 2 (M + tile), 384 on sm90), where the triton model takes them
# past 4 (M + tile) only (`triton_rpe_attention.far_loops_pay`, since 2026-11-27: at 512 one loop made this
# step faster on an H200), so that the default step (512) measures both sides of that rule. At 512 the triton
# model runs one loop: triton-one-loop, the same kernels, is left out of the default rows.
TRITON_STRUCTURES = {"triton-fused": {"BACKWARD": "fused", "FAR_LOOPS": "none"},
                     "triton-one-loop": {"FAR_LOOPS": "none"},
                     "triton-far": {"FAR_LOOPS": "backward", "FAR_LOOPS_MIN_LENGTH": 2},
                     "triton-bits": {"DROPOUT_MASK": "bits"}}
DROPOUT_ONLY = ("triton-bits",)
SINGLE_BACKENDS = ("sdpa", "flash", "flex", "triton", *TRITON_STRUCTURES, "cudnn")  # cudnn: without the frontend, sdpa
DEFAULT_GPU_BACKENDS = tuple(b for b in SINGLE_BACKENDS if b != "triton-one-loop")


def with_structure(step, **settings):
    """``step`` with these settings of triton_rpe_attention (BACKWARD="fused", FAR_LOOPS="none",
    DROPOUT_MASK="bits"...) while it runs."""
    from ast_t5.modules import triton_rpe_attention as tra

    def run():
        saved = {name: getattr(tra, name) for name in settings}
        for name, value in settings.items():
            setattr(tra, name, value)
        try:
            return step()
        finally:
            for name, value in saved.items():
                setattr(tra, name, value)
    return run


def _kernels_of(step) -> tuple:
    """The attention kernels one run of ``step`` dispatched (eager), as sorted (name, calls)."""
    from ast_t5.modules import attention_backends as ab

    ab.DISPATCH_COUNTS.clear()
    step()
    return tuple(sorted(ab.DISPATCH_COUNTS.items()))


def compare_backends(args, device, arch: str, shape: Shape, dropouts, backends, autocast_dtype=None,
                     hf: bool = True, on_dropout=None, compile_backend=None, compile_scope: str = "model",
                     **sizes) -> dict:
    """The T5 training step with ``auto`` against every single backend, one dropout at a time.

    Per dropout: our model with ``auto`` and with each backend of ``backends`` (same weights, same
    batch, torch AdamW), and Hugging Face T5 with the same dropout rate. One first step (untimed:
    it also compiles flex and triton kernels) records the attention kernels each model really
    dispatched, and each row names the first model that ran the same ones (``flex`` runs ``auto``'s
    at dropout 0 today; ``flex`` with dropout falls back to ``sdpa``): such models are still timed,
    so extra work around the same kernels shows. Then interleaved repeats; ``auto_vs_best`` is
    auto's median over the fastest single backend's, minus 1 (the target: <= 3%). Returns the
    figures per dropout (also logged), and hands them so far to ``on_dropout`` after each one.
    With ``compile_backend`` every model runs compiled, as the GPU recipes train: ours with
    ``model.compile`` (bucketed lengths) on that torch.compile backend, Hugging Face's through
    torch.compile; the kernels are then those of our first, eager forward. ``compile_scope`` is
    our models' ``model.compile_scope`` (``layers``: one graph per layer class, about a third of the
    compile time of the whole forward; the same for every backend compared).
    """
    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import MIN_RECOMPILE_LIMIT, ensure_recompile_limit
    from ast_t5.modules.triton_rpe_attention import KERNEL_ERRORS, fused_backward_unfit

    if "triton-fused" in backends:  # where the fused backward falls back, its model would time the split one
        why = fused_backward_unfit(device, sizes.get("head_dim", 64))
        if why:
            logger.warning("triton-fused left out: %s", why)
            backends = [b for b in backends if b != "triton-fused"]
    batch = make_batch(shape, device)
    flops = None
    results = {}
    figures = {"arch": arch, "batch": shape.batch, "src_len": shape.src_len, "tgt_len": shape.tgt_len,
               "compiled": compile_backend or False, "by_dropout": results}
    if compile_backend:
        figures["compile_scope"] = compile_scope
    peak = peak_tflops(torch.cuda.get_device_name(), args.peak_tflops) if device.type == "cuda" else float("nan")
    for p in dropouts:
        if compile_backend:  # each dropout's models compile afresh: the last one's graphs are gone with them
            torch._dynamo.reset()
        with device:  # parameters made and initialized on the device: seconds less per T5-base model
            base, hf_model = build_pair(arch, shape, device, torch.float32, "auto", p, hf=hf, **sizes)
            models = {}
            for b in ("auto", *backends):
                if b in DROPOUT_ONLY and p == 0:
                    continue
                cfg = dataclasses.replace(base.cfg, attention_backend="triton" if b in TRITON_STRUCTURES else b)
                if compile_backend:
                    cfg = dataclasses.replace(cfg, compile=True, compile_backend=compile_backend,
                                              compile_scope=compile_scope)
                m = AstT5Model.build(cfg, base.encoder.dictionary)
                m.load_state_dict(base.state_dict())
                models[f"ours[{b}]"] = m.to(device).train()
            if compile_backend and hf:
                hf_model = torch.compile(hf_model, backend=compile_backend)
            if compile_backend:
                # every model of this dropout compiles the same functions (compile_scope layers: the
                # module-level layer call, 2 graphs per model), whose graphs count against one recompile
                # limit: past it, later models would run eagerly under a compiled row's name
                ensure_recompile_limit(max(MIN_RECOMPILE_LIMIT, 4 * len(models) + 4))
        if flops is None:
            flops = model_flops_per_step(base, batch)
        del base
        if hf:
            models["hf"] = hf_model
        steps = {name: make_step(m, hf_logits if name == "hf" else ours_logits, batch, autocast_dtype)
                 for name, m in models.items()}
        for b, structure in TRITON_STRUCTURES.items():
            if f"ours[{b}]" in steps:
                steps[f"ours[{b}]"] = with_structure(steps[f"ours[{b}]"], **structure)
        kernels, same_as, failed = {}, {}, {}
        for name in list(steps):  # the first step also compiles flex/triton kernels: not timed
            try:
                if name == "hf":
                    steps[name]()
                    continue
                kernels[name] = _kernels_of(steps[name])
            except KERNEL_ERRORS as e:  # OOM, a kernel's refusal: recorded, the others still compared
                failed[name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            if name in failed:  # outside the handler, whose traceback holds the step's tensors
                logger.warning("dropout %g %s: its first step failed, left out: %s", p, name, failed[name])
                del steps[name], models[name]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            same_as[name] = next((other for other in kernels if other != name and kernels[other] == kernels[name]
                                  and same_as.get(other) is None), None)
        if compile_backend and on_dropout is not None:  # what the first steps (the compiles) gave, before timing
            results[f"dropout {p:g}"] = {
                "rows": {**{name: {"kernels": dict(kernels.get(name, ())),
                                   **({} if name == "hf" else {"compile_s": models[name].compile_seconds})}
                            for name in steps},
                         **{name: {"error": why} for name, why in failed.items()}},
                "partial": "compiled in the first steps, not timed yet"}
            on_dropout(figures)
        median, raw = interleaved(steps, args.gpu_steps, args.gpu_repeats, args.warmup, device)
        singles = {n: median[n] for n in median if n.startswith("ours[") and n != "ours[auto]"}
        best = min(singles, key=singles.get) if singles else None
        rows = {}
        for name in median:
            row = {"ms": median[name] * 1e3, "repeats_ms": [t * 1e3 for t in raw[name]],
                   "tokens_per_s": tokens_per_step(batch) / median[name],
                   "mfu_percent": 100 * flops / median[name] / (peak * 1e12) if peak == peak else None,
                   "kernels": dict(kernels.get(name, ())), "same_kernels_as": same_as.get(name)}
            if device.type == "cuda":
                row["step_peak_gib"] = step_peak_gib(steps[name])
            if compile_backend and name != "hf":  # the first step's compile, as model.compile logs it
                row["compile_s"] = models[name].compile_seconds
                if not row["compile_s"]:  # no graph of its own: another model's graphs fitted it (the same
                    # code: the triton structures where the kernels fall back), or it ran eagerly
                    row["compile_note"] = "no compile of its own in its first step"
                    logger.warning("dropout %g %s: compiled no graph of its own in its first step (it ran "
                                   "another model's graphs, or eagerly)", p, name)
            rows[name] = row
            logger.info("dropout %g %-13s %.1f ms/step, %.0f tokens/s, MFU %s%s%s; kernels: %s%s", p, name,
                        row["ms"], row["tokens_per_s"],
                        "-" if row["mfu_percent"] is None else f"{row['mfu_percent']:.1f}%",
                        f", step peak {row['step_peak_gib']:.2f} GiB" if "step_peak_gib" in row else "",
                        f", compiled in {row['compile_s']:.1f} s" if "compile_s" in row else "",
                        ", ".join(f"{k} x{v}" for k, v in kernels.get(name, ())) or "-",
                        f" (the same as {same_as[name]})" if same_as.get(name) else "")
        rows.update({name: {"error": why} for name, why in failed.items()})
        out = {"rows": rows, "best_single": best}
        if best is not None and "ours[auto]" in median:
            out["auto_vs_best"] = median["ours[auto]"] / median[best] - 1
            logger.info("dropout %g: auto %.1f ms/step vs the best single backend %s %.1f ms/step: %+.1f%% "
                        "(target <= +3%%)", p, median["ours[auto]"] * 1e3, best, median[best] * 1e3,
                        100 * out["auto_vs_best"])
        if "hf" in median and "ours[auto]" in median:
            out["ours_auto_over_hf_speed"] = median["hf"] / median["ours[auto]"]
            logger.info("dropout %g: ours[auto] / hf tokens/s %.2fx", p, out["ours_auto_over_hf_speed"])
        results[f"dropout {p:g}"] = out
        figures.update(flops_per_step=flops, peak_tflops=peak)
        if on_dropout is not None:
            on_dropout(figures)
        del models, steps, hf_model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return figures


def write_json(path: str, obj) -> None:
    """``obj`` as JSON at ``path``, replaced atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def failed_models(figures: dict) -> list:
    """'dropout <p>: <model>' for every model `compare_backends` left out after its first step failed."""
    return [f"{dropout}: {name}" for dropout, result in figures["by_dropout"].items()
            for name, row in result["rows"].items() if "error" in row]


def gpu_t5_base(args) -> dict:
    """T5-base bf16 step (autocast over fp32 weights, torch AdamW), eager or compiled: auto vs each
    backend, and HF unless --gpu-no-hf."""
    device = torch.device("cuda")
    shape = Shape(32128, args.gpu_batch, args.gpu_src_len, args.gpu_tgt_len)
    logger.info("GPU %s, torch %s; T5-base (t5_v11_base) bf16 autocast + AdamW, %s, batch %d x src %d / tgt %d, "
                "%d repeats x %d steps per model", torch.cuda.get_device_name(), torch.__version__,
                f"compiled (inductor, compile_scope {args.gpu_compile_scope})" if args.gpu_compile else "eager",
                shape.batch, shape.src_len, shape.tgt_len, args.gpu_repeats, args.gpu_steps)
    save = (lambda figures: write_json(args.json, figures)) if args.json else None  # after each dropout:
    figures = compare_backends(args, device, "t5_v11_base", shape, args.gpu_dropouts,  # a cut run keeps them
                               args.gpu_backends, torch.bfloat16, hf=not args.gpu_no_hf, on_dropout=save,
                               compile_backend="inductor" if args.gpu_compile else None,
                               compile_scope=args.gpu_compile_scope)
    logger.info("%.1f TFLOP/step (ast_t5.models.flops: padded shapes, attention included)",
                figures["flops_per_step"] / 1e12)
    return figures


def gpu_softmax_dropout(args) -> None:
    """fused_ops.softmax_dropout vs the eager reference at (B, H, 1024, 1024) bf16 with bias, p = 0.1."""
    import fused_ops

    device = torch.device("cuda")
    ok, why = fused_ops.fused_backend_status(device)
    if not ok:
        logger.warning("fused softmax-dropout unavailable: %s", why)
        return
    shape = (args.sm_batch, args.sm_heads, 1024, 1024)
    scores = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(1, *shape[1:], device=device, requires_grad=True)
    grad = torch.randn_like(scores)
    seconds = {}
    for backend in ("fused", "torch"):
        def step(backend=backend):
            out = fused_ops.softmax_dropout(scores, 0.1, True, bias=bias, backend=backend)
            out.backward(grad)
        time_steps(step, args.warmup, device)
        seconds[backend] = time_steps(step, 20, device)
    exact = [fused_ops.softmax_dropout(scores, 0.0, False, bias=bias, backend=b).float() for b in ("fused", "torch")]
    logger.info("softmax+dropout fwd+bwd at [%d*%d, 1024, 1024] bf16 + fp32 bias, p=0.1: fused %.2f ms, eager %.2f ms, "
                "speed-up %.2fx (target >= 2x); max |fused - eager| at p=0: %.2e", shape[0], shape[1],
                seconds["fused"] * 1e3, seconds["torch"] * 1e3, seconds["torch"] / seconds["fused"],
                (exact[0] - exact[1]).abs().max().item())


def gpu_norm_ffn(args) -> None:
    """T5-base bf16 step with model.fused_norm_ffn eager vs liger (same weights, same batch), eager
    mode; with --norm-ffn-compile also both under model.compile (inductor fuses the eager ops)."""
    from ast_t5.models import AstT5Model
    from ast_t5.modules.liger_norm_ffn import liger_unavailable_reason

    device = torch.device("cuda")
    why = liger_unavailable_reason("t5_v11", device)
    if why:
        logger.warning("norm/ffn comparison skipped: %s", why)
        return
    shape = Shape(32128, args.gpu_batch, args.gpu_src_len, args.gpu_tgt_len)
    batch = make_batch(shape, device)
    base = AstT5Model.from_dictionary(make_dictionary(shape.vocab), arch="t5_v11_base", attention_backend="sdpa",
                                      fused_norm_ffn="eager")
    variants = [("eager", False), ("liger", False)]
    if args.norm_ffn_compile:
        variants += [("eager", True), ("liger", True)]
    models = {}
    for impl, compiled in variants:
        cfg = dataclasses.replace(base.cfg, fused_norm_ffn=impl, compile=compiled)
        model = AstT5Model.build(cfg, base.encoder.dictionary)
        model.load_state_dict(base.state_dict())
        models[f"{impl}{' compiled' if compiled else ''}"] = model.to(device).train()
    steps = {name: make_step(m, ours_logits, batch, torch.bfloat16) for name, m in models.items()}
    for step in steps.values():  # compile (when asked) outside the timed repeats
        step()
    median, raw = interleaved(steps, args.gpu_steps, args.repeats, args.warmup, device)
    logger.info("GPU %s, torch %s; T5-base sdpa bf16 autocast + AdamW, batch %d x src %d / tgt %d; "
                "model.fused_norm_ffn (RMSNorm + gated GELU), median of %d repeats x %d steps",
                torch.cuda.get_device_name(), torch.__version__, shape.batch, shape.src_len, shape.tgt_len,
                args.repeats, args.gpu_steps)
    for name, step in steps.items():
        extra = step_peak_gib(step)
        logger.info("norm/ffn %-15s %.1f ms/step, step peak memory above the resident models %.2f GiB "
                    "(repeats: %s)", name, median[name] * 1e3, extra, ", ".join(f"{t * 1e3:.1f}" for t in raw[name]))
    for suffix in ("", " compiled"):
        if "eager" + suffix in median and "liger" + suffix in median:
            logger.info("norm/ffn speed-up liger/eager%s: %.3fx (> 1: liger faster)", suffix,
                        median["eager" + suffix] / median["liger" + suffix])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda also runs the CPU part first")
    p.add_argument("--skip-cpu", action="store_true", help="with --device cuda: only the GPU measurements")
    p.add_argument("--backend", default="auto", help="our attention backend for the CPU comparison")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=256)
    p.add_argument("--tgt-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--gpu-batch", type=int, default=32)
    p.add_argument("--gpu-src-len", type=int, default=512)
    p.add_argument("--gpu-tgt-len", type=int, default=128)
    p.add_argument("--gpu-steps", type=int, default=5, help="timed steps per repeat (GPU)")
    p.add_argument("--gpu-repeats", type=int, default=5, help="interleaved repeats (GPU)")
    p.add_argument("--gpu-dropouts", type=float, nargs="+", default=[0.0, 0.1],
                   help="dropout rates of the T5-base comparison (0: the pre-training recipes; 0.1: "
                        "fine-tuning and the paper's architecture)")
    p.add_argument("--gpu-backends", nargs="+", default=list(DEFAULT_GPU_BACKENDS),
                   help=f"single backends compared with auto in the T5-base step (of {', '.join(SINGLE_BACKENDS)})")
    p.add_argument("--gpu-compile", action="store_true",
                   help="the T5-base comparison with every model compiled, as the GPU recipes train (adds "
                        "about a minute of compilation per model: a call of its own, without the fused "
                        "softmax-dropout comparison, which is eager)")
    p.add_argument("--gpu-compile-scope", choices=("model", "layers"), default="model",
                   help="with --gpu-compile: our models' model.compile_scope (layers: about a third of the "
                        "compile time; model: as the recipes train)")
    p.add_argument("--gpu-no-hf", action="store_true",
                   help="leave Hugging Face out of the T5-base comparison (with --gpu-compile: one "
                        "compilation less)")
    p.add_argument("--json", default=None, help="also write the T5-base figures to this JSON file (atomically)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="override the GPU's peak bf16 TFLOP/s")
    p.add_argument("--sm-batch", type=int, default=16)
    p.add_argument("--sm-heads", type=int, default=16)
    p.add_argument("--norm-ffn", action="store_true",
                   help="with --device cuda: only the eager vs liger RMSNorm / gated GELU comparison")
    p.add_argument("--norm-ffn-compile", action="store_true",
                   help="with --norm-ffn: also both under model.compile (adds a few minutes of compilation)")
    args = p.parse_args(argv)
    if args.device != "cuda" and (args.json or args.gpu_compile or args.gpu_no_hf):
        p.error("--json, --gpu-compile and --gpu-no-hf belong to the T5-base comparison: add --device cuda")
    if args.gpu_compile_scope != "model" and not args.gpu_compile:
        p.error("--gpu-compile-scope is the compiled comparison's: add --gpu-compile")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    for noisy in ("ast_t5", "fused_ops", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        logger.error("--device cuda: no CUDA device available")
        return 1
    torch.manual_seed(0)
    if args.norm_ffn:
        if args.device != "cuda":
            logger.error("--norm-ffn needs --device cuda (liger's kernels are CUDA only)")
            return 2
        gpu_norm_ffn(args)
        return 0
    if not (args.device == "cuda" and args.skip_cpu):
        cpu_comparison(args)
    if args.device == "cuda":
        failed = failed_models(gpu_t5_base(args))
        if not args.gpu_compile:  # an eager op: measured by the eager call
            gpu_softmax_dropout(args)
        if failed:  # the figures of the others are written; the step still reports the failure
            logger.error("bench_model: first step failed for %s (the error is in their rows)", ", ".join(failed))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
