"""What a `scripts/gpu_check.sh` run says, read from its figures.json: the issues' targets and the
decisions the figures are for, in one screen.

    python scripts/gpu_summary.py OUTDIR/figures.json

gpu_check.sh prints it at the end of every call, so the last lines of a call's output carry it.
Sections, each only when the call measured it:

- steps: exit status and seconds of each step (skipped and failed ones named);
- attention at T = S = 1024 (bench_attention), per condition: the triton backend (the split
  backward, its far tiles in loops of their own) against the fused backward, one loop per kernel,
  and the far loops in every kernel (``Nx``: the triton row's ms over theirs), the frozen-table row
  (what the table gradient costs), SDPA on a prebuilt bias (``x pre``) and the bias-free flash lower
  bound, against the attention issue's targets (<= 1.0 ms without dropout, ``x pre`` >= 2 at dropout
  0.1), and the triton kernels' own times; the triton and flash rows' host ms (the host's time to
  issue the call) and graph ms (its GPU time alone, replayed in a CUDA graph: ``--graph``) where
  measured, and per condition the triton row's ms and graph ms, without dropout against the 1.0 ms
  target (is a miss the kernels' or the host's), with dropout its graph ms against SDPA-prebuilt's (the 2x target
  on the GPU's time alone); and the triton-prebuilt row (timed as sdpa-prebuilt is: the stack's
  inputs built once, outside the timed calls) against both targets, like for like;
- kernels (profile_attention_kernels): what bounds each kernel, and its largest stalls;
- tiles (the tile sweep): per condition the fastest row, the fastest forward (``fwd_ms``) and the
  fastest backward (ms - fwd_ms), to combine into `default_blocks`, and the far-all row's forward and
  backward against the triton row's (which kernels' far loops pay);
- model step (bench_model eager, bench_model_compiled compiled): every model's ms per dropout and
  `auto` against the best single backend (target <= +3%);
- training (bench_recipe, bench_train): the recipe's MFU (target >= 40%) and OOM recoveries, and
  the trainer against Hugging Face (target >= 1.5x tokens/s at no more peak memory), with where the
  GPU time of one of our updates goes, per kind of kernel;
- compile scope (bench_compile): the whole forward compiled as one graph against one graph per
  layer class (``model.compile_scope``), compile time and step time;
- norm/ffn (bench_model --norm-ffn's log lines): liger's RMSNorm and gated GELU against eager;
- fused softmax-dropout (bench_model's log line): the fused_ops kernels against eager (target >= 2x)
  and their largest difference from eager at p = 0;
- tests: pytest's summary lines and failures.
"""
import json
import re
import sys
from typing import Dict, List, Optional


