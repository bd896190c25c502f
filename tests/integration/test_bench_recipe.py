"""benchmarks/bench_recipe.py: the real `fairseq-hydra-train` run it times (CPU mode, as CI runs
it) and how it reads fairseq's records and OOM recoveries."""
import json

import pytest

from ..conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_recipe")


def test_cpu_run_reports_steady_state_figures_from_the_trainers_records(bench, pretrain_data, tmp_path, capsys,
                                                                         monkeypatch):
    """Relative --data and --work as gpu_check gives them (the trainer runs inside --work: on an H200,
    2026-11-27, a relative corpus path failed there with 'dict.txt not found')."""
    import os

    out = tmp_path / "recipe.json"
    log = tmp_path / "recipe.log"
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--device", "cpu", "--data", os.path.relpath(pretrain_data, tmp_path), "--updates", "8",
                       "--log-interval", "2", "--work", "work", "--json", str(out), "--log", str(log)]) == 0
    payload = json.loads(out.read_text())
    summary, records = payload["summary"], payload["records"]
    assert summary["exit"] == 0 and summary["last_update"] == 8 and summary["oom_recoveries"] == 0
    assert len(records) == 4 and summary["steady_records"] == 3
    assert [r["num_updates"] for r in records] == [2.0, 4.0, 6.0, 8.0]
    assert summary["ups"] > 0 and summary["wps"] > 0 and summary["tflops"] is not None
    assert summary["mfu"] is None  # CPU: no peak
    assert "config-name tiny" in " ".join(payload["command"]) and "checkpoint.no_save=true" in payload["command"]
    assert "[train_inner]" in log.read_text()
    assert "OOM recoveries 0" in capsys.readouterr().out
    assert summary["recompile_limit_hits"] == 0


def test_the_time_limit_counts_the_corpus_preprocessing_too(bench, tmp_path, monkeypatch, capsys):
    """gpu_check gives the step --timeout seconds in all: the corpus gets them, the trainer what the
    corpus left of them; a run stopped there still reports what it logged (in the log as it came, in
    the JSON), its whole process group is killed (DataLoader and compile workers), and it exits 124,
    timeout(1)'s status, which a resumed gpu_check call reruns."""
    import os
    import sys
    import time

    given = []

    def slow_corpus(work, vocab_size, workers, timeout):
        given.append(timeout)
        time.sleep(1.0)
        return str(tmp_path / "corpus")
    record = '[train_inner] {"epoch": 1, "ups": "2.5", "num_updates": "2"}'
    pid_file = tmp_path / "worker.pid"
    # a trainer that logs one record, starts a worker of its own, then hangs
    trainer = (f"import subprocess, sys, time; print({record!r}, flush=True); "
               f"w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
               f"open({str(pid_file)!r}, 'w').write(str(w.pid)); time.sleep(120)")
    monkeypatch.setattr(bench, "default_corpus", slow_corpus)
    monkeypatch.setattr(bench, "train_command", lambda args, data, save_dir: [sys.executable, "-c", trainer])
    log, out = tmp_path / "recipe.log", tmp_path / "recipe.json"
    t0 = time.perf_counter()
    assert bench.main(["--device", "cpu", "--timeout", "6", "--work", str(tmp_path / "work"), "--log", str(log),
                       "--json", str(out)]) == 124
    assert time.perf_counter() - t0 < 30
    assert len(given) == 1 and 5.0 <= given[0] <= 6.0, given
    printed = capsys.readouterr()
    assert "stopped at --timeout 6 s after 2 of 12 updates" in printed.err
    assert record in log.read_text() and "stopped at --timeout 6 s" in log.read_text()
    summary = json.loads(out.read_text())["summary"]
    assert summary["timed_out"] and summary["exit"] is None and summary["last_update"] == 2
    worker = int(pid_file.read_text())
    for _ in range(50):  # the kill reaches the worker; it is reaped by init
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with open(f"/proc/{worker}/stat") as f:  # a zombie left to init is dead too
            assert f.read().split()[2] == "Z"


