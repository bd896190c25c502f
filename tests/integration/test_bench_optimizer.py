"""benchmarks/bench_optimizer.py in its CPU mode: both updates run on the tiny model's shapes, from the
same state to the same result, and the JSON holds what the GPU run is read for."""
import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_optimizer.py")
sys.path.insert(0, os.path.abspath(os.path.dirname(SCRIPT)))
import bench_optimizer  # noqa: E402


def test_cpu_mode_runs_the_three_updates_and_they_agree(tmp_path):
    out = tmp_path / "optim.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--repeats", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fused / foreach speed-up" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["arch"] == "t5_v11_tiny" and figures["tensors"] > 10
    assert set(figures["steps"]) == {"foreach", "fused", "compiled"}
    assert all(s["ms"] > 0 for s in figures["steps"].values())
    assert figures["steps"]["fused"]["gb_moved"] < figures["steps"]["foreach"]["gb_moved"]
    assert figures["fused_vs_foreach_max_rel_error"] < 1e-5
    assert figures["compiled_vs_foreach_max_rel_error"] < 1e-5
    assert figures["compile_s"] > 0 and figures["speedup_compiled_vs_fused"] > 0
    assert "compiled / fused speed-up" in proc.stdout
    assert figures["floor_ms"] > 0
    # the fused step really ran torch's fused kernel, once per parameter; the foreach and compiled steps never
    assert figures["fused_calls_per_step"] == {"fused": figures["tensors"], "foreach": 0, "compiled": 0}
    # GPU kernel times are a CUDA run's: no profiled step here, and the report says nothing of one
    assert not any("gpu" in s for s in figures["steps"].values()) and "on the GPU" not in proc.stdout


def test_kernel_summary_sums_busy_time_and_ranks_kernels_by_their_total():
    events = [("adam", 0.0, 30.0), ("norm", 40.0, 5.0), ("adam", 50.0, 30.0), ("copy", 100.0, 50.0)]
    summary = bench_optimizer.kernel_summary(events, top=2)
    assert summary["kernels"] == 4 and summary["busy_ms"] == 0.115 and summary["span_ms"] == 0.15
    assert summary["largest"] == [["adam", 0.06, 2], ["copy", 0.05, 1]]
    assert bench_optimizer.kernel_summary([]) == {"busy_ms": 0.0, "span_ms": 0.0, "kernels": 0, "largest": []}
    out = {"arch": "t5_v11_tiny", "parameters": 10, "tensors": 2, "device": "GPU", "torch": "x", "repeats": 1,
           "copy_gb_per_s": 1.0, "floor_ms": 0.1, "speedup_fused": 2.0, "speedup_compiled_vs_fused": 1.0,
           "fused_vs_foreach_max_rel_error": 0.0, "compiled_vs_foreach_max_rel_error": 0.0, "compile_s": 1.0,
           "fused_calls_per_step": {"fused": 2, "foreach": 0, "compiled": 0},
           "steps": {"fused": {"ms": 0.23, "gb_moved": 1.0, "gb_per_s": 1.0, "gpu": summary}}}
    assert "fused on the GPU (one profiled step): busy 0.12 ms of the step's 0.23 (50%), 4 kernels; largest: " \
        "adam 0.06 ms x2; copy 0.05 ms x1" in bench_optimizer.report(out)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
def test_cuda_kernel_times_show_one_fused_launch_per_parameter_and_few_compiled_ones(tmp_path):
    """The profiled step of each implementation on a GPU: the fused step launched a kernel per parameter
    at least, the compiled step far fewer kernels than parameters (its multi-tensor kernels really ran,
    not the foreach ops), and every busy time is positive."""
    out = tmp_path / "optim.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda", "--arch", "t5_v11_small", "--repeats", "3",
                           "--warmup", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    steps, tensors = figures["steps"], figures["tensors"]
    assert all(s["gpu"]["busy_ms"] > 0 for s in steps.values())
    assert steps["fused"]["gpu"]["kernels"] >= tensors  # a launch per parameter at least
    assert steps["compiled"]["gpu"]["kernels"] < tensors / 4
    assert "fused on the GPU (one profiled step)" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error():
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
