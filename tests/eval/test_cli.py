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