def _ms(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def steps_lines(figures: Dict) -> List[str]:
    steps = figures.get("steps", {})
    if not steps:
        return []
    parts = [f"{name} {s['exit']}" + (f" ({s['seconds']} s)" if isinstance(s.get("seconds"), int) else "")
             for name, s in steps.items()]
    return ["steps: " + ", ".join(parts)]


def _host_graph(row: Dict) -> str:
    """`` (host X, graph Y)`` of a bench_attention row, with what it has of the two ("" without either)."""
    parts = [f"{label} {row[key]:.3f}" for label, key in (("host", "host_ms"), ("graph", "graph_ms"))
             if row.get(key) is not None]
    return f" ({', '.join(parts)})" if parts else ""


def attention_lines(payload: Dict, length: int = 1024) -> List[str]:
    """Per (dropout, padded) condition at ``length``: the triton rows, against the issue's targets at
    1024 (its shape); there also, per condition, the triton row's ms and graph ms (its GPU time
    without the host's) against the 1.0 ms target."""
    rows = [r for r in payload.get("rows", []) if r.get("length") == length]
    if not rows:
        return []
    lines = [f"attention at T=S={length} ({payload.get('device_name', '?')}), ms fwd+bwd:"]
    conditions = sorted({(r["dropout"], r["padded"]) for r in rows})
    for dropout, padded in conditions:
        by = {r["backend"]: r for r in rows if r["dropout"] == dropout and r["padded"] == padded}

        def ms(name):
            return by.get(name, {}).get("ms")
        split, fused, frozen = ms("triton"), ms("triton-fused"), ms("triton-frozen")
        one_loop, far_all, bits = ms("triton-one-loop"), ms("triton-far-all"), ms("triton-bits")
        tiles = ms("triton-tiles")
        pre, flash = ms("sdpa-prebuilt"), ms("flash-nobias")
        cudnn = min((v for v in (ms("cudnn"), ms("cudnn-nondeterministic")) if v is not None), default=None)
        best = min((v for v in (split, fused, one_loop, far_all, bits, tiles, cudnn) if v is not None), default=None)

        def versus(value):
            return "" if None in (split, value) else f" ({split / value:.2f}x)"
        triton_row, flash_row = by.get("triton", {}), by.get("flash-nobias", {})
        line = (f"  dropout {dropout:g} padded {'yes' if padded else 'no '}: triton {_ms(split)}"
                f"{_host_graph(triton_row)}, fused {_ms(fused)}"
                f"{versus(fused)}, one-loop {_ms(one_loop)}{versus(one_loop)}, far-all {_ms(far_all)}"
                f"{versus(far_all)}, tiles {_ms(tiles)}{versus(tiles)}"
                + (f", bits {_ms(bits)}{versus(bits)}" if dropout > 0 else "")
                + f", frozen {_ms(frozen)}"
                f"{'' if None in (split, frozen) else f' (table gradient {100 * (split - frozen) / split:.0f}%)'}"
                f", sdpa-prebuilt {_ms(pre)}, flash bias-free {_ms(flash)}{_host_graph(flash_row)}")
        if best is not None and not padded and dropout == 0 and length == 1024:
            line += f"; target <= 1.0 ms: {'met' if best <= 1.0 else 'not met'} ({best:.3f})"
        if best is not None and pre is not None and dropout > 0 and length == 1024:
            line += f"; x pre {pre / best:.2f} (target >= 2: {'met' if pre / best >= 2 else 'not met'})"
        lines.append(line)
        lines += _cudnn_lines(by)
        if triton_row and length == 1024:  # the target's shape: a miss of the kernels, or of the host's time
            graph, why = triton_row.get("graph_ms"), triton_row.get("graph_note")

            def met(value):  # the 1.0 ms target is a dropout-free one; with dropout the figures alone
                return "" if value is None or dropout > 0 else f" ({'met' if value <= 1.0 else 'not met'})"
            lines.append(f"    {'1.0 ms target, ' if dropout == 0 else ''}triton row: ms {_ms(split)}{met(split)}, "
                         f"graph ms {_ms(graph)}{met(graph)}{f' ({why[:80]})' if graph is None and why else ''}")
            pre_graph = by.get("sdpa-prebuilt", {}).get("graph_ms")
            if dropout > 0 and None not in (graph, pre_graph):  # the 2x target without the host's time
                lines.append(f"    2x target, GPU time alone (CUDA graphs): sdpa-prebuilt {pre_graph:.3f} / triton "
                             f"{graph:.3f} = {pre_graph / graph:.2f}x")
        prebuilt_row = by.get("triton-prebuilt", {})
        prebuilt = prebuilt_row.get("ms")
        if prebuilt is not None and length == 1024:  # timed as sdpa-prebuilt: the stack's inputs built once
            line = (f"    like for like with sdpa-prebuilt (the stack's inputs built once, the table gradient "
                    f"included): triton-prebuilt {prebuilt:.3f}{_host_graph(prebuilt_row)}")
            if not padded and dropout == 0:
                line += f"; 1.0 ms: {'met' if prebuilt <= 1.0 else 'not met'}"
            if dropout > 0 and pre is not None:
                line += f"; x pre {pre / prebuilt:.2f} (>= 2: {'met' if pre / prebuilt >= 2 else 'not met'})"
            lines.append(line)
        failed = [f"{name}: {r['note'][:80]}" for name, r in by.items() if r.get("ms") is None and r.get("note")
                  and not r["note"].startswith("= ")]  # "= triton (no dropout)": the same kernels, not a failure
        if failed:  # a row that did not run as itself, at any length (OOM, a recompile limit, a refusal)
            lines.append("    n/a: " + "; ".join(failed))
        baseline_row = by.get("triton-baseline", {})
        baseline = baseline_row.get("ms")
        if baseline is not None:  # the yardstick: bias-free FlashAttention-2 in Triton at the triton row's tiles
            line = f"    yardstick triton-baseline {_ms(baseline)}{_host_graph(baseline_row)}"
            if split is not None:
                line += f"; triton - baseline {split - baseline:.3f} ms (bias, table gradient, masks, host)"
            if flash is not None:
                line += f"; baseline / flash {baseline / flash:.2f}x (Triton at these tiles against flash)"
            lines.append(line)
        nobias = by.get("triton-nobias", {})
        if nobias.get("ms") is not None:  # bias-free calls: the triton backend's (kernels without a bias if padded)
            others = [(name, by[name]) for name in ("flash-nobias", "sdpa-nobias", "flex-nobias", "cudnn-nobias")
                      if by.get(name, {}).get("ms") is not None]
            line = (f"    bias-free: triton-nobias {_ms(nobias['ms'])}{_host_graph(nobias)} (ran "
                    f"{nobias.get('ran', '?')})")
            line += "".join(f", {name} {_ms(r['ms'])}{_host_graph(r)} (ran {r.get('ran', '?')})" for name, r in others)
            if others:
                best = min(others, key=lambda item: item[1]["ms"])
                line += f"; {best[1]['ms'] / nobias['ms']:.2f}x the best other ({best[0]})"
            lines.append(line)
        for name in ("triton", "triton-fused", "triton-one-loop", "triton-tiles", "triton-baseline", "triton-nobias"):
            kernels = by.get(name, {}).get("kernels")
            if kernels:
                lines.append(f"    {name} kernels: " + ", ".join(f"{k[:32]} {v:.3f}" for k, v in
                                                               list(kernels.items())[:6]))
    return lines


def _cudnn_lines(by: Dict) -> List[str]:
    """The cudnn rows of one condition (cuDNN's fused kernels, the library option) against the triton row, in
    the call's time and in the GPU's alone (CUDA graphs), with what it decides."""
    rows = [(name, by[name]) for name in ("cudnn", "cudnn-nondeterministic") if by.get(name, {}).get("ms") is not None]
    if not rows:
        return []
    lines = []
    triton = by.get("triton", {})
    for name, row in rows:
        line = f"    {name} {_ms(row['ms'])}{_host_graph(row)} (ran {row.get('ran', '?')})"
        if row.get("ran", "").split("+")[0] != "cudnn":
            lines.append(line + ": not cuDNN's kernels (a fallback): no comparison")
            continue
        if triton.get("ms") is not None:
            ratio = triton["ms"] / row["ms"]
            line += f"; triton / {name} {ratio:.2f}x"
            if triton.get("graph_ms") is not None and row.get("graph_ms") is not None:
                line += f" (GPU time alone {triton['graph_ms'] / row['graph_ms']:.2f}x)"
            line += (": cuDNN faster, the triton kernels must beat it or leave the biased calls to it" if ratio > 1.03
                     else ": the triton kernels faster" if ratio < 0.97 else ": a tie")
        lines.append(line)
    return lines


def profile_lines(payload: Dict) -> List[str]:
    kernels = payload.get("kernels", [])
    lines = []
    if kernels:
        lines.append("kernels (ncu): condition / kernel: us, issue%, tensor%, occupancy%, bound by; largest stalls")
    for k in kernels:
        stalls = ", ".join(f"{n} {v:.1f}" for n, v in list(k.get("stalls", {}).items())[:3])
        fig = [k.get("duration_us"), k.get("issue_active_pct"), k.get("tensor_pct"), k.get("occupancy_pct")]
        lines.append(f"  {k.get('condition')} / {k.get('kind')}: " + ", ".join("-" if v is None else f"{v:.1f}"
                                                                             for v in fig)
                     + f", {k.get('bound', '?')}; {stalls}")
    for label, why in payload.get("errors", {}).items():
        lines.append(f"  {label}: {why[:160]}")
    if payload.get("error"):
        lines.append(f"kernels (ncu): {payload['error'][:200]}")
    return lines


def tiles_lines(payload: Dict) -> List[str]:
    """Per (length, dropout, padded): the fastest row, forward and backward among the triton rows."""
    rows = [r for r in payload.get("rows", []) if r.get("ms") is not None and r["backend"].startswith("triton")]
    if not rows:
        return []
    lines = ["tiles (fastest fwd+bwd; fastest forward; fastest backward = ms - fwd ms):"]
    for key in sorted({(r["length"], r["dropout"], r["padded"]) for r in rows}):
        group = [r for r in rows if (r["length"], r["dropout"], r["padded"]) == key]
        best = min(group, key=lambda r: r["ms"])
        timed = [r for r in group if r.get("fwd_ms") is not None]
        text = f"  T={key[0]} dropout {key[1]:g}: {best['backend']} {best['ms']:.3f}"
        if timed:
            fwd = min(timed, key=lambda r: r["fwd_ms"])
            bwd = min(timed, key=lambda r: r["ms"] - r["fwd_ms"])
            text += (f"; forward {fwd['backend']} {fwd['fwd_ms']:.3f}; backward {bwd['backend']} "
                     f"{bwd['ms'] - bwd['fwd_ms']:.3f}")
            plain = next((r for r in timed if r["backend"] == "triton"), None)
            for far in (r for r in timed if r["backend"].startswith("triton-far-all:")):
                if plain is not None:  # FAR_LOOPS: each kernel's far and band loops against the plain row's one
                    text += (f"; {far['backend']} fwd {far['fwd_ms']:.3f} (triton {plain['fwd_ms']:.3f}), bwd "
                             f"{far['ms'] - far['fwd_ms']:.3f} (triton {plain['ms'] - plain['fwd_ms']:.3f})")
        lines.append(text)
    return lines


def model_lines(payload: Dict) -> List[str]:
    lines = []
    for dropout, result in payload.get("by_dropout", {}).items():
        rows = result.get("rows", {})
        timed = sorted(((r["ms"], name) for name, r in rows.items() if r.get("ms") is not None))
        mode = f" compiled ({payload['compiled']}, scope {payload.get('compile_scope', 'model')})" \
            if payload.get("compiled") else ""
        text = f"model step{mode} {dropout}: " + ", ".join(f"{name} {ms:.1f}" for ms, name in timed)
        if result.get("partial"):  # stopped before the timing (bench_model writes the compiles first)
            text += f"({result['partial']})"
        if result.get("auto_vs_best") is not None:
            gap = 100 * result["auto_vs_best"]
            text += (f"; auto vs best single ({result.get('best_single')}): {gap:+.1f}% "
                     f"(target <= +3%: {'met' if gap <= 3 else 'not met'})")
        failed = [name for name, r in rows.items() if "error" in r]
        if failed:
            text += "; failed: " + ", ".join(failed)
        compiles = [f"{name} {r['compile_s']:.0f} s{' (no graph of its own)' if r.get('compile_note') else ''}"
                    for name, r in rows.items() if r.get("compile_s") is not None]
        if compiles:
            text += "; compile " + ", ".join(compiles)
        if payload.get("compiled") and result.get("auto_vs_best") is not None:
            text += f" ({_compiled_verdict(result['auto_vs_best'], result.get('best_single'))})"
        lines.append(text)
    return lines


def _cache_note(hits, lookups) -> str:
    """How many of a compilation's graphs inductor loaded from its on-disk cache, where it looked."""
    return f", {hits} of {lookups} graphs from inductor's cache" if lookups else ""


def _variant_decision(overrides: str) -> str:
    """What a bench_train variant faster than ours decides."""
    if "attention_backend=triton" in overrides:
        return ("AUTO_TABLE's sm90 row may send compiled training to triton, once the triton_gpu_tests step "
                "passes (test_gpu_compiled_model_with_the_triton_backend_matches_eager_and_runs_its_kernels: "
                "the compiled packed gradients against eager)")
    if "attention_backend=cudnn" in overrides:
        return ("AUTO_TABLE's sm90 row may send biased calls to cudnn (cuDNN's kernels: the library option), once "
                "the cudnn_gpu_tests step passes; the triton kernels then have to beat it or go")
    if "optimizer.compiled=true" in overrides:
        return "optimizer.compiled may become the default on CUDA"
    if "compile_scope=layers" in overrides:
        return "the recipes may compile per layer (a third of the compile time)"
    if "compile_mode=" in overrides:
        return "the GPU recipes may set this model.compile_mode, if its compile time (logged) is worth it"
    return "a candidate default"


def train_lines(recipe: Optional[Dict], train: Optional[Dict], variants: Optional[Dict] = None) -> List[str]:
    """Issue 11's targets: the recipe's MFU (>= 40%, no OOM recovery) and the trainer against Hugging
    Face (>= 1.5x tokens/s at no more peak memory); then the variants of ours timed beside it
    (bench_train_variants: the triton backend, the compiled optimizer), each one's ratio and what it
    decides."""
    lines = []
    if isinstance(recipe, dict) and isinstance(recipe.get("summary"), dict):
        r = recipe["summary"]
        mfu = r.get("mfu")  # percent, as the training log writes it
        done, planned = r.get("last_update") or 0, r.get("updates")
        complete = planned is None or done >= planned
        stopped = " (stopped at its timeout)" if r.get("timed_out") else ("" if complete else " (cut short)")
        ooms = r.get("oom_recoveries")
        # the recipes' target: no OOM recovery over the run's updates; a run cut short proves it only so far
        oom_verdict = "not met" if ooms else ("met" if complete else f"none in {done}: unproven")
        overrides = f" ({' '.join(r['overrides'])})" if r.get("overrides") else ""
        lines.append(f"recipe {r.get('config')}{' + ' + r['run_config'] if r.get('run_config') else ''}{overrides}: "
                     f"{done}{'' if planned is None else f' of {planned}'} updates{stopped}, "
                     f"{_ms(r.get('ups'))} updates/s (median of {r.get('steady_records', '?')} records), MFU "
                     f"{'n/a' if mfu is None else f'{mfu:.1f}%'} (target >= 40%: "
                     f"{'met' if mfu is not None and mfu >= 40 else 'not met'}), OOM recoveries "
                     f"{ooms} (target none: {oom_verdict}), recompile-limit hits {r.get('recompile_limit_hits')}, "
                     f"peak {_ms(r.get('peak_gib'))} GiB, compile {r.get('compiled_graphs', '?')} graphs "
                     f"{r.get('compile_seconds', 0.0):.0f} s"
                     + _cache_note(r.get("compile_cache_hits"), r.get("compile_cache_lookups")))
    if isinstance(train, dict) and isinstance(train.get("ours"), dict):
        ours, hf = train["ours"], train.get("hf") or {}
        backend = ours.get("attention_backend")
        named = f" ({backend})" if backend not in (None, "auto") else ""
        text = (f"bench_train: ours{named} {ours.get('tokens_per_s', 0):.0f} tokens/s, "
                f"MFU {100 * ours.get('mfu', 0):.1f}%")
        if ours.get("compile_seconds"):
            hits, misses = ours.get("compile_cache_hits") or 0, ours.get("compile_cache_misses") or 0
            text += f" (compile {ours['compile_seconds']:.0f} s{_cache_note(hits, hits + misses)})"
        if train.get("partial"):  # the run stopped before Hugging Face's figures: no ratio
            text += f" ({train['partial']}; no comparison)"
        if train.get("ratio_tokens_per_s") is not None:
            ratio = train["ratio_tokens_per_s"]
            text += (f"; HF {hf.get('tokens_per_s', 0):.0f} tokens/s; ours / HF {ratio:.2f}x (target >= 1.5x: "
                     f"{'met' if ratio >= 1.5 else 'not met'})")
        if train.get("ratio_peak_memory") is not None:
            text += f", peak memory ours / HF {train['ratio_peak_memory']:.2f}x (target <= 1.0x)"
        lines.append(text)
        kinds = (train.get("profile") or {}).get("gpu_kernel_kinds")
        if isinstance(kinds, dict) and isinstance(kinds.get("shares"), dict):
            shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in kinds["shares"].items())
            lines.append(f"bench_train GPU time by kind of kernel (GPU busy {100 * kinds.get('busy_of_span', 0):.0f}% "
                         f"of the update's span): {shares}")
    if isinstance(variants, dict) and isinstance(variants.get("ours"), dict):
        base = variants["ours"]
        lines.append(f"bench_train variants (side by side, interleaved blocks; {variants.get('device', '?')}, "
                     f"{variants.get('batch')} x {variants.get('src_len')} / {variants.get('tgt_len')}): ours "
                     f"({variants.get('backend', 'auto')}) {base.get('tokens_per_s', 0):.0f} tokens/s, MFU "
                     f"{100 * base.get('mfu', 0):.1f}%")
        for v in variants.get("variants") or []:
            ratio = v.get("speedup_vs_ours") or 0.0
            overrides = v.get("overrides", "?")
            if ratio > 1 + NOISE:
                verdict = "faster: " + _variant_decision(overrides)
            elif ratio < 1 - NOISE:
                verdict = "slower"
            else:
                verdict = f"a tie, within {NOISE:.0%}"
                if "compile_scope=layers" in overrides:
                    verdict += ": " + _variant_decision(overrides)
            lines.append(f"  + {overrides}: {ratio:.2f}x ours' tokens/s, MFU {100 * v.get('mfu', 0):.1f}%, "
                         f"peak {_ms(v.get('peak_memory_gib'))} GiB, oom recoveries {v.get('oom_recoveries')} "
                         f"({verdict})" + (f" [{v['partial']}: the run was cut]" if v.get("partial") else ""))
        for v in variants.get("failed_variants") or []:  # raised while built or warmed up: no figure, no decision
            lines.append(f"  + {v.get('overrides', '?')}: failed before its timing ({v.get('failed', '?')}): "
                         "nothing decided")
    for name, payload in (("bench_train", train), ("bench_train variants", variants)):
        graphs = payload.get("cudnn_graphs") if isinstance(payload, dict) else None
        if graphs:  # a training run pays this per new (batch, length) shape
            built = graphs.get("built") or 1
            lines.append(f"{name}: cuDNN attention graphs {graphs.get('built')} built in "
                         f"{graphs.get('build_seconds', 0):.1f} s ({graphs.get('build_seconds', 0) / built:.2f} s "
                         "each: what a training run pays per new shape)")
    return lines


