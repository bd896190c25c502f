"""The whole chain on real outputs: ast-t5-preprocess -> pre-training (config/pretrain/tiny.yaml,
2 updates) -> generation, Hugging Face export and fine-tuning (ast_t5_seq2seq) from that
checkpoint, whose tokenizer is found through the pre-training run's task.data."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from ast_t5.generate import AstT5Generator
from ast_t5.hf.export import export_to_hf

from .test_finetune_train import REPO, finetune


PRETRAIN_FILES = ("textwrap.py", "heapq.py", "bisect.py", "colorsys.py", "shlex.py")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(checkpoint_last.pt, preprocessed data dir) of a 2-update tiny pre-training run."""
    from ast_t5_preprocess.cli import main as preprocess

    root = tmp_path_factory.mktemp("pretrain")
    (root / "src").mkdir()
    for name in PRETRAIN_FILES:
        shutil.copyfile(os.path.join(sysconfig.get_paths()["stdlib"], name), root / "src" / name)
    data = root / "bin"
    assert preprocess(["run", str(root / "src"), "-o", str(data), "--vocab-size", "600",
                       "--num-sentinels", "32", "--max-tokens", "256"]) == 0
    cwd = root / "cwd"
    cwd.mkdir()
    cmd = [sys.executable, "-c", "from fairseq_cli.hydra_train import cli_main; cli_main()",
           "--config-dir", os.path.join(REPO, "config", "pretrain"), "--config-name", "tiny",
           f"task.data={data}", "task.max_source_positions=256", "task.max_target_positions=256",
           "optimization.max_update=2", "dataset.max_tokens=2048",
           f"checkpoint.save_dir={root / 'ck'}"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")  # tiny models: one thread is fastest
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return root / "ck" / "checkpoint_last.pt", data


@pytest.mark.slow
def test_generate_and_export_a_pretraining_checkpoint(pretrained, tmp_path):
    checkpoint, _ = pretrained
    generator = AstT5Generator.from_checkpoint(str(checkpoint), device="cpu", max_new_tokens=6)
    filled = generator.infill("def f(x):\n    <extra_id_0>\n")
    assert filled.startswith("def f(x):\n    ") and filled.endswith("\n")
    export_to_hf(str(checkpoint.parent), str(tmp_path / "hf"))  # includes the logits self-check
    assert (tmp_path / "hf" / "model.safetensors").exists()


@pytest.mark.slow
def test_finetune_from_a_pretraining_checkpoint(pretrained, tmp_path, seq2seq_data):
    checkpoint, data = pretrained
    save_dir, train, valid = finetune(tmp_path, "java2cs", seq2seq_data, data, checkpoint)
    assert train and valid and "valid_bleu" in valid[-1]
    assert (save_dir / "checkpoint_best.pt").exists()
