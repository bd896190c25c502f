"""The verdict cannot be forged: clean exits past the guard and always-equal objects score 0.

Every attack runs as a completion through `evaluate` (full sandbox) on HumanEval problems and on
the MBPP-format samples of test_mbpp.py. Under the earlier harness, whose verdict was the child's
exit status 0, each forged-exit route and the always-equal object scored a pass.
"""
import pytest

from ast_t5.eval.harness import evaluate
from ast_t5.eval.humaneval import build_humaneval_tasks
from ast_t5.eval.mbpp import build_mbpp_tasks
from ast_t5.eval.sandbox import PASSED, Sandbox, run_program
from .test_mbpp import RECORDS

FRESH_EXIT = ("import importlib.machinery as _m, importlib.util as _u\n"
              "_exit = _u.module_from_spec(_m.BuiltinImporter.find_spec('posix'))._exit\n")
# route -> (function body, top-level code after the function)
FORGED_EXITS = {
    "fresh-posix-exit-on-load": ("    return None\n", FRESH_EXIT + "_exit(0)\n"),
    "fresh-posix-exit-in-call": ("    " + FRESH_EXIT.replace("\n", "\n    ") + "_exit(0)\n", ""),
    "systemexit-in-finally": ("    try:\n        return None\n    finally:\n"
                              "        raise SystemExit(0)\n", ""),
    "atexit-fresh-exit": ("    return None\n", FRESH_EXIT + "import atexit\n"
                          "atexit.register(_exit, 0)\n"),
    "thread-fresh-exit": ("    return None\n", FRESH_EXIT + "import threading, time\n"
                          "threading.Thread(target=lambda: (time.sleep(0.2), _exit(0))).start()\n"),
    "forged-verdict-on-every-fd": ("    return None\n", FRESH_EXIT + "import os, json\n"
                                   "line = json.dumps({'loaded': True, 'verdict': {'passed': True,"
                                   " 'reason': ''}, 'result': True}) + '\\n'\n"
                                   "for fd in range(1, 64):\n    try:\n"
                                   "        os.write(fd, line.encode())\n"
                                   "    except OSError:\n        pass\n"
                                   "os.write(1, b'PASSED all tests\\n')\n_exit(0)\n"),
}
ALWAYS_EQUAL = (
    "    class Anything(float):\n"
    "        def __eq__(self, other):\n            return True\n"
    "        def __ne__(self, other):\n            return False\n"
    "        __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
    "        def __bool__(self):\n            return False\n"
    "        def __hash__(self):\n            return 0\n"
)
EQUAL_RETURNS = {"always-equal": "    return Anything(0)\n",
                 "always-equal-in-a-list": "    return [Anything(0)]\n"}
MBPP_FUNCTIONS = {"11": "add", "circle": "area", "2": "rev"}


def humaneval_runs(problems, body, trailer):
    tasks = build_humaneval_tasks(problems, "plain")
    return tasks, {p["task_id"]: [body + trailer] for p in problems}


def mbpp_runs(tmp_path, body, trailer):
    import json
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in RECORDS))
    from ast_t5.eval.mbpp import load_mbpp
    tasks = build_mbpp_tasks(load_mbpp(str(path)), "plain")
    return tasks, {task_id: [f"def {name}(*args, **kwargs):\n" + body + trailer]
                   for task_id, name in MBPP_FUNCTIONS.items()}


@pytest.fixture(params=["humaneval", "mbpp"])
def benchmark_runs(request, tmp_path, humaneval_problems):
    if request.param == "humaneval":
        return lambda body, trailer: humaneval_runs(humaneval_problems[:2], body, trailer)
    return lambda body, trailer: mbpp_runs(tmp_path, body, trailer)


@pytest.mark.parametrize("route", sorted(FORGED_EXITS))
def test_forged_exits_score_zero(benchmark_runs, make_config, route):
    tasks, completions = benchmark_runs(*FORGED_EXITS[route])
    for task in tasks:  # post-processing keeps the whole attack
        assert task.clean(completions[task.task_id][0]).strip() in completions[task.task_id][0]
        assert "_exit" in task.clean(completions[task.task_id][0]) or "finally" in route
    results = evaluate(tasks, completions, Sandbox(make_config("full")), 2, progress=False)
    assert [r.status for r in results] == ["failed"] * len(tasks), [r.detail for r in results]
    assert all(r.detail for r in results)


