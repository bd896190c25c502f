"""bench_compile.py (model.compile_scope: the whole forward or one graph per layer class): one
variant's run in this process at a tiny shape, and the report the parent makes of the variants'
child runs (their processes replaced by canned results)."""
import json

import pytest
import torch

from tests.conftest import load_benchmark


def test_a_variant_run_compiles_one_graph_per_layer_class_and_times_its_steps():
    bench = load_benchmark("bench_compile")
    torch._dynamo.reset()
    args = bench.parse_args(["--arch", "t5_v11_tiny", "--vocab", "64", "--batch", "2", "--src-len", "40",
                             "--tgt-len", "12", "--steps", "2", "--compile-backend", "aot_eager",
                             "--worker", "layers", "--result", "unused"])
    result = bench.worker(args)
    assert result["variant"] == "layers" and result["graphs"] == 2  # one encoder and one decoder layer
    assert result["compile_s"] > 0 and result["first_step_s"] >= result["compile_s"]
    assert result["step_ms"] > 0 and result["first_loss"] > 0


def test_the_report_gives_medians_over_rounds_and_the_ratios_of_layers_to_model(tmp_path, monkeypatch, capsys):
    bench = load_benchmark("bench_compile")
    calls = []

    def fake_run(variant, args):
        calls.append(variant)
        compile_s = {"eager": 0.0, "model": 60.0, "layers": 24.0}[variant] + len(calls) % 2
        return {"variant": variant, "first_step_s": compile_s + 1, "compile_s": compile_s,
                "graphs": {"eager": 0, "model": 1, "layers": 2}[variant], "step_ms": 100.0, "first_loss": 4.0}

    monkeypatch.setattr(bench, "run_variant", fake_run)
    out = tmp_path / "compile.json"
    assert bench.main(["--repeats", "3", "--json", str(out)]) == 0
    assert calls == ["eager", "model", "layers", "layers", "model", "eager", "eager", "model", "layers"]
    figures = json.loads(out.read_text())
    assert figures["median"]["layers"]["compile_s"] == 25.0 and figures["median"]["model"]["compile_s"] == 60.0
    assert figures["ratios"]["compile_layers_over_model"] == pytest.approx(25 / 60)
    assert figures["ratios"]["step_layers_over_model"] == 1.0
    assert len(figures["runs"]["model"]) == 3


def test_each_run_is_written_as_it_finishes(tmp_path, monkeypatch):
    """gpu_check's compile_scope step may be cut by its time limit during the second variant (a compile of
    T5-base took 136 s on the H200): the JSON holds the runs finished before, and gpu_summary reads them."""
    import importlib.util
    import os

    bench = load_benchmark("bench_compile")
    calls = []

    def fake_run(variant, args):
        calls.append(variant)
        if len(calls) == 2:
            raise TimeoutError("cut by the step's time limit")
        return {"variant": variant, "first_step_s": 61.0, "compile_s": 60.0, "graphs": 1, "step_ms": 100.0,
                "first_loss": 4.0}

    monkeypatch.setattr(bench, "run_variant", fake_run)
    out = tmp_path / "compile.json"
    with pytest.raises(TimeoutError):
        bench.main(["--repeats", "1", "--variants", "model", "layers", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["runs"] == {"model": [{"variant": "model", "first_step_s": 61.0, "compile_s": 60.0, "graphs": 1,
                                          "step_ms": 100.0, "first_loss": 4.0}], "layers": []}
    assert "median" not in figures and figures["partial"]
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_summary.py")
    spec = importlib.util.spec_from_file_location("gpu_summary", script)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    assert summary.compile_lines(figures) == [
        "compile scope (bench_compile, not every run has finished): model compile 60.0 s, step 100.0 ms"]


def test_bad_arguments_are_one_line_errors(capsys):
    bench = load_benchmark("bench_compile")
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    assert "--steps, --repeats" in capsys.readouterr().err
