"""ast_t5.eval.mbpp: loading an MBPP-format file, prompts, execution."""
import json

import pytest

from ast_t5.eval.harness import evaluate
from ast_t5.eval.jsonl_io import read_jsonl
from ast_t5.eval.mbpp import build_mbpp_tasks, load_mbpp, render_doctest, signature_prompt
from ast_t5.eval.postprocess import AST_T5_BODY, MBPP_PLAIN
from ast_t5.eval.sandbox import Sandbox, SandboxConfig
from ast_t5.eval.tasks import DEFAULT_SENTINEL, EvalInputError

RECORDS = [
    {"task_id": 11, "prompt": "Write a function to add two numbers.",
     "code": "import re\ndef helper():\n    pass\ndef add(a, b=0):\n    return a + b\n",
     "test_list": ["assert add(1, 2) == 3", "assert add(0) == 0", "assert not add(0, 0)"]},
    {"task_id": "circle", "text": "Write a function for the area of a circle.",
     "code": "def area(r):\n    return math.pi * r * r\n",
     "test_setup_code": "SCALE = 1", "test_imports": ["import math"],
     "test_list": ["assert math.isclose(area(1) * SCALE, 3.14159, rel_tol=1e-3)"]},
    {"text": "Write a function that reverses a string.",
     "test_list": ["assert rev('ab') == 'ba'", "assert rev('') == ''"]},
]
GOOD = {
    "11": "<extra_id_0>return a + b",
    "circle": "<extra_id_0>return math.pi * r ** 2",
    "2": "def rev(s):\n    return s[::-1]\n\nassert rev('x') == 'x'\n",
}
BAD = {"11": "<extra_id_0>return a - b", "circle": "<extra_id_0>return r",
       "2": "def rev(s):\n    return s\n"}


@pytest.fixture
def mbpp_file(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in RECORDS))
    return str(path)


def test_render_doctest():
    assert render_doctest("assert f(1, 'a') == [2]") == ">>> f(1, 'a')\n[2]"
    assert render_doctest("assert f(3)") == ">>> f(3)\nTrue"
    assert render_doctest("assert not f(3)") == ">>> f(3)\nFalse"
    assert render_doctest("assert set(f(1)) == {1}") == ">>> set(f(1))\n{1}"
    assert render_doctest("assert f(1) < 2") == ">>> f(1) < 2\nTrue"


def test_signature_prompt_keeps_only_the_tested_function():
    prompt = signature_prompt(RECORDS[0]["code"], RECORDS[0]["prompt"], RECORDS[0]["test_list"])
    assert prompt.startswith("def add(a, b=0):\n    \"\"\"Write a function to add two numbers.")
    assert ">>> add(1, 2)\n    3\n" in prompt and ">>> add(0, 0)\n    False" in prompt
    assert "return" not in prompt and "import" not in prompt and "helper" not in prompt
    assert signature_prompt("def other():\n    pass\n", "x", ["assert add(1) == 1"]) is None
    assert signature_prompt("def broken(:", "x", ["assert broken() == 1"]) is None


def test_tasks_and_fallback(mbpp_file, caplog):
    tasks = build_mbpp_tasks(load_mbpp(mbpp_file), "ast_t5")
    assert [t.task_id for t in tasks] == ["11", "circle", "2"]
    assert tasks[0].prompt.endswith("\n    " + DEFAULT_SENTINEL)
    assert tasks[0].postprocess == AST_T5_BODY
    assert tasks[1].prefix.startswith("SCALE = 1\nimport math\ndef area(r):")
    assert tasks[2].postprocess == MBPP_PLAIN  # no reference code: plain prompt, counted
    assert "1 of 3 tasks" in caplog.text
    plain = build_mbpp_tasks(load_mbpp(mbpp_file), "plain")
    expected = '"""\nWrite a function to add two numbers.\nassert add(1, 2) == 3'
    assert plain[0].prompt.startswith(expected)


@pytest.mark.parametrize("style", ["ast_t5", "plain"])
def test_execution(mbpp_file, style):
    tasks = build_mbpp_tasks(load_mbpp(mbpp_file), style)
    if style == "plain":
        good = {"11": "def add(a, b=0):\n    return a + b\n",
                "circle": "def area(r):\n    return math.pi * r ** 2\n", "2": GOOD["2"]}
    else:
        good = GOOD
    completions = {task_id: [good[task_id], BAD[task_id]] for task_id in good}
    results = evaluate(tasks, completions, Sandbox(SandboxConfig()), 2, progress=False)
    assert [r.passed for r in results] == [True, False] * 3, [r.detail for r in results]


@pytest.mark.parametrize("record, message", [
    ({"test_list": ["assert f()"]}, "'prompt' or 'text'"),
    ({"text": "x", "test_list": []}, "test_list"),
    ({"text": "x", "test_list": ["assert f()"], "test_imports": "import math"}, "test_imports"),
    ({"text": "x", "test_list": ["assert f()"], "code": 3}, "'code'"),
])
def test_invalid_records(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(EvalInputError, match=message):
        load_mbpp(str(path))


def test_duplicate_ids_and_bad_json(tmp_path):
    path = tmp_path / "dup.jsonl"
    record = {"task_id": 1, "text": "x", "test_list": ["assert True"]}
    path.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(EvalInputError, match="duplicate"):
        load_mbpp(str(path))
    path.write_text(json.dumps(record) + "\n{oops\n")
    with pytest.raises(EvalInputError, match=r"dup.jsonl:2: invalid JSON"):
        load_mbpp(str(path))


def test_surrogates_and_forged_output_on_the_shipped_samples(tmp_path, mbpp_file, capsys):
    """The CLI on these samples: a lone surrogate is written out; a printed PASS is no pass."""
    from ast_t5.eval.cli import main

    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(json.dumps(r) + "\n" for r in [
        {"task_id": 11, "completion": "<extra_id_0>return '\ud800'"},
        {"task_id": "circle", "completion": "<extra_id_0>print('PASS')\n    return 0.0"},
        {"task_id": 2, "completion": GOOD["2"]},
    ]))
    output = tmp_path / "out.jsonl"
    assert main(["mbpp", "--data", mbpp_file, "--completions", str(completions), "--output",
                 str(output), "--no-progress", "--workers", "2"]) == 0
    records = {r["task_id"]: r for r in read_jsonl(str(output))}
    assert records["11"]["completion"] == "<extra_id_0>return '\ud800'"
    assert not records["11"]["passed"] and records["11"]["detail"].startswith("test failed")
    assert not records["circle"]["passed"] and records["2"]["passed"]
    assert "pass@1            0.3333" in capsys.readouterr().out
