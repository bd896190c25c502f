"""scripts/slurm_preprocess.sh on Parquet + .jsonl.zst inputs, with a stand-in `sbatch` that runs
each job (and each array task, with SLURM_ARRAY_TASK_ID) in place: the three stages must give
the same bytes as one `run`."""
import os
import subprocess
import sys

from ..conftest import STDLIB_FILES
from .test_cli import run_cli, tree_digest
from .test_corpus_cli import jsonl_zst, stdlib_rows
from .test_readers import stack_table, write_parquet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_SBATCH = r'''#!/usr/bin/env python3
import os, re, subprocess, sys
args = sys.argv[1:]
wrap = next(a.split("=", 1)[1] for a in args if a.startswith("--wrap=")) if any(
    a.startswith("--wrap=") for a in args) else args[args.index("--wrap") + 1]
array = next((a.split("=", 1)[1] for a in args if a.startswith("--array=")), None)
with open(os.environ["SBATCH_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
ids = [None]
if array:
    lo, hi = map(int, re.match(r"(\d+)-(\d+)", array).groups())
    ids = list(range(lo, hi + 1))[::-1]  # any order
for i in ids:
    env = dict(os.environ, **({"SLURM_ARRAY_TASK_ID": str(i)} if i is not None else {}))
    subprocess.run(["bash", "-c", wrap], check=True, env=env, stdout=sys.stderr)  # like --output
print(len(open(os.environ["SBATCH_LOG"]).readlines()))
'''


def test_slurm_example_on_published_formats(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = stdlib_rows(STDLIB_FILES)
    write_parquet(corpus / "a.parquet", stack_table(rows[::2]), row_group_size=3)
    jsonl_zst(corpus / "b.jsonl.zst", rows[1::2])
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(FAKE_SBATCH)
    (bindir / "sbatch").chmod(0o755)
    (bindir / "ast-t5-preprocess").write_text(f'#!/bin/sh\nexec {sys.executable} -m ast_t5_preprocess "$@"\n')
    (bindir / "ast-t5-preprocess").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SBATCH_LOG=str(tmp_path / "sbatch.log"),
               SPM_ARGS="--vocab-size 1200 --num-sentinels 32", RUN_ARGS="--no-progress --max-tokens 256",
               CPUS="1", PLAN="1")
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "slurm_preprocess.sh"), str(out), "3",
                        str(corpus / "a.parquet"), str(corpus / "b.jsonl.zst")],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "submitted: tokenizer 1, shards 2 (array of 3), merge 3" in r.stdout
    assert "3 shard(s)" in r.stdout  # the plan
    log = open(tmp_path / "sbatch.log").read().splitlines()
    assert "--dependency=afterok:1" in log[1] and "--array=0-2%64" in log[1]
    run_cli(corpus / "a.parquet", corpus / "b.jsonl.zst", "-o", tmp_path / "ref", "--num-shards", "3")
    assert tree_digest(out) == tree_digest(tmp_path / "ref")
