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
    # distinct attention shapes (encoder, decoder, cross): a coarser multiple maps each shape to one of its own,
    # so never more of them; a cross-attention shape gives one of each self-attention's; at most one per batch
    shapes = result["shapes"]
    for m in (1, 16, 64):
        encoder, decoder, cross = shapes[m]
        assert 1 <= max(encoder, decoder) <= cross <= result["batches"], shapes
    assert all(a >= b >= c for a, b, c in zip(shapes[1], shapes[16], shapes[64])), shapes
    assert sum(shapes[1]) > sum(shapes[64]), shapes  # the lengths vary: buckets merge some
    bench.report(args, result)
    out = capsys.readouterr().out
    assert "| 16 (default) |" in out and "| 1 | " in out and "| 64 | " in out
    encoder, decoder, cross = shapes[16]
    assert f"| {encoder} + {decoder} + {cross} = {encoder + decoder + cross} |" in out


def test_usage_errors(bench, tmp_path, capsys):
    for argv in (["--data", str(tmp_path), "--batches", "0"], ["--data", str(tmp_path / "missing")],
                 ["--data", str(tmp_path), "--multiples", "0"], ["--data", str(tmp_path), "--pools", "0"], []):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(argv)
        assert exc.value.code == 2


def test_a_folder_that_is_not_a_corpus_is_one_line(bench, tmp_path, capsys):
    assert bench.main(["--data", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_padding: error: ") and "dict.txt not found" in err and "Traceback" not in err


def test_a_pool_is_cut_again_by_corrupted_lengths_keeping_its_samples_and_row_counts(bench):
    pool = [[(30, 9), (10, 2), (20, 8)], [(12, 3), (31, 1)], [(11, 7), (29, 9), (21, 3), (9, 4)]]
    cut = bench.cut_pool(pool)
    assert [len(b) for b in cut] == [4, 3, 2]  # the planned row counts, the most rows first
    assert sorted(s for b in cut for s in b) == sorted(s for b in pool for s in b)  # every sample once
    # the shortest sources go to the batch with the most rows: each batch's sources are a run of the sorted ones
    assert cut == [[(9, 4), (10, 2), (11, 7), (12, 3)], [(20, 8), (21, 3), (29, 9)], [(30, 9), (31, 1)]]
    assert bench.cut_pool(pool[:1]) == [sorted(pool[0])]  # a pool of one batch keeps it


def test_pools_of_the_task_s_planned_batches_save_flops_within_the_token_budget(bench, pretrain_data, capsys):
    args = bench.parse_args(["--data", pretrain_data, "--config", "tiny", "--max-tokens", "2048", "--batches", "40",
                             "--pools", "1", "4", "--no-progress"])
    result = bench.measure_pools(args)
    assert result["batches"] > 5 and set(result["pools"]) == {1, 4}
    one, four = result["pools"][1], result["pools"][4]
    assert one["flops"] == 1.0 and 0 < one["budget"] <= 1.0  # the planned batches, under their token budget
    assert four["flops"] < 1.0  # the tiny config's AST masking spreads the lengths too
    assert four["budget"] <= one["budget"] and four["target"] > 0
    bench.report_pools(args, result)
    out = capsys.readouterr().out
    assert "| 1 | 1.0000 |" in out and "| 4 | " in out
