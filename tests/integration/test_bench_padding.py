"""benchmarks/bench_padding.py: the padding `model.compile_pad_multiple` adds to the task's real batches."""
import pytest

from ..conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_padding")


def test_the_task_s_batches_padded_per_multiple(bench, pretrain_data, capsys):
    args = bench.parse_args(["--data", pretrain_data, "--config", "tiny", "--max-tokens", "2048", "--batches", "30",
                             "--multiples", "1", "16", "64", "--no-progress"])
    result = bench.measure(args)
    assert result["batches"] > 5 and result["max_tokens"] == 2048 and result["default"] == 16
    real, collated, tokens = result["tokens"]["real"], result["tokens"]["collated"], result["tokens"]
    # multiple 1 is the collated batch itself; padding only adds, and more with a coarser multiple
    assert result["flops"][1] == pytest.approx(result["collated"]) and (tokens[1] == collated).all()
    assert (real < collated).all()  # fairseq pads each batch to its longest sample
    assert result["unpadded"] < result["collated"] < result["flops"][16] < result["flops"][64]
    assert (tokens[16] <= tokens[64]).all() and (tokens[16] >= collated).all()
    bench.report(args, result)
    out = capsys.readouterr().out
    assert "| 16 (default) |" in out and "| 1 | " in out and "| 64 | " in out


def test_usage_errors(bench, tmp_path, capsys):
    for argv in (["--data", str(tmp_path), "--batches", "0"], ["--data", str(tmp_path / "missing")],
                 ["--data", str(tmp_path), "--multiples", "0"], []):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(argv)
        assert exc.value.code == 2


def test_a_folder_that_is_not_a_corpus_is_one_line(bench, tmp_path, capsys):
    assert bench.main(["--data", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_padding: error: ") and "dict.txt not found" in err and "Traceback" not in err