def test_the_fresh_module_route_really_exits_cleanly(make_config):
    """The route ends the program's process with status 0 mid-program, past every layer."""
    program = "print('before', flush=True)\n" + FRESH_EXIT + "_exit(0)\nprint('after')\n"
    result = run_program(program, make_config("full"))
    assert result.returncode == 0 and result.stdout == "before\n"
    assert result.status == "failed"


@pytest.mark.parametrize("returned", sorted(EQUAL_RETURNS))
def test_always_equal_objects_score_zero(benchmark_runs, make_config, returned):
    tasks, completions = benchmark_runs(ALWAYS_EQUAL + EQUAL_RETURNS[returned], "")
    results = evaluate(tasks, completions, Sandbox(make_config("full")), 2, progress=False)
    assert [r.status for r in results] == ["failed"] * len(tasks)
    typed = [r for r in results if "only exact built-in types" in r.detail]
    assert len(typed) >= len(tasks) - 1, [r.detail for r in results]  # MBPP "circle" multiplies


def test_always_equal_object_fools_the_asserts_it_reaches(make_config, humaneval_problems):
    """Control: run in one process, the object passes HumanEval/0's asserts."""
    tasks, completions = humaneval_runs(humaneval_problems[:1],
                                        ALWAYS_EQUAL + EQUAL_RETURNS["always-equal"], "")
    program = tasks[0].program(tasks[0].clean(completions[tasks[0].task_id][0]))
    assert run_program(program, make_config("full")).status == PASSED


def test_reason_is_the_harness_not_the_program(make_config, humaneval_problems):
    body = ("    import sys\n    print('PASSED: all tests', file=sys.stderr)\n"
            "    raise ValueError('all tests passed')\n")
    tasks, completions = humaneval_runs(humaneval_problems[:1], body, "")
    result = evaluate(tasks, completions, Sandbox(make_config("full")), 1, progress=False)[0]
    assert result.status == "failed"
    assert result.detail == ("calling has_close_elements raised ValueError: "
                             "'all tests passed'")


def test_mutated_arguments_and_builtin_types_cross_the_boundary(make_config):
    program = ("def f(xs, d):\n    xs.append(len(xs))\n    d['k'] = (1, {2}, b'x', 1j)\n"
               "    return {(1, 2): frozenset({3}), 'n': None, 'r': range(3), 'b': bytearray(2)}\n")
    tests = ("xs, d = [7], {}\nout = f(xs, d)\n"
             "assert xs == [7, 1] and d == {'k': (1, {2}, b'x', 1j)}\n"
             "assert out == {(1, 2): frozenset({3}), 'n': None, 'r': range(3), 'b': bytearray(2)}\n"
             "assert type(out[(1, 2)]) is frozenset and type(d['k']) is tuple\n")
    result = Sandbox(make_config("full")).run_tests(program, tests)
    assert result.status == PASSED, result.detail


def test_modules_only_the_program_imported_reach_the_tests(make_config):
    """As in one shared namespace, tests may use a standard module the solution imported."""
    sandbox = Sandbox(make_config("full"))
    program = "import math\nimport collections.abc as abc\ndef f():\n    return 1.0\n"
    tests = "assert math.isclose(f(), 1.0) and abc.Sequence is not None\n"
    assert sandbox.run_tests(program, tests).status == PASSED
    assert sandbox.run_tests("def f():\n    return 2.0\n", tests).status == "failed"


def test_a_large_reply_crosses_the_boundary(make_config):
    program = "def f():\n    return 'x' * (16 << 20)\n"
    tests = "assert len(f()) == 16 << 20\n"
    result = Sandbox(make_config("full", timeout_s=10)).run_tests(program, tests)
    assert result.status == PASSED, result.detail
