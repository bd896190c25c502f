"""A newcomer's first commands through the real `fairseq-hydra-train`, from an empty working
directory and without --config-dir: the config is found by name, nothing is written to the cwd,
no Hydra deprecation warning from our configs, a finished run says so, and a wrong config name or
key is one line with exit 2 before anything trains."""
import os
import subprocess
import sys

from .conftest import train_env

HYDRA_TRAIN = [sys.executable, "-m", "fairseq_cli.hydra_train"]


def run(cwd, *args):
    return subprocess.run(HYDRA_TRAIN + list(args), cwd=cwd, env=train_env(), capture_output=True,
                          text=True, timeout=600)


def test_first_day(pretrain_data, tmp_path):
    cwd, save_dir = tmp_path / "cwd", tmp_path / "ck"
    cwd.mkdir()
    args = ["--config-name", "tiny", f"task.data={pretrain_data}", f"checkpoint.save_dir={save_dir}",
            "optimization.max_update=3", "checkpoint.save_interval_updates=3"]
    first = run(cwd, *args)
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-3000:]
    assert "num_updates 3" in log or '"num_updates": "3"' in log
    assert os.listdir(cwd) == [], "training wrote into the working directory"
    for noise in ("_group_", "automatic_schema_matching", "changes_to_job_working_dir", "version_base"):
        assert noise not in first.stderr.split("@hydra.main")[-1], noise

    again = run(cwd, *args)  # the same command again: done, no update 4
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training is complete" in again.stderr and "num_updates 4" not in again.stdout

    typo = run(cwd, "--config-name", "tinyy", f"task.data={pretrain_data}")
    assert typo.returncode == 2 and "did you mean tiny?" in typo.stderr
    key = run(cwd, *args, "+optimization.max_updates=5")
    assert key.returncode == 2 and "did you mean max_update?" in key.stderr
    for result in (typo, key):
        assert len([l for l in result.stderr.splitlines() if "error" in l]) == 1
        assert "Traceback" not in result.stderr
    assert os.listdir(cwd) == []
