"""ast_t5.eval.cli end to end: completions files, checkpoints via a fake generator, text metrics."""
import json
import sys
import types

import pytest

from ast_t5.eval.cli import main
from ast_t5.eval.jsonl_io import read_jsonl

COMMON = ["--no-progress", "--workers", "2", "--timeout", "2"]


def error_lines(stderr: str):
    """The CLI's error lines; there must be no traceback."""
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("ast-t5-eval: error:")]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


@pytest.fixture
def samples(tmp_path, humaneval_problems):
    """Two tasks, four samples each: two right, then two wrong."""
    records = []
    for problem in humaneval_problems[:2]:
        for completion in [problem["canonical_solution"]] * 2 + ["    return None\n"] * 2:
            records.append({"task_id": problem["task_id"], "completion": completion})
    return write_jsonl(tmp_path / "samples.jsonl", records)


def test_humaneval_with_completions(tmp_path, samples, capsys):
    output = tmp_path / "results.jsonl"
    code = main(["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit", "2",
                 "--k", "1", "2", "10", "--output", str(output)] + COMMON)
    assert code == 0
    printed = capsys.readouterr().out
    assert "pass@1            0.5000" in printed
    assert f"pass@2            {1 - 1 / 6:.4f}" in printed and "pass@10" not in printed
    assert "isolation" in printed and "guard" in printed
    records = read_jsonl(str(output))
    assert [(r["task_id"], r["sample_index"], r["passed"]) for r in records] == [
        (f"HumanEval/{t}", s, s < 2) for t in range(2) for s in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "samples.jsonl"]


def test_num_samples_takes_the_first_n(samples, capsys):
    assert main(["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit", "2",
                 "--num-samples", "2", "--k", "1"] + COMMON) == 0
    assert "pass@1            1.0000" in capsys.readouterr().out


