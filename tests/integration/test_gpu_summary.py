"""scripts/gpu_summary.py: the reading of a gpu_check call's figures.json (targets and decisions)."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_summary.py")


def row(backend, dropout, padded, ms, length=1024, **extra):
    return dict(backend=backend, dropout=dropout, padded=padded, ms=ms, length=length, **extra)


FIGURES = {
    "date": "2026-11-27 10:00:00 UTC", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
    "steps": {"build": {"exit": 0, "seconds": 21}, "bench_attention": {"exit": 0, "seconds": 95},
              "attention_tests": {"exit": "skipped", "seconds": 0}},
    "attention": {"device_name": "NVIDIA H100 80GB HBM3", "rows": [
        row("triton", 0.0, False, 2.0, kernels={"_bwd_dq_kernel": 0.9, "_fwd_kernel": 0.5}),
        row("triton-fused", 0.0, False, 1.6), row("triton-frozen", 0.0, False, 1.5),
        row("triton-one-loop", 0.0, False, 1.25), row("triton-far-all", 0.0, False, 1.6),
        row("triton-tiles", 0.0, False, 1.0),
        row("sdpa-prebuilt", 0.0, False, 2.6), row("flash-nobias", 0.0, False, 0.7),
        row("triton", 0.1, False, 2.5, graph_ms=1.6), row("triton-fused", 0.1, False, 2.0),
        row("sdpa-prebuilt", 0.1, False, 3.0, graph_ms=3.2),
        row("triton-bits", 0.1, False, 1.25), row("triton-prebuilt", 0.1, False, 1.4, host_ms=0.9, graph_ms=1.3),
        row("triton-prebuilt", 0.0, False, 0.95),
        row("triton", 0.0, True, 1.9), row("triton-fused", 0.0, True, None)]},
    "attention_lengths": {"rows": [row("triton", 0.0, False, 0.6, length=512),
                                   row("flex", 0.0, False, None, length=512, note="FailOnRecompileLimitHit: limit")]},
    "attention_profile": {"kernels": [
        {"condition": "triton p0", "kind": "dQ", "duration_us": 900.0, "issue_active_pct": 40.0, "tensor_pct": 20.0,
         "occupancy_pct": 18.0, "bound": "latency (long_scoreboard)", "stalls": {"long_scoreboard": 4.0, "wait": 1.0}}],
        "errors": {"triton p0.1": "skipped: 10 s of --timeout 115 s left"}},
    "attention_tiles": {"rows": [
        row("triton", 0.0, True, 2.3, fwd_ms=0.8), row("triton:128x32x128x8x3x8x64", 0.0, True, 2.2, fwd_ms=0.6),
        row("triton-fused:64x64x64x4x2", 0.0, True, 1.9, fwd_ms=0.8), row("sdpa", 0.0, True, 2.7, fwd_ms=1.0),
        row("triton-far-all:64x64x64x4x2", 0.0, True, 2.1, fwd_ms=0.9)]},
    "model": {"by_dropout": {"dropout 0": {
        "rows": {"ours[auto]": {"ms": 81.0}, "ours[triton]": {"ms": 80.0}, "ours[triton-fused]": {"ms": 75.0},
                 "ours[flex]": {"error": "OutOfResources: shared memory"}},
        "best_single": "ours[triton-fused]", "auto_vs_best": 0.08}}},
    "model_compiled": {"compiled": "inductor", "compile_scope": "layers", "by_dropout": {"dropout 0": {
        "rows": {"ours[auto]": {"ms": 60.0, "compile_s": 41.2}, "ours[triton]": {"ms": 54.0, "compile_s": 58.7}},
        "best_single": "ours[triton]", "auto_vs_best": 60.0 / 54.0 - 1}}},
    "recipe": {"summary": {"config": "base", "run_config": "single_gpu", "last_update": 200, "ups": 2.5,
                           "mfu": 31.2, "oom_recoveries": 0, "recompile_limit_hits": 0, "peak_gib": 70.5,
                           "updates": 200, "steady_records": 8, "compiled_graphs": 1, "compile_seconds": 136.4,
                           "compile_cache_hits": 0, "compile_cache_lookups": 2, "timed_out": False,
                           "overrides": ["++model.attention_backend=triton"]}},
    "train": {"ours": {"tokens_per_s": 300000.0, "mfu": 0.33, "compile_seconds": 14.2, "compile_cache_hits": 2,
                       "attention_backend": "triton",
                       "compile_cache_misses": 0}, "hf": {"tokens_per_s": 150000.0},
              "ratio_tokens_per_s": 2.0, "ratio_peak_memory": 0.9,
              "profile": {"gpu_kernel_kinds": {"shares": {"matrix products": 0.55, "attention": 0.25, "other": 0.2},
                                               "busy_of_span": 0.874}}},
    "bias_grad": {"dtype": "bf16", "tokens": 32768, "lengths": {
        "512": {"ms": {"gather eager": 2.0, "diagonals eager": 1.0, "gather compiled": 600.0,
                       "diagonals compiled": 1.5}},
        "1024": {"ms": {"gather eager": 4.0, "diagonals eager": 2.5}}}},
    "optimizer": {"arch": "t5_v11_base", "parameters": 247.6e6, "steps": {"foreach": {"ms": 9.5}, "fused": {"ms": 3.1}},
                  "speedup_fused": 3.06, "floor_ms": 2.7},
    "host_overhead": {"config": "base", "full_width": False, "speedup_per_update": 1.25,
                      "arms": {"fairseq": {"after_clip_ms": 6.1, "launching_ops_after_clip": 668,
                                           "ms_per_update": 20.0},
                               "ours": {"after_clip_ms": 2.2, "launching_ops_after_clip": 273,
                                        "ms_per_update": 16.0}}},
    "bench_model": ["norm/ffn eager           98.0 ms/step, step peak memory above the resident models 9.10 GiB",
                    "norm/ffn speed-up liger/eager: 1.083x (> 1: liger faster)",
                    "norm/ffn speed-up liger/eager compiled: 0.970x (> 1: liger faster)",
                    "norm/ffn speed-up liger/eager: 1.010x (> 1: liger faster)"],
    "pytest_summaries": ["60 passed, 3 skipped in 120.0s"], "pytest_failures": ["tests/x.py::test_y"],
}


def run(tmp_path, figures):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(figures))
    return subprocess.run([sys.executable, SCRIPT, str(path)], capture_output=True, text=True)


def test_the_summary_reads_every_target_and_decision(tmp_path):
    proc = run(tmp_path, FIGURES)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "NVIDIA H100 80GB HBM3, torch 2.11.0+cu130" in out
    assert "attention_tests skipped (0 s)" in out
    # the triton row against fused, one loop, the forward's far loop and the bias tiles, the table gradient's
    # share, the issue's targets at 1024 only (the best triton row: the bias tiles here)
    assert ("dropout 0 padded no : triton 2.000, fused 1.600 (1.25x), one-loop 1.250 (1.60x), far-all 1.600 (1.25x), "
            "tiles 1.000 (2.00x), frozen 1.500 (table gradient 25%)" in out)
    assert "target <= 1.0 ms: met (1.000)" in out
    assert "far-all n/a, tiles n/a, bits 1.250 (2.00x), frozen" in out  # the dropout mask's bits: with dropout only
    assert "x pre 2.40 (target >= 2: met)" in out  # the best triton row (bits) against sdpa-prebuilt
    assert ", bits" not in out.split("dropout 0 padded no :")[1].split("\n")[0]
    assert "fused n/a" in out  # a row that did not run
    # figures without host ms and graph ms (a run before --graph): the ms alone, the target line still there
    assert "triton 2.000 (host" not in out and "flash bias-free 0.700, " not in out
    assert out.count("    1.0 ms target, triton row: ms 2.000 (not met), graph ms n/a\n") == 1
    assert out.count("1.0 ms target, triton row:") == 2  # one per dropout-free condition at 1024, none at 512
    assert "    triton row: ms 2.500, graph ms 1.600\n" in out  # with dropout: the figures, no 1.0 ms verdict
    # the dropout target on the GPU's time alone, where both rows have a CUDA graph's replay
    assert out.count("2x target, GPU time alone") == 1
    # the prebuilt row, like for like with sdpa-prebuilt: against the 1.0 ms target without dropout, x pre with it
    assert ("    like for like with sdpa-prebuilt (the stack's inputs built once, the table gradient included): "
            "triton-prebuilt 0.950; 1.0 ms: met\n") in out
    assert ("    like for like with sdpa-prebuilt (the stack's inputs built once, the table gradient included): "
            "triton-prebuilt 1.400 (host 0.900, graph 1.300); x pre 2.14 (>= 2: met)\n") in out
    assert out.count("like for like") == 2
    assert "    2x target, GPU time alone (CUDA graphs): sdpa-prebuilt 3.200 / triton 1.600 = 2.00x\n" in out
    assert "attention at T=S=512" in out and out.count("target <= 1.0 ms") == 1
    assert "    n/a: flex: FailOnRecompileLimitHit: limit" in out  # why a row is n/a, at any length
    assert "triton kernels: _bwd_dq_kernel 0.900, _fwd_kernel 0.500" in out
    assert "triton p0 / dQ: 900.0, 40.0, 20.0, 18.0, latency (long_scoreboard); long_scoreboard 4.0, wait 1.0" in out
    assert "triton p0.1: skipped" in out
    # the tile sweep: fastest row, forward and backward apart (sdpa is not a tile)
    assert ("T=1024 dropout 0: triton-fused:64x64x64x4x2 1.900; forward triton:128x32x128x8x3x8x64 0.600; "
            "backward triton-fused:64x64x64x4x2 1.100; triton-far-all:64x64x64x4x2 fwd 0.900 (triton 0.800), "
            "bwd 1.200 (triton 1.500)") in out
    assert ("model step dropout 0: ours[triton-fused] 75.0, ours[triton] 80.0, ours[auto] 81.0; auto vs best "
            "single (ours[triton-fused]): +8.0% (target <= +3%: not met); failed: ours[flex]") in out
    assert ("model step compiled (inductor, scope layers) dropout 0: ours[triton] 54.0, ours[auto] 60.0; auto vs "
            "best single (ours[triton]): +11.1% (target <= +3%: not met); compile ours[auto] 41 s, "
            "ours[triton] 59 s (ours[triton] faster compiled: evidence for a compiled row of AUTO_TABLE)") in out
    assert ("recipe base + single_gpu (++model.attention_backend=triton): 200 of 200 updates, 2.500 updates/s "
            "(median of 8 records), MFU 31.2% "
            "(target >= 40%: not met), OOM recoveries 0 (target none: met), recompile-limit hits 0, "
            "peak 70.500 GiB, compile 1 graphs 136 s, 0 of 2 graphs from inductor's cache") in out
    # bench_train after the recipe on one machine: our graphs loaded from inductor's cache, said so
    assert ("bench_train: ours (triton) 300000 tokens/s, MFU 33.0% (compile 14 s, 2 of 2 graphs from inductor's "
            "cache); "
            "HF 150000 tokens/s; ours / HF 2.00x (target >= 1.5x: met), peak memory ours / HF 0.90x") in out
    assert ("bench_train GPU time by kind of kernel (GPU busy 87% of the update's span): matrix products 55.0%, "
            "attention 25.0%, other 20.0%") in out
    assert ("bias gradient (gather -> diagonal sums, bf16, 32768 tokens): T=512: compiled 600.000 -> 1.500 ms "
            "(400.0x), eager 2.000 -> 1.000 ms (2.0x); T=1024: eager 4.000 -> 2.500 ms (1.6x)") in out
    assert ("adamw_scale step (t5_v11_base, 248M fp32): foreach 9.500 ms, fused 3.100 ms (3.06x; the fused "
            "kernel is adamw_scale's default, fused=false to leave it), floor 2.700 ms") in out
    assert ("host time after clipping per update (base, narrow): fairseq 6.100 ms / 668 launching ops, ours "
            "2.200 ms / 273; ms per update fairseq 20.000, ours 16.000 (1.250x)") in out
    assert "norm/ffn speed-up liger / eager: 1.083x (liger faster: AUTO_USES_LIGER may turn on)" in out
    assert "norm/ffn speed-up liger / eager compiled: 0.970x (eager faster: AUTO_USES_LIGER stays False)" in out
    assert "norm/ffn speed-up liger / eager: 1.010x (within 2%, a tie: AUTO_USES_LIGER stays False)" in out
    assert "tests: 60 passed" in out and "failed tests: tests/x.py::test_y" in out


def test_a_recipe_stopped_at_its_timeout_reads_as_unproven(tmp_path):
    """bench_recipe stopped by its --timeout (gpu_check's budget) writes what it logged: the summary says
    how far it got, and no OOM recovery so far does not meet the target of none in the whole run."""
    figures = {"recipe": {"summary": dict(FIGURES["recipe"]["summary"], last_update=160, timed_out=True)},
               "train": {"ours": {"tokens_per_s": 300000.0, "mfu": 0.33}, "partial": "ours alone (one block)"}}
    proc = run(tmp_path, figures)
    assert proc.returncode == 0, proc.stderr
    assert ("160 of 200 updates (stopped at its timeout)" in proc.stdout
            and "OOM recoveries 0 (target none: none in 160: unproven)" in proc.stdout), proc.stdout
    # the compiled model step cut during its timing: the compiles it wrote first
    figures = {"model_compiled": {"compiled": "inductor", "compile_scope": "layers", "by_dropout": {"dropout 0": {
        "rows": {"ours[auto]": {"compile_s": 41.2, "kernels": {}}, "ours[triton]": {"compile_s": 0.0,
                                                                                   "compile_note": "none"}},
        "partial": "compiled in the first steps, not timed yet"}}}}
    proc = run(tmp_path, figures)
    assert ("model step compiled (inductor, scope layers) dropout 0: (compiled in the first steps, not timed yet); "
            "compile ours[auto] 41 s, ours[triton] 0 s (no graph of its own)") in proc.stdout, proc.stdout
    figures = {"recipe": {"summary": dict(FIGURES["recipe"]["summary"], last_update=160, timed_out=True)},
               "train": {"ours": {"tokens_per_s": 300000.0, "mfu": 0.33}, "partial": "ours alone (one block)"}}
    proc = run(tmp_path, figures)
    # bench_train cut before Hugging Face's run: ours alone, said so
    assert "bench_train: ours 300000 tokens/s, MFU 33.0% (ours alone (one block); no comparison)" in proc.stdout



def test_the_trainer_variants_read_against_ours_in_the_same_run(tmp_path):
    """bench_train_variants (bench_train --versus, no HF): each variant's ratio over ours, measured in
    the same interleaved blocks, read as faster (with what it decides), slower or a tie."""
    variants = {"device": "NVIDIA H200", "batch": 64, "src_len": 512, "tgt_len": 114, "backend": "auto",
                "ours": {"tokens_per_s": 300000.0, "mfu": 0.236},
                "variants": [{"overrides": "++model.attention_backend=triton", "speedup_vs_ours": 1.15, "mfu": 0.27,
                              "peak_memory_gib": 15.5, "oom_recoveries": 0},
                             {"overrides": "+optimizer.compiled=true", "speedup_vs_ours": 1.01, "mfu": 0.238,
                              "peak_memory_gib": 17.0, "oom_recoveries": 0},
                             {"overrides": "model.foo=1", "speedup_vs_ours": 0.9, "mfu": 0.21, "oom_recoveries": 2},
                             {"overrides": "++model.attention_backend=cudnn", "speedup_vs_ours": 1.3, "mfu": 0.31,
                              "oom_recoveries": 0},
                             {"overrides": "++model.compile_scope=layers", "speedup_vs_ours": 0.99, "mfu": 0.234,
                              "oom_recoveries": 0, "partial": "one block beside ours right after its warm-up"}],
                "failed_variants": [{"overrides": "++model.attention_backend=flex", "failed": "OutOfMemoryError: x"}]}
    out = run(tmp_path, {"train_variants": variants}).stdout
    assert "  + ++model.attention_backend=flex: failed before its timing (OutOfMemoryError: x): nothing decided" in out
    assert ("bench_train variants (side by side, interleaved blocks; NVIDIA H200, 64 x 512 / 114): ours (auto) "
            "300000 tokens/s, MFU 23.6%") in out, out
    assert ("  + ++model.attention_backend=triton: 1.15x ours' tokens/s, MFU 27.0%, peak 15.500 GiB, oom recoveries 0 "
            "(faster: AUTO_TABLE's sm90 row may send compiled training to triton, once the triton_gpu_tests step "
            "passes") in out, out
    assert "  + +optimizer.compiled=true: 1.01x ours' tokens/s" in out and "(a tie, within 2%)" in out
    assert ("  + ++model.attention_backend=cudnn: 1.30x ours' tokens/s, MFU 31.0%, peak n/a GiB, oom recoveries 0 "
            "(faster: AUTO_TABLE's sm90 row may send biased calls to cudnn") in out, out
    assert "  + model.foo=1: 0.90x ours' tokens/s, MFU 21.0%, peak n/a GiB, oom recoveries 2 (slower)" in out, out
    # compiling per layer costs a third of the compile: a tie decides it too; a cut run's block is marked
    assert ("  + ++model.compile_scope=layers: 0.99x ours' tokens/s, MFU 23.4%, peak n/a GiB, oom recoveries 0 "
            "(a tie, within 2%: the recipes may compile per layer (a third of the compile time)) [one block beside "
            "ours right after its warm-up: the run was cut]") in out, out
    variants["cudnn_graphs"] = {"built": 4, "build_seconds": 2.0}
    assert ("bench_train variants: cuDNN attention graphs 4 built in 2.0 s (0.50 s each: what a training run pays "
            "per new shape)") in run(tmp_path, {"train_variants": variants}).stdout
    variants["variants"][1]["speedup_vs_ours"] = 1.08
    out = run(tmp_path, {"train_variants": variants}).stdout
    assert "(faster: optimizer.compiled may become the default on CUDA)" in out, out


def test_the_norm_ffn_line_reads_what_bench_model_writes():
    """gpu_check keeps bench_model's log lines, and the summary parses the ratio out of them: the
    format bench_model logs (read from its source) must stay the one the summary reads."""
    import re
    import importlib.util
    source = open(os.path.join(os.path.dirname(SCRIPT), "..", "benchmarks", "bench_model.py"), encoding="utf-8").read()
    fmt = re.search(r'logger\.info\("(norm/ffn speed-up [^"]*)"', source).group(1)
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    lines = summary.norm_ffn_lines([fmt % ("", 1.25), fmt % (" compiled", 0.8)])
    assert lines == ["norm/ffn speed-up liger / eager: 1.250x (liger faster: AUTO_USES_LIGER may turn on)",
                     "norm/ffn speed-up liger / eager compiled: 0.800x (eager faster: AUTO_USES_LIGER stays False)"]


def test_the_compiled_step_reads_as_a_decision_about_auto_s_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    payload = {"compiled": "inductor", "compile_scope": "layers", "by_dropout": {"dropout 0": {
        "rows": {"ours[auto]": {"ms": 50.0}, "ours[triton]": {"ms": 0.0}}, "best_single": "ours[triton]"}}}
    verdicts = []
    for triton_ms in (55.0, 50.5, 45.0):  # auto 10% faster, a tie, triton 11% faster
        result = payload["by_dropout"]["dropout 0"]
        result["rows"]["ours[triton]"]["ms"] = triton_ms
        result["auto_vs_best"] = 50.0 / triton_ms - 1
        verdicts.append(summary.model_lines(payload)[0].rsplit(" (", 1)[1])
    assert verdicts == ["auto faster compiled: no compiled row)", "within 2%, a tie: no compiled row)",
                        "ours[triton] faster compiled: evidence for a compiled row of AUTO_TABLE)"]
    del payload["compiled"]  # the eager step: no verdict
    assert "compiled row" not in summary.model_lines(payload)[0]


def test_the_compile_scope_line_reads_what_bench_compile_writes(tmp_path, monkeypatch):
    """bench_compile's --json (its report, from canned child runs) read by the summary."""
    import importlib.util

    from tests.conftest import load_benchmark

    bench = load_benchmark("bench_compile")
    monkeypatch.setattr(bench, "run_variant", lambda variant, args: {
        "variant": variant, "first_step_s": 1.0, "compile_s": {"model": 120.0, "layers": 40.0}[variant],
        "graphs": 1, "step_ms": {"model": 80.0, "layers": 82.0}[variant], "first_loss": 4.0})
    out = tmp_path / "compile.json"
    assert bench.main(["--repeats", "1", "--variants", "model", "layers", "--json", str(out)]) == 0
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    assert summary.compile_lines(json.loads(out.read_text())) == [
        "compile scope (bench_compile): model compile 120.0 s, step 80.0 ms; layers compile 40.0 s, step 82.0 ms; "
        "layers / model: compile 0.33x, step 1.025x"]
    assert summary.compile_lines(None) == [] and summary.compile_lines({"median": None}) == []


def test_host_and_graph_times_stand_beside_the_ms_and_the_target_line_states_both(tmp_path):
    """bench_attention --graph figures: the triton and flash rows' host ms and graph ms beside their ms,
    and per condition the triton row's ms and graph ms against the 1.0 ms target (a row whose capture
    failed: graph n/a and why)."""
    figures = {"attention": {"device_name": "NVIDIA H200", "rows": [
        row("triton", 0.0, False, 2.28, host_ms=1.4, graph_ms=0.88),
        row("flash-nobias", 0.0, False, 0.7, host_ms=0.3, graph_ms=0.65),
        row("triton", 0.1, False, 2.5, host_ms=1.5, graph_note="RuntimeError: operation not permitted when stream "
                                                               "is capturing"),
        row("flash-nobias", 0.1, False, 0.8, graph_ms=0.75)]}}
    proc = run(tmp_path, figures)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dropout 0 padded no : triton 2.280 (host 1.400, graph 0.880), fused n/a" in out
    assert "flash bias-free 0.700 (host 0.300, graph 0.650)" in out
    assert "    1.0 ms target, triton row: ms 2.280 (not met), graph ms 0.880 (met)" in out
    assert "dropout 0.1 padded no : triton 2.500 (host 1.500), fused" in out
    assert "flash bias-free 0.800 (graph 0.750)" in out
    assert ("    triton row: ms 2.500, graph ms n/a (RuntimeError: operation not "
            "permitted when stream is capturing)") in out
    assert "yardstick" not in out  # no triton-baseline row in these figures


def test_the_yardstick_row_reads_against_the_triton_row_and_flash(tmp_path):
    """bench_attention's triton-baseline row (bias-free Triton at the backend's tiles): its time beside the
    triton row's and flash's, the differences stated; with dropout it does not run (no line)."""
    figures = {"attention": {"device_name": "NVIDIA H100", "rows": [
        row("triton", 0.0, True, 1.5, host_ms=0.4, graph_ms=1.2),
        row("triton-baseline", 0.0, True, 0.9, host_ms=0.1, graph_ms=0.85,
            kernels={"_base_dkdv_kernel": 0.4, "_base_fwd_kernel": 0.2}),
        row("flash-nobias", 0.0, True, 0.6),
        row("triton", 0.1, True, 1.8), row("triton-baseline", 0.1, True, None)]}}
    proc = run(tmp_path, figures)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("    yardstick triton-baseline 0.900 (host 0.100, graph 0.850); triton - baseline 0.600 ms (bias, "
            "table gradient, masks, host); baseline / flash 1.50x (Triton at these tiles against flash)") in out
    assert out.count("yardstick") == 1
    assert "triton-baseline kernels: _base_dkdv_kernel 0.400, _base_fwd_kernel 0.200" in out


def test_the_bias_free_rows_read_against_the_triton_backend_s_bias_free_kernels(tmp_path):
    """bench_attention's triton-nobias row (the triton backend's bias-free call: its kernels without a bias
    when padded): beside the other bias-free rows, each with the kernel that ran, and its speed-up over the
    best of them; no line without the row."""
    figures = {"attention": {"device_name": "NVIDIA H200", "rows": [
        row("triton-nobias", 0.0, True, 1.0, host_ms=0.5, graph_ms=0.7, ran="triton-nobias"),
        row("flash-nobias", 0.0, True, 3.0, graph_ms=1.3, ran="torch-varlen"),
        row("sdpa-nobias", 0.0, True, 2.4, ran="sdpa-masked-no-cudnn"),
        row("flash-nobias", 0.1, True, 0.8)]}}
    proc = run(tmp_path, figures)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("    bias-free: triton-nobias 1.000 (host 0.500, graph 0.700) (ran triton-nobias), flash-nobias 3.000 "
            "(graph 1.300) (ran torch-varlen), sdpa-nobias 2.400 (ran sdpa-masked-no-cudnn); 2.40x the best other "
            "(sdpa-nobias)") in out
    assert out.count("bias-free: ") == 1


def test_a_call_that_measured_little_still_reads_and_a_bad_file_says_why(tmp_path):
    proc = run(tmp_path, {"steps": {"build": {"exit": 1, "seconds": 5}}})
    assert proc.returncode == 0 and "steps: build 1 (5 s)" in proc.stdout and "attention" not in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, SCRIPT, str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_the_compiled_optimizer_reads_against_the_fused_step(tmp_path):
    """bench_optimizer's compiled row (optimizer.compiled) against the fused kernel's: the ratio and
    what it decides; a JSON from before the row keeps its old line (the test above)."""
    optimizer = dict(FIGURES["optimizer"], compile_s=41.7, speedup_compiled_vs_fused=1.55,
                     steps={**FIGURES["optimizer"]["steps"], "compiled": {"ms": 2.0}})
    out = run(tmp_path, {"optimizer": optimizer}).stdout
    assert ("floor 2.700 ms; compiled 2.000 ms (1.55x the fused step, compile 42 s: optimizer.compiled=true may "
            "become the default)") in out, out
    out = run(tmp_path, {"optimizer": dict(optimizer, speedup_compiled_vs_fused=0.9)}).stdout
    assert "(0.90x the fused step, compile 42 s: optimizer.compiled=true stays off)" in out, out


def test_the_optimizer_steps_gpu_busy_time_is_a_line_of_its_own(tmp_path):
    """bench_optimizer's profiled step (CUDA) per implementation: busy time against the step's, and the
    kernels launched; a JSON without it (before the profile, or --no-kernel-times) has no such line."""
    gpu = {"busy_ms": 2.5, "span_ms": 2.9, "kernels": 14, "largest": []}
    steps = {"foreach": {"ms": 9.5}, "fused": {"ms": 8.0, "gpu": dict(gpu, busy_ms=7.1, kernels=203)},
             "compiled": {"ms": 3.0, "gpu": gpu}}
    out = run(tmp_path, {"optimizer": dict(FIGURES["optimizer"], steps=steps, speedup_compiled_vs_fused=2.67)}).stdout
    assert ("adamw_scale step, GPU busy time (one profiled step): fused 7.100 of 8.000 ms in 203 kernels; "
            "compiled 2.500 of 3.000 ms in 14 kernels") in out, out
    assert "GPU busy time" not in run(tmp_path, {"optimizer": FIGURES["optimizer"]}).stdout


def test_the_softmax_dropout_line_reads_what_bench_model_writes():
    """bench_model's fused softmax-dropout line (its format read from its source, as gpu_check keeps
    it) becomes a summary line with the 2x target's verdict and the p = 0 difference."""
    import importlib.util
    import re
    source = open(os.path.join(os.path.dirname(SCRIPT), "..", "benchmarks", "bench_model.py"), encoding="utf-8").read()
    fmt = re.search(r'logger\.info\("(softmax\+dropout fwd\+bwd [^"]*)"\s*\n\s*"([^"]*)"', source)
    fmt = fmt.group(1) + fmt.group(2)
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    kept = [fmt % (16, 16, 2.1, 7.12, 3.39, 0.0039), fmt % (16, 16, 4.91, 7.12, 1.45, 0.0039)]
    assert all(re.search(r"ms/step|speed-up|TFLOP", line) for line in kept)  # what gpu_check keeps
    assert summary.softmax_dropout_lines(kept + ["unrelated speed-up line"]) == [
        "fused softmax-dropout [16*16, 1024, 1024]: fused 2.10 ms, eager 7.12 ms, 3.39x (target 2x: met); "
        "max |fused - eager| at p=0 3.90e-03",
        "fused softmax-dropout [16*16, 1024, 1024]: fused 4.91 ms, eager 7.12 ms, 1.45x (target 2x: not met); "
        "max |fused - eager| at p=0 3.90e-03"]
    assert summary.softmax_dropout_lines(None) == []


def test_the_cudnn_rows_read_against_the_triton_row_and_count_for_the_target(tmp_path):
    """cudnn_attention's rows (attention_cudnn.json): cuDNN's kernels against the triton row, in the call's time and
    the GPU's alone, with what the ratio decides; they count for issue 10's 1.0 ms target like any backend; a row
    that fell back to another kernel is not compared."""
    figures = {"attention_cudnn": {"device_name": "NVIDIA H200", "rows": [
        row("triton", 0.0, False, 1.9, graph_ms=1.5), row("cudnn", 0.0, False, 0.95, ran="cudnn", graph_ms=0.75),
        row("cudnn-nondeterministic", 0.0, False, 0.9, ran="cudnn"), row("sdpa-prebuilt", 0.0, False, 2.4),
        row("triton", 0.0, True, 1.0, length=512), row("cudnn", 0.0, True, 1.2, length=512, ran="cudnn"),
        row("cudnn", 0.0, False, 2.0, length=512, ran="sdpa-masked-no-cudnn"),
        row("triton", 0.0, False, 1.0, length=512)]}}
    proc = run(tmp_path, figures)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("    cudnn 0.950 (graph 0.750) (ran cudnn); triton / cudnn 2.00x (GPU time alone 2.00x): cuDNN faster, the "
            "triton kernels must beat it or leave the biased calls to it") in out, out
    assert "    cudnn-nondeterministic 0.900 (ran cudnn); triton / cudnn-nondeterministic 2.11x" in out
    assert "target <= 1.0 ms: met (0.900)" in out  # the fastest biased row, cuDNN's here
    assert "    cudnn 1.200 (ran cudnn); triton / cudnn 0.83x: the triton kernels faster" in out
    assert "    cudnn 2.000 (ran sdpa-masked-no-cudnn): not cuDNN's kernels (a fallback): no comparison" in out
