"""End to end: config/finetune/*.yaml through fairseq-hydra-train (a subprocess, another cwd),
starting from a weights-only checkpoint with ast_t5_seq2seq (ast_t5/tasks/seq2seq_finetuning.py)."""
import json
import math
import os
import subprocess
import sys

import torch

from ast_t5.generate import AstT5Generator
from ast_t5.generation.checkpoints import TOKENIZER_STATE_KEY


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(REPO, "config", "finetune")
TINY_MODEL = ["model._name=t5_v11_tiny", "++model.embed_dim=32", "++model.ffn_dim=64",
              "++model.num_heads=4", "++model.head_dim=8", "++model.encoder_layers=2",
              "++model.decoder_layers=2", "model.dropout=0.0", "model.attention_dropout=0.0"]
UPDATES = 6


def finetune(tmp_path, config, data, tokenizer, start, *extra, model_args=TINY_MODEL):
    """Run fairseq-hydra-train for UPDATES updates; returns (save_dir, train logs, valid logs)."""
    save_dir, cwd = tmp_path / "ck", tmp_path / "cwd"
    cwd.mkdir()
    cmd = [sys.executable, "-c", "from fairseq_cli.hydra_train import cli_main; cli_main()",
           "--config-dir", CONFIG_DIR, "--config-name", config, f"task.data={data}",
           f"task.tokenizer={tokenizer}", "common.cpu=true", "common.bf16=false",
           "common.log_format=json", "common.log_interval=1", *model_args,
           f"optimization.max_update={UPDATES}", "optimization.lr=[0.001]",
           "lr_scheduler.warmup_updates=2", "dataset.max_tokens=1024", "dataset.num_workers=0",
           "task.eval_max_new_tokens=10",
           "dataset.validate_interval_updates=3", "checkpoint.save_interval_updates=3",
           f"checkpoint.save_dir={save_dir}", f"checkpoint.finetune_from_model={start}", *extra]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")  # tiny models: one thread is fastest
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "loading pretrained model from" in log
    assert set(os.listdir(cwd)) <= {"hydra_train.log"}, "training wrote outputs into the cwd"

    def records(kind):
        tag = f"][{kind}][INFO] - "
        return [json.loads(line.split(tag, 1)[1]) for line in log.splitlines() if tag in line]

    return save_dir, records("train_inner"), records("valid")


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def test_finetune_from_a_checkpoint_validates_with_generation(tmp_path, seq2seq_data, tokenizer_dir,
                                                              tiny_checkpoint_dir):
    start = os.path.join(str(tiny_checkpoint_dir), "checkpoint.pt")
    save_dir, train, valid = finetune(tmp_path, "bugs2fix", seq2seq_data, tokenizer_dir, start)
    losses = [float(r["loss"]) for r in train]
    assert len(losses) == UPDATES and all(math.isfinite(x) for x in losses)
    assert len(valid) >= 2
    for record in valid:
        assert 0.0 <= float(record["valid_exact_match"]) <= 100.0
        assert 0.0 <= float(record["valid_bleu"]) <= 100.0
    assert "valid_best_exact_match" in valid[-1]  # best_checkpoint_metric=exact_match
    assert (save_dir / "checkpoint_best.pt").exists() and (save_dir / "checkpoint_last.pt").exists()

    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["task_state"][TOKENIZER_STATE_KEY]["num_sentinels"] == 32  # self-contained
    before, after = weights(start), state["model"]
    assert not torch.equal(before["decoder.output_projection.weight"],
                           after["decoder.output_projection.weight"])

    generator = AstT5Generator.from_checkpoint(str(save_dir), device="cpu", max_new_tokens=5)
    assert isinstance(generator.translate("def f(x):\n\treturn x\n"), str)


def test_frozen_parameters_do_not_change(tmp_path, seq2seq_data, tokenizer_dir,
                                         tiny_checkpoint_dir):
    start = os.path.join(str(tiny_checkpoint_dir), "checkpoint.pt")
    save_dir, train, valid = finetune(tmp_path, "code_summarization", seq2seq_data, tokenizer_dir,
                                      start, "task.freeze_encoder=true",
                                      "task.freeze_embeddings=true")
    assert "valid_best_bleu" in valid[-1]  # best_checkpoint_metric=bleu
    before, after = weights(start), weights(save_dir / "checkpoint_last.pt")
    frozen = [k for k in before if k.startswith("encoder.") or k == "decoder.embed_tokens.weight"]
    trained = [k for k in before if k.startswith("decoder.layers.")]
    assert frozen and trained
    for name in frozen:  # loaded from the start checkpoint and never updated
        assert torch.equal(before[name], after[name]), name
    changed = [name for name in trained if not torch.equal(before[name], after[name])]
    assert len(changed) == len(trained)