def bias_grad_lines(bias_grad: Optional[Dict]) -> List[str]:
    """The relative bias's gradient (bench_bias_grad): a gather's backward against diagonal sums."""
    if not isinstance(bias_grad, dict) or not isinstance(bias_grad.get("lengths"), dict):
        return []
    parts = []
    for length, row in bias_grad["lengths"].items():
        ms = row.get("ms", {})
        modes = [m for m in ("compiled", "eager") if f"gather {m}" in ms and f"diagonals {m}" in ms]
        parts.append(f"T={length}: " + ", ".join(
            f"{m} {_ms(ms[f'gather {m}'])} -> {_ms(ms[f'diagonals {m}'])} ms "
            f"({ms[f'gather {m}'] / ms[f'diagonals {m}']:.1f}x)" for m in modes))
    return [f"bias gradient (gather -> diagonal sums, {bias_grad.get('dtype')}, {bias_grad.get('tokens')} tokens): "
            + "; ".join(parts)]


def optimizer_lines(optimizer: Optional[Dict]) -> List[str]:
    """The adamw_scale step (bench_optimizer): foreach against the fused kernel, and the floor; then
    the compiled update against the fused one (the figure that decides optimizer.compiled)."""
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("steps"), dict):
        return []
    steps = optimizer["steps"]
    text = (f"adamw_scale step ({optimizer.get('arch')}, {optimizer.get('parameters', 0) / 1e6:.0f}M fp32): "
            f"foreach {_ms(steps.get('foreach', {}).get('ms'))} ms, fused {_ms(steps.get('fused', {}).get('ms'))} "
            f"ms ({optimizer.get('speedup_fused', 0):.2f}x; the fused kernel is adamw_scale's default, "
            f"fused=false to leave it), floor {_ms(optimizer.get('floor_ms'))} ms")
    if isinstance(steps.get("compiled"), dict):
        ratio = optimizer.get("speedup_compiled_vs_fused", 0)
        verdict = "may become the default" if ratio > 1 + NOISE else "stays off"
        text += (f"; compiled {_ms(steps['compiled'].get('ms'))} ms ({ratio:.2f}x the fused step, compile "
                 f"{optimizer.get('compile_s', 0):.0f} s: optimizer.compiled=true {verdict})")
    lines = [text]
    busy = [f"{name} {_ms(s['gpu'].get('busy_ms'))} of {_ms(s.get('ms'))} ms in {s['gpu'].get('kernels')} kernels"
            for name, s in steps.items() if isinstance(s, dict) and isinstance(s.get("gpu"), dict) and s.get("ms")]
    if busy:  # busy well under the step: the host's launches bound it; near it, the kernels
        lines.append("adamw_scale step, GPU busy time (one profiled step): " + "; ".join(busy))
    return lines


