"""benchmarks/bench_optimizer.py in its CPU mode: both updates run on the tiny model's shapes, from the
same state to the same result, and the JSON holds what the GPU run is read for."""
import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_optimizer.py")


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error():
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