def test_write_prompts_only(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    assert main(["humaneval", "--write-prompts", str(prompts), "--limit", "3"]) == 0
    records = read_jsonl(str(prompts))
    assert [r["task_id"] for r in records] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(r["prompt"].endswith("\n    <extra_id_0>") for r in records)


@pytest.mark.parametrize("content, message", [
    ('{"task_id": "HumanEval/0", "completion": "x"}\n{bad\n', "samples.jsonl:2: invalid JSON"),
    ('{"task_id": "HumanEval/0", "completion": "    return 1\\n"}\n', "fewer than 1 completion"),
    ('{"task_id": "HumanEval/0"}\n', "needs 'task_id' and a string 'completion'"),
])
def test_bad_completions_give_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "samples.jsonl"
    path.write_text(content)
    assert main(["humaneval", "--completions", str(path), "--limit", "2"] + COMMON) == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and message in errors[0]


def test_no_source_is_an_error(capsys):
    assert main(["humaneval", "--limit", "1"]) == 2
    assert "--completions FILE or --checkpoint DIR" in capsys.readouterr().err


def test_checkpoint_without_generator(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ast_t5.generate", None)  # import fails, whatever is installed
    assert main(["humaneval", "--checkpoint", str(tmp_path), "--limit", "1"] + COMMON) == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "ast_t5.generate.load_completion_fn" in errors[0]


def test_checkpoint_with_a_generator(monkeypatch, tmp_path, capsys, humaneval_problems):
    bodies = {p["task_id"]: p["canonical_solution"] for p in humaneval_problems}
    by_prompt = {p["prompt"].strip(): p["task_id"] for p in humaneval_problems}
    seen = {}

    def load_completion_fn(checkpoint_dir, **gen_opts):
        seen.update(gen_opts, checkpoint=checkpoint_dir)

        def complete(prompts, num_samples):
            outputs = []
            for prompt in prompts:
                head = prompt[:-len("\n    <extra_id_0>")]
                body = bodies[by_prompt[head]]
                outputs.append(["<extra_id_0>" + body[4:]] * num_samples)
            return outputs
        return complete

    fake = types.ModuleType("ast_t5.generate")
    fake.load_completion_fn = load_completion_fn
    monkeypatch.setitem(sys.modules, "ast_t5.generate", fake)
    assert main(["humaneval", "--checkpoint", str(tmp_path), "--limit", "3", "--batch-size", "2",
                 "--k", "1"] + COMMON) == 0
    assert "pass@1            1.0000" in capsys.readouterr().out
    assert seen["checkpoint"] == str(tmp_path)
    assert seen["beam"] == 10 and seen["length_penalty"] == 0.5 and seen["sampling"] is False
    assert set(seen) == {"checkpoint", "beam", "sampling", "temperature", "top_p",
                         "max_new_tokens", "length_penalty", "seed"}


def test_mbpp_command(tmp_path, capsys):
    data = write_jsonl(tmp_path / "mbpp.jsonl", [
        {"task_id": 1, "text": "Add.", "code": "def add(a, b):\n    return a + b\n",
         "test_list": ["assert add(1, 2) == 3"]},
    ])
    done = write_jsonl(tmp_path / "c.jsonl", [{"task_id": 1, "completion": "return a + b"}])
    assert main(["mbpp", "--data", data, "--completions", done, "--k", "1"] + COMMON) == 0
    assert "pass@1            1.0000" in capsys.readouterr().out
    assert main(["mbpp", "--data", str(tmp_path / "none.jsonl"), "--completions", done]) == 2


def test_text_metrics_command(tmp_path, capsys):
    hyp = tmp_path / "hyp.txt"
    ref = tmp_path / "ref.txt"
    hyp.write_text("return a + b\nreturn  x\n")
    ref.write_text("return a + b\nreturn y\n")
    output = tmp_path / "scores.json"
    command = ["text-metrics", "--hyp", str(hyp), "--ref", str(ref), "--output", str(output)]
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert "exact_match     50.0000" in printed and "bleu" in printed
    assert json.loads(output.read_text())["examples"] == 2
    ref.write_text("only one line\n")
    assert main(["text-metrics", "--hyp", str(hyp), "--ref", str(ref)]) == 2


def test_surrogate_completion_is_written_out(tmp_path, humaneval_problems, capsys):
    """A lone surrogate (valid in JSON, not in UTF-8) used to crash the writer and lose all."""
    samples = write_jsonl(tmp_path / "s.jsonl", [
        {"task_id": "HumanEval/0", "completion": "    return '\ud800'\n"},
        {"task_id": "HumanEval/0", "completion": humaneval_problems[0]["canonical_solution"]},
    ])
    output = tmp_path / "results.jsonl"
    assert main(["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit",
                 "1", "--output", str(output)] + COMMON) == 0
    records = read_jsonl(str(output))
    assert records[0]["completion"] == "    return '\ud800'\n" and not records[0]["passed"]
    assert records[1]["passed"]
    assert not (tmp_path / "results.jsonl.partial").exists()


def test_finished_results_survive_an_interruption(tmp_path, samples, monkeypatch, capsys):
    import ast_t5.eval.cli as cli
    real_evaluate = cli.evaluate

    def evaluate_then_die(tasks, completions, sandbox, workers, progress, on_result):
        real_evaluate(tasks[:1], completions, sandbox, workers, progress, on_result)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "evaluate", evaluate_then_die)
    output = tmp_path / "results.jsonl"
    with pytest.raises(KeyboardInterrupt):
        main(["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit", "2",
              "--output", str(output)] + COMMON)
    assert not output.exists()
    partial = read_jsonl(str(output) + ".partial")
    assert sorted((r["task_id"], r["sample_index"]) for r in partial) == [
        ("HumanEval/0", s) for s in range(4)]


def test_a_failing_sandbox_run_is_retried_or_marked(samples, monkeypatch, capsys):
    from ast_t5.eval.sandbox import Sandbox
    real_run_tests = Sandbox.run_tests
    calls = {"n": 0}

    def flaky(self, program, *args, **kwargs):
        calls["n"] += 1
        if "return None" in program:
            raise OSError(12, "Cannot allocate memory")  # every wrong sample, every time
        if calls["n"] % 2:
            raise BlockingIOError(11, "Resource temporarily unavailable")  # once, then fine
        return real_run_tests(self, program, *args, **kwargs)

    monkeypatch.setattr(Sandbox, "run_tests", flaky)
    assert main(["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit",
                 "2", "--workers", "1", "--k", "1"] + COMMON[3:] + ["--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "pass@1            0.5000" in printed and "sandbox error 4" in printed


def test_pass_at_k_warnings_only_for_ks_the_user_asked_for(samples, capsys):
    command = ["humaneval", "--completions", samples, "--prompt-style", "plain", "--limit", "2"]
    assert main(command + COMMON) == 0
    log = capsys.readouterr().err
    assert "skipped" not in log
    assert log.count("sandbox isolation:") == 1
    assert main(command + ["--k", "1", "10"] + COMMON) == 0
    assert "pass@10 skipped" in capsys.readouterr().err


def test_text_metrics_pairs_jsonl_records(tmp_path, capsys):
    targets = ["if x:\n    return 1\nreturn 2", "return 3", "while True:\n    pass"]
    test = write_jsonl(tmp_path / "test.jsonl", [
        {"source": f"s{i}", "target": t} for i, t in enumerate(targets)])
    generations = [[targets[0]], ["return 4"], [targets[2].replace("\n", "\n ")]]
    hyp = write_jsonl(tmp_path / "hyp.jsonl", [
        {"source": f"s{i}", "generations": g} for i, g in enumerate(generations)])
    assert main(["text-metrics", "--generations", hyp, "--references", test]) == 0
    printed = capsys.readouterr().out
    assert "examples        3" in printed and f"exact_match     {200 / 3:.4f}" in printed
    with_targets = write_jsonl(tmp_path / "gen_with_targets.jsonl", [
        {"source": f"s{i}", "target": t, "generations": g}
        for i, (t, g) in enumerate(zip(targets, generations))])
    assert main(["text-metrics", "--generations", with_targets]) == 0
    assert f"exact_match     {200 / 3:.4f}" in capsys.readouterr().out


@pytest.mark.parametrize("case, message", [
    ("count", "cannot be paired"), ("order", "differs in field 'source'"),
    ("line-file", "use --generations"), ("field", "no string field 'target'"),
])
def test_text_metrics_refuses_what_it_cannot_pair(tmp_path, capsys, case, message):
    test = write_jsonl(tmp_path / "test.jsonl", [{"source": "a", "target": "x\ny"},
                                                 {"source": "b", "target": "z"}])
    records = [{"source": "a", "generations": ["x\ny"]}, {"source": "b", "generations": ["z"]}]
    if case == "count":
        records = records[:1]
    elif case == "order":
        records = records[::-1]
    hyp = write_jsonl(tmp_path / "hyp.jsonl", records)
    command = ["text-metrics", "--generations", hyp, "--references", test]
    if case == "line-file":
        command = ["text-metrics", "--hyp", hyp, "--ref", test]
    elif case == "field":
        command += ["--ref-field", "target"]
        write_jsonl(tmp_path / "test.jsonl", [{"source": "a"}, {"source": "b"}])
    assert main(command) == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and message in errors[0], errors


KILL_THE_EVALUATOR = """    return None
import importlib.machinery, importlib.util, os, signal, time
for _ in range(150):
    if os.path.exists({pidfile!r}):
        break
    time.sleep(0.01)
evaluator = int(open({pidfile!r}).read())
fresh = lambda name: importlib.util.module_from_spec(  # a top-level "def" ends a completion
    importlib.machinery.BuiltinImporter.find_spec(name))
for attack in (lambda: os.kill(evaluator, signal.SIGKILL),
               lambda: os.killpg(os.getpgid(evaluator), signal.SIGKILL),
               lambda: fresh("_signal").pidfd_send_signal(fresh("posix").pidfd_open(evaluator),
                                                          signal.SIGKILL)):
    try:
        attack()
    except Exception:
        pass
"""


def test_a_sample_cannot_kill_the_evaluator(tmp_path):
    """The evaluator itself is the target (its pid is handed to the sample in a file), without
    namespaces, where the earlier harness died of the fresh-module pidfd route (rc -9)."""
    import os
    import subprocess

    pidfile = tmp_path / "evaluator.pid"
    samples = write_jsonl(tmp_path / "s.jsonl", [
        {"task_id": "HumanEval/0", "completion": KILL_THE_EVALUATOR.format(pidfile=str(pidfile))}])
    output = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "ast_t5.eval.cli", "humaneval", "--completions", samples,
               "--prompt-style", "plain", "--limit", "1", "--output", str(output),
               "--no-namespaces"] + COMMON
    evaluator = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    pidfile.write_text(str(evaluator.pid))
    stdout, stderr = evaluator.communicate(timeout=120)
    assert evaluator.returncode == 0, stderr[-2000:]
    assert "pass@1            0.0000" in stdout
    assert [r["passed"] for r in read_jsonl(str(output))] == [False]