def host_overhead_lines(host: Optional[Dict]) -> List[str]:
    """Host time between updates (bench_host_overhead): fairseq's bf16 step and walks against ours."""
    if not isinstance(host, dict) or not isinstance(host.get("arms"), dict):
        return []
    f, o = host["arms"].get("fairseq", {}), host["arms"].get("ours", {})
    return [f"host time after clipping per update ({host.get('config')}, "
            f"{'full width' if host.get('full_width') else 'narrow'}): fairseq {_ms(f.get('after_clip_ms'))} ms / "
            f"{f.get('launching_ops_after_clip', '?')} launching ops, ours {_ms(o.get('after_clip_ms'))} ms / "
            f"{o.get('launching_ops_after_clip', '?')}; ms per update fairseq {_ms(f.get('ms_per_update'))}, "
            f"ours {_ms(o.get('ms_per_update'))} ({host.get('speedup_per_update', 0):.3f}x)"]


def compile_lines(payload: Optional[Dict]) -> List[str]:
    """model.compile_scope (bench_compile): the first step's compile and the steady step, the whole
    forward in one graph against one graph per layer class."""
    if not isinstance(payload, dict):
        return []
    if not isinstance(payload.get("median"), dict):  # cut before every run finished: the runs it has
        runs = payload.get("runs") if isinstance(payload.get("runs"), dict) else {}
        parts = [f"{v} compile {r.get('compile_s', 0):.1f} s, step {r.get('step_ms', 0):.1f} ms"
                 for v, rs in runs.items() for r in rs if isinstance(r, dict)]
        return [f"compile scope (bench_compile, {payload.get('partial', 'partial')}): " + "; ".join(parts)] \
            if parts else []
    median, ratios = payload["median"], payload.get("ratios") or {}
    parts = [f"{v} compile {m.get('compile_s', 0):.1f} s, step {m.get('step_ms', 0):.1f} ms"
             for v, m in median.items() if isinstance(m, dict)]
    line = "compile scope (bench_compile): " + "; ".join(parts)
    if "compile_layers_over_model" in ratios and "step_layers_over_model" in ratios:
        line += (f"; layers / model: compile {ratios['compile_layers_over_model']:.2f}x, "
                 f"step {ratios['step_layers_over_model']:.3f}x")
    return [line]


