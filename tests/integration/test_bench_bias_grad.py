"""benchmarks/bench_bias_grad.py: the bias gradient's two forms, eager and compiled (CPU, as CI runs it)."""
import json

import pytest

from ..conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_bias_grad")


def test_cpu_run_times_both_forms_eager_and_compiled_with_the_same_gradient(bench, tmp_path, capsys):
    out = tmp_path / "bias_grad.json"
    assert bench.main(["--lengths", "40", "24", "--tokens", "80", "--heads", "3", "--max-distance", "8",
                       "--repeats", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures["lengths"]) == {"40", "24"}
    keys = {"gather eager", "diagonals eager", "gather compiled", "diagonals compiled"}
    for length, row in figures["lengths"].items():
        assert row["batch"] == 80 // int(length)
        assert set(row["ms"]) == keys and all(ms > 0 for ms in row["ms"].values())
        assert row["calls"] == {key: 2 for key in keys}
        assert all(diff < 1e-5 for diff in row["max_rel_diff"].values()), row["max_rel_diff"]
        assert set(row["speedup"]) == {"eager", "compiled"}
    printed = capsys.readouterr().out
    assert "gather / diagonals: eager" in printed and "diagonals compiled" in printed


def test_a_variant_past_its_budget_stops_at_three_calls(bench, tmp_path):
    out = tmp_path / "bias_grad.json"
    assert bench.main(["--lengths", "16", "--tokens", "32", "--heads", "2", "--max-distance", "4", "--repeats", "6",
                       "--budget-s", "0", "--no-compile", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["lengths"]["16"]
    assert row["calls"] == {"gather eager": 3, "diagonals eager": 3}
    assert set(row["speedup"]) == {"eager"}


@pytest.mark.parametrize("argv", [["--repeats", "0", "--heads", "0"], ["--lengths", "64", "--tokens", "32"],
                                  ["--dtype", "fp8"]])
def test_usage_errors(bench, argv):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(argv)
    assert info.value.code == 2
