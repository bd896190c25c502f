"""ast_t5.eval.humaneval (+ harness): package data, prompts, canonical solutions, wrong answers."""
import gzip
import json

import pytest

from ast_t5.eval.harness import evaluate, summarize
from ast_t5.eval.humaneval import build_humaneval_tasks, humaneval_task, load_humaneval
from ast_t5.eval.postprocess import BODY_INDENT
from ast_t5.eval.sandbox import Sandbox, SandboxConfig
from ast_t5.eval.tasks import DEFAULT_SENTINEL, EvalInputError

NUM_PROBLEMS = 164
WORKERS = 2


def test_package_data(humaneval_problems):
    assert len(humaneval_problems) == NUM_PROBLEMS
    expected = [f"HumanEval/{i}" for i in range(NUM_PROBLEMS)]
    assert [p["task_id"] for p in humaneval_problems] == expected


def test_prompts(humaneval_problems):
    problem = humaneval_problems[0]
    ast_t5 = humaneval_task(problem, "ast_t5")
    assert ast_t5.prompt == problem["prompt"].strip() + "\n" + BODY_INDENT + DEFAULT_SENTINEL
    assert humaneval_task(problem, "ast_t5", "<sen001>").prompt.endswith("\n    <sen001>")
    plain = humaneval_task(problem, "plain")
    assert plain.prompt == problem["prompt"] == plain.prefix
    assert plain.suffix.endswith("check(has_close_elements)\n")
    with pytest.raises(EvalInputError):
        humaneval_task(problem, "chat")


@pytest.mark.slow
def test_all_canonical_solutions_pass(humaneval_problems):
    tasks = build_humaneval_tasks(humaneval_problems, "plain")
    completions = {p["task_id"]: [p["canonical_solution"]] for p in humaneval_problems}
    results = evaluate(tasks, completions, Sandbox(SandboxConfig()), WORKERS, progress=False)
    failures = [(r.task_id, r.detail) for r in results if not r.passed]
    assert failures == []
    assert [r.task_id for r in results] == [t.task_id for t in tasks]  # deterministic order


def as_model_output(body: str, dedent_all: bool) -> str:
    """A canonical body written the way an AST-T5 model emits it after the sentinel."""
    lines = body.rstrip("\n").split("\n")
    if dedent_all:
        lines = [line[len(BODY_INDENT):] if line.startswith(BODY_INDENT) else line
                 for line in lines]
    else:
        lines[0] = lines[0][len(BODY_INDENT):]
    return DEFAULT_SENTINEL + "\n".join(lines) + "<extra_id_1>def unrelated(): pass"


def test_ast_t5_style_completions_are_repaired(humaneval_problems):
    problems = humaneval_problems[:6]
    tasks = build_humaneval_tasks(problems, "ast_t5")
    completions = {p["task_id"]: [as_model_output(p["canonical_solution"], False),
                                  as_model_output(p["canonical_solution"], True)]
                   for p in problems}
    results = evaluate(tasks, completions, Sandbox(SandboxConfig()), WORKERS, progress=False)
    assert [(r.task_id, r.detail) for r in results if not r.passed] == []
    summary = summarize("humaneval", tasks, results, [1, 2, 10])
    assert summary["pass@1"] == 1.0 and summary["pass@2"] == 1.0 and "pass@10" not in summary


def test_wrong_completions_fail(humaneval_problems):
    problems = humaneval_problems[:5]
    tasks = build_humaneval_tasks(problems, "plain")
    wrong = ["    return None\n", "    pass\n", "    return (\n", "    while True:\n        pass\n"]
    completions = {p["task_id"]: wrong for p in problems}
    results = evaluate(tasks, completions, Sandbox(SandboxConfig(timeout_s=1.0)), WORKERS,
                       progress=False)
    assert not any(r.passed for r in results)
    assert {r.status for r in results} == {"failed", "timed out"}
    summary = summarize("humaneval", tasks, results, [1, 4])
    assert summary["pass@1"] == 0.0 and summary["tasks_solved"] == 0
    assert summary["status"]["timed out"] == len(problems)


def test_load_from_file_and_errors(tmp_path, humaneval_problems):
    path = tmp_path / "few.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        for problem in humaneval_problems[:3]:
            handle.write(json.dumps(problem) + "\n")
    assert len(load_humaneval(str(path))) == 3
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(EvalInputError, match="lacks"):
        load_humaneval(str(broken))
    with pytest.raises(EvalInputError, match="no such file"):
        load_humaneval(str(tmp_path / "missing.jsonl"))