NOISE = 0.02  # ratios within 2% of 1 are read as a tie: the GPU hosts are shared


def _compiled_verdict(auto_vs_best: float, best: str) -> str:
    """What the compiled step says of `AUTO_TABLE`: a single backend faster than `auto` beyond the
    noise is the evidence a row for compiled calls would need."""
    if auto_vs_best > NOISE:
        return f"{best} faster compiled: evidence for a compiled row of AUTO_TABLE"
    if auto_vs_best < -NOISE:
        return "auto faster compiled: no compiled row"
    return "within 2%, a tie: no compiled row"


def _liger_verdict(ratio: float) -> str:
    if ratio > 1 + NOISE:
        return "liger faster: AUTO_USES_LIGER may turn on"
    if ratio < 1 - NOISE:
        return "eager faster: AUTO_USES_LIGER stays False"
    return "within 2%, a tie: AUTO_USES_LIGER stays False"


def norm_ffn_lines(bench_model: Optional[List[str]]) -> List[str]:
    """The norm_ffn step (bench_model --norm-ffn, read from its log lines): liger's RMSNorm and gated
    GELU against eager in the t5_v11 step, the figure that decides liger_norm_ffn.AUTO_USES_LIGER."""
    if not isinstance(bench_model, list):
        return []
    ratios = [m.groups() for line in bench_model if isinstance(line, str)
              for m in [re.search(r"norm/ffn speed-up liger/eager( compiled)?: ([0-9.]+)x", line)] if m]
    return [f"norm/ffn speed-up liger / eager{compiled or ''}: {float(x):.3f}x ({_liger_verdict(float(x))})"
            for compiled, x in ratios]


