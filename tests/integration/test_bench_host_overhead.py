"""benchmarks/bench_host_overhead.py in its CPU mode: both arms train T5-base's structure through
fairseq's Trainer, and ours dispatches fewer ops after clipping (no per-parameter copy or zeroing)."""
import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_host_overhead.py")


def test_cpu_mode_compares_fairseqs_step_with_ours(tmp_path):
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--updates", "2", "--repeats", "2", "--warmup", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "host time after clipping per update" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["params"] == 198 and figures["modules"] == 339  # T5-base's structure
    f, o = figures["arms"]["fairseq"], figures["arms"]["ours"]
    n = figures["params"]
    # fairseq's arm: a copy_ per parameter in the step and a zero_ per master gradient before the forward
    assert f["top_ops_after_clip"].get("copy_") == n and f["top_ops_after_clip"].get("zero_") == n
    assert "copy_" not in o["top_ops_after_clip"] and "zero_" not in o["top_ops_after_clip"]
    assert f["launching_ops_after_clip"] - o["launching_ops_after_clip"] == 2 * n - 1  # less the one batched copy
    assert all(a[k] > 0 for a in (f, o) for k in ("ms_per_update", "after_clip_ms", "after_last_sync_ms"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error():
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