def test_records_and_oom_recoveries_are_read_from_the_output(bench):
    compiled = ("2026-11-23 10:00:00 | INFO | ast_t5.models.ast_t5_model | torch.compile: new graph for batch "
                "128 x source 512 / target 128 (training) in {} s ({} s in all)")
    text = "\n".join([
        compiled.format(41.5, 41.5),
        '2026-11-23 10:00:00 | INFO | train_inner | [train_inner] {"epoch": 1, "loss": "9.1", "ups": "2.5", "num_updates": "20"}',
        "2026-11-23 10:00:01 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass",
        '2026-11-23 10:00:02 | INFO | train_inner | [train_inner] {"epoch": 1, "loss": "8.9", "ups": "3.5", "mfu": "41.2", "num_updates": "40"}',
        compiled.format(20.0, 61.5),
        '2026-11-23 10:00:03 | INFO | train_inner | [train_inner] {"epoch": 1, "loss": "8.8", "ups": "1.0", "mfu": "11.0", "num_updates": "60"}',
        '2026-11-23 10:00:04 | INFO | train_inner | [train_inner] {"epoch": 1, "loss": "8.7", "ups": "4.5", "mfu": "43.0", "num_updates": "80"}',
        "| INFO | [train] {not json",
        "W1123 10:00:05 convert_frame.py:1994] [1/8] torch._dynamo hit config.recompile_limit (8)",
    ])
    records = bench.parse_records(text)
    assert [r["ups"] for r in records] == [2.5, 3.5, 1.0, 4.5] and records[0]["epoch"] == 1.0
    assert [r["compiles"] for r in records] == [1, 0, 1, 0]
    summary = bench.summarize(records, bench.count_ooms(text), total_gib=80.0)
    # steady state: records 2 and 4 (after the first, without a compilation in their interval)
    assert summary["steady_records"] == 2 and summary["records_with_compiles"] == 2
    assert summary["oom_recoveries"] == 1 and summary["ups"] == 4.0 and summary["mfu"] == pytest.approx(42.1)
    assert summary["last_update"] == 80 and summary["peak_gib"] is None
    assert bench.compile_totals(text) == (2, 61.5)
    assert bench.compile_cache(text) == (0, 0)  # no graph looked up in inductor's cache (aot_eager, eager)
    # a rerun on the same machine: the model notes the graphs inductor loaded from its on-disk cache
    rerun = "\n".join([compiled.format(6.2, 6.2) + "; inductor's cache: 2 of 2 graphs loaded",
                       compiled.format(30.0, 36.2) + "; inductor's cache: 1 of 2 graphs loaded"])
    assert bench.compile_totals(rerun) == (2, 36.2) and bench.compile_cache(rerun) == (3, 4)
    assert bench.recompile_limit_hits(text) == 1 and bench.recompile_limit_hits(text.replace("hit config", "")) == 0


def test_usage_errors(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--config", "no_such_config"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--updates", "4", "--log-interval", "4"])


def test_bench_train_builds_the_recipes_model_shapes_on_cuda(bench, pretrain_data, tmp_path, monkeypatch):
    """bench_train.py's GPU vocabulary is the dictionary of the corpus bench_recipe.py makes on CUDA
    (its pieces plus the preprocessing's default sentinels, which bench_recipe does not change), so
    that after the recipe on one machine the trainer's compilation loads the recipe's graphs from
    inductor's cache. A preprocessed dictionary holds exactly pieces + sentinels symbols."""
    from fairseq.data import Dictionary

    from ast_t5_preprocess.tokenizer import DEFAULT_NUM_SENTINELS

    bench_train = load_benchmark("bench_train")
    assert len(Dictionary.load(f"{pretrain_data}/dict.txt")) == 800 + 32  # the fixture's --vocab-size, --num-sentinels
    commands = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: commands.append(cmd) or
                        bench.subprocess.CompletedProcess(cmd, 0, "", ""))
    bench.default_corpus(str(tmp_path), bench.DEFAULTS["cuda"][4], 1)
    assert "--vocab-size" in commands[0] and "--num-sentinels" not in commands[0]  # the default sentinels
    assert bench_train.SHAPES["cuda"][1] == bench.DEFAULTS["cuda"][4] + DEFAULT_NUM_SENTINELS == 32256