SOFTMAX_DROPOUT_TARGET = 2.0  # fused softmax-dropout fwd+bwd against eager PyTorch (DESIGN section 8)


def softmax_dropout_lines(bench_model: Optional[List[str]]) -> List[str]:
    """bench_model's fused softmax-dropout line (read from its log lines): fused against eager, the
    2x target, and the largest difference of the two at p = 0 (the fused kernels' correctness)."""
    if not isinstance(bench_model, list):
        return []
    lines = []
    for line in bench_model:
        if not isinstance(line, str):
            continue
        m = re.search(r"softmax\+dropout fwd\+bwd at (\[[^\]]*\])[^:]*: fused ([0-9.]+) ms, eager ([0-9.]+) ms, "
                      r"speed-up ([0-9.]+)x.*max \|fused - eager\| at p=0: (\S+)", line)
        if m:
            shape, fused, eager, ratio, error = m.groups()
            met = "met" if float(ratio) >= SOFTMAX_DROPOUT_TARGET else "not met"
            lines.append(f"fused softmax-dropout {shape}: fused {fused} ms, eager {eager} ms, {float(ratio):.2f}x "
                         f"(target {SOFTMAX_DROPOUT_TARGET:g}x: {met}); max |fused - eager| at p=0 {error}")
    return lines


