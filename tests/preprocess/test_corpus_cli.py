"""`ast-t5-preprocess` on published formats and hostile inputs, end to end: no hang, no abort,
no traceback, no leftover temporary shard; plan agrees with run; kill -9 then rerun resumes
with byte-identical output on Parquet and .jsonl.zst; the tokenizer sample is reproducible."""
import glob
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ast_t5_preprocess.cli import main

from ..conftest import STDLIB, STDLIB_FILES
from .test_cli import SMALL, assert_sigkill_then_rerun_matches, run_cli
from .test_readers import stack_table, write_parquet


def cli(*args, timeout=300):
    """Run the CLI in a subprocess (a hang fails the test instead of blocking it)."""
    return subprocess.run([sys.executable, "-m", "ast_t5_preprocess", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def stdlib_rows(names=STDLIB_FILES):
    return [(open(os.path.join(STDLIB, n), encoding="utf-8").read(), f"lib/{n}", "Python") for n in names]


def jsonl_zst(path, rows):
    import zstandard

    text = "".join(json.dumps({"content": c, "path": p, "lang": l}) + "\n" for c, p, l in rows)
    path.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_hostile_inputs_on_the_default_path_neither_hang_nor_abort(tmp_path):
    """FIFOs, symlink loops, dangling symlinks and a truncated .jsonl.gz, with the tokenizer
    trained in the same run (the path that used to hang or abort)."""
    corpus = tmp_path / "c"
    shutil.copytree(os.path.join(STDLIB, "json"), corpus / "json", ignore=shutil.ignore_patterns("__pycache__"))
    os.mkfifo(corpus / "pipe.py")
    os.mkfifo(corpus / "pipe.jsonl.zst")
    os.symlink("loop.py", corpus / "loop.py")
    os.symlink("nowhere.py", corpus / "dangling.py")
    rows = stdlib_rows(STDLIB_FILES[3:9])
    data = gzip.compress("".join(json.dumps({"content": c, "path": p}) + "\n" for c, p, _ in rows).encode())
    (corpus / "cut.jsonl.gz").write_bytes(data[: len(data) * 3 // 4])
    top_fifo = tmp_path / "top.py"
    os.mkfifo(top_fifo)
    out = tmp_path / "out"
    r = cli("run", corpus, "-o", out, top_fifo, *SMALL, "--workers", "2")  # an input after -o too
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    totals = json.load(open(out / "manifest.json"))["totals"]
    assert totals["skipped_special_file"] == 3 and totals["skipped_unreadable"] == 2
    assert totals["skipped_corrupt_stream"] == 1
    kept_from_gz = sum(1 for line in open(out / "spm.sample.jsonl") if "cut.jsonl.gz" in line)
    assert 1 <= kept_from_gz < len(rows)  # the records before the damage were read (and sampled)
    assert not glob.glob(str(out / "shards" / "*.tmp-*")) and not os.path.exists(out / "shards")


def test_plan_matches_the_shards_of_run(tmp_path, capsys):
    corpus = tmp_path / "c"
    shutil.copytree(os.path.join(STDLIB, "json"), corpus / "json", ignore=shutil.ignore_patterns("__pycache__"))
    write_parquet(corpus / "stack.parquet", stack_table())
    jsonl_zst(corpus / "more.jsonl.zst", stdlib_rows(STDLIB_FILES[3:8]))
    assert main(["plan", str(corpus), "--num-shards", "3", "--assignment", str(tmp_path / "a.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert "MB of code in 3 shard(s)" in printed
    rows = [line.split() for line in printed.splitlines()[1:4]]
    planned = {int(r[0]): int(r[1]) for r in rows}
    out = tmp_path / "out"
    run_cli(corpus, "-o", out, "--num-shards", "3", "--keep-shards")
    for sid in range(3):
        with open(out / "shards" / f"shard-{sid:05d}-of-00003" / "shard.json") as f:
            stats = json.load(f)["stats"]
        assert sum(s["files_seen"] for s in stats.values()) == planned[sid]
    lines = [json.loads(x) for x in open(tmp_path / "a.jsonl")]
    assert len(lines) == sum(planned.values()) and {x["shard"] for x in lines} == {0, 1, 2}
    code_bytes = sum(x["bytes"] for x in lines)
    assert f"{code_bytes / 1e6:.2f} MB of code" in printed


def test_resume_after_sigkill_on_parquet_and_zst(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    files = sorted(glob.glob(os.path.join(STDLIB, "email", "*.py")))
    rows = [(open(f, encoding="utf-8").read(), "email/" + os.path.basename(f), "Python") for f in files]
    write_parquet(corpus / "a.parquet", stack_table(rows[::2]), row_group_size=3)
    jsonl_zst(corpus / "b.jsonl.zst", rows[1::2])
    assert_sigkill_then_rerun_matches(corpus, tmp_path)


def test_ctrl_c_is_one_line_and_leaves_no_temporary_shard(tmp_path):
    corpus = tmp_path / "c"
    shutil.copytree(os.path.join(STDLIB, "email"), corpus, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    for _ in range(3):  # a loaded machine may let a run finish before the signal lands: try again
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen([sys.executable, "-m", "ast_t5_preprocess", "run", str(corpus), "-o", str(out),
                                 *SMALL, "--workers", "2", "--num-shards", "500"],  # a pool per shard: slow to finish
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not glob.glob(str(out / "shards" / "*")):
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        # a run that finished (its manifest written) before the signal landed exits 0, or, when the
        # signal lands while the interpreter finalizes (its handlers reset to the default), dies of it
        # (-2): either way Ctrl-C arrived too late, so try again
        finished = proc.returncode in (0, -signal.SIGINT) and (out / "manifest.json").exists()
        if not finished:
            break
    if finished:
        pytest.skip("three runs finished before Ctrl-C arrived: " + err[-500:])
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1].startswith("ast-t5-preprocess: interrupted")
    assert not glob.glob(str(out / "shards" / "*.tmp-*"))


def test_tokenizer_sample_is_reproducible_and_order_free(tmp_path):
    from ast_t5_preprocess.inputs import Document
    from ast_t5_preprocess.tokenizer import sample_documents

    rng = random.Random(3)
    docs = [Document(f"k{i}", "python", content="x = 1\n" * rng.randrange(1, 200)) for i in range(300)]
    read = lambda d: (d.content.encode(), d.content, None)
    budget = 20000
    a, _ = sample_documents(docs, read, budget, seed=7)
    shuffled = docs[:]
    rng.shuffle(shuffled)
    b, _ = sample_documents(shuffled, read, budget, seed=7)
    c, _ = sample_documents(docs, read, budget, seed=8)
    assert [d.key for d in a] == [d.key for d in b] and [d.key for d in a] != [d.key for d in c]
    total = sum(d.num_bytes for d in a)
    assert budget - 6 * 200 < total <= budget  # fills the budget up to about one document
    # it is exactly the lowest priorities: every document left out ranks after the last one in
    prios = sorted(d.priority for d in a)
    from ast_t5_preprocess.inputs import stable_hash

    out = [stable_hash(f"spm:7:{d.key}") for d in docs if d.key not in {x.key for x in a}]
    assert min(out) > prios[-1]


def test_sample_file_is_in_the_manifest(code_corpus, tmp_path):
    out = tmp_path / "out"
    run_cli(code_corpus, "-o", out, "--spm-sample-mb", "0.1")
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["tokenizer"]["sample"] == "spm.sample.jsonl"
    lines = [json.loads(x) for x in open(out / manifest["tokenizer"]["sample"])]
    head, sampled = lines[0], lines[1:]
    assert head["budget_bytes"] == 100000 and head["input_sentence_size"] > 0
    assert head["spm_sha256"] == manifest["tokenizer"]["spm_sha256"]
    assert head["documents"] == len(sampled) and 0 < head["bytes"] <= 100000
    assert all(os.path.isfile(x["where"]) for x in sampled)
    assert len(sampled) < manifest["totals"]["files_kept"]  # a sample, not the corpus
    tok = json.load(open(out / "tokenizer.json"))
    assert tok["train_options"]["input_sentence_size"] == head["input_sentence_size"]
    # a list left beside another tokenizer (e.g. --spm-model later) is not referenced
    from ast_t5_preprocess.tokenizer import sample_list_of

    assert sample_list_of(str(out), head["spm_sha256"]) == "spm.sample.jsonl"
    assert sample_list_of(str(out), "0" * 64) is None


def test_progress_bar_on_a_terminal_and_log_lines_otherwise(caplog):
    import io
    import logging

    from ast_t5_preprocess.inputs import Document
    from ast_t5_preprocess.progress import InputCounter, Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    docs = [Document(f"k{i}", "python", content="x", src_bytes=10 ** 6) for i in range(10)]
    for stream in (Tty(), io.StringIO()):
        counter = InputCounter()
        with caplog.at_level(logging.INFO, logger="ast_t5_preprocess.progress"):
            caplog.clear()
            bar = Progress("shard 1/1", 10 ** 7, counter, log_interval=1e-9, stream=stream)
            for i, _ in enumerate(counter.count(docs)):
                bar.update(kept=i % 2 == 0, num_bytes=500_000)
            bar.close()
        if isinstance(stream, Tty):
            shown = stream.getvalue()
            assert "shard 1/1" in shown and "100%" in shown and "10 files" in shown and "MB/s" in shown
            assert not caplog.records
        else:
            assert stream.getvalue() == ""
            last = caplog.records[-1].getMessage()
            assert "10 files (5 kept), 10.0/10.0 MB of input (100.0%)" in last
            assert "MB/s of code" in last and "ETA 0m00s" in last
            assert "(10.0%)" in caplog.records[0].getMessage()  # one line per interval, not only at the end