def summary(figures: Dict) -> List[str]:
    lines = [f"gpu_check summary ({figures.get('device', '?')}, torch {figures.get('torch', '?')}, "
             f"{figures.get('date', '?')})"]
    lines += steps_lines(figures)
    for key in ("attention", "attention_lengths", "attention_cudnn"):
        if isinstance(figures.get(key), dict):
            for length in sorted({r.get("length") for r in figures[key].get("rows", [])}):
                lines += attention_lines(figures[key], length)
    if isinstance(figures.get("attention_profile"), dict):
        lines += profile_lines(figures["attention_profile"])
    if isinstance(figures.get("attention_tiles"), dict):
        lines += tiles_lines(figures["attention_tiles"])
    for key in ("model", "model_compiled"):
        if isinstance(figures.get(key), dict):
            lines += model_lines(figures[key])
    lines += train_lines(figures.get("recipe"), figures.get("train"), figures.get("train_variants"))
    lines += bias_grad_lines(figures.get("bias_grad"))
    lines += optimizer_lines(figures.get("optimizer"))
    lines += host_overhead_lines(figures.get("host_overhead"))
    lines += compile_lines(figures.get("compile"))
    lines += norm_ffn_lines(figures.get("bench_model"))
    lines += softmax_dropout_lines(figures.get("bench_model"))
    if figures.get("pytest_summaries"):
        lines.append("tests: " + "; ".join(figures["pytest_summaries"]))
    if figures.get("pytest_failures"):
        lines.append("failed tests: " + ", ".join(figures["pytest_failures"][:20]))
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python scripts/gpu_summary.py OUTDIR/figures.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            figures = json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_summary: cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    print("\n".join(summary(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
