"""Every fine-tuning config sees every example: fairseq's default required_batch_size_multiple of
8 drops pairs from validation (12 became 8) and leaves no batch at all below 8 pairs."""
import json
import os

import pytest

from ..config.test_compose import compose
from ..conftest import synthetic_seq2seq_pair
from .test_task import make_task

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FINETUNE = os.path.join(REPO, "config", "finetune")
CONFIGS = sorted(n[:-5] for n in os.listdir(FINETUNE) if n.endswith(".yaml"))


def write_pairs(folder, n):
    import random

    folder.mkdir()
    rng = random.Random(n)
    for split in ("train", "valid"):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps(synthetic_seq2seq_pair(i, rng)) + "\n")
    return folder


def seen_ids(task, split, dataset_cfg):
    itr = task.get_batch_iterator(
        task.datasets[split], max_tokens=dataset_cfg.max_tokens, max_sentences=dataset_cfg.batch_size,
        max_positions=task.max_positions(), ignore_invalid_inputs=dataset_cfg.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=dataset_cfg.required_batch_size_multiple, seed=1,
    ).next_epoch_itr(shuffle=False)
    return sorted(i for batch in itr for i in batch["id"].tolist())


@pytest.mark.parametrize("name", CONFIGS)
def test_finetune_configs_batch_every_example(name, tmp_path, tokenizer_dir):
    cfg = compose(FINETUNE, name, [f"task.data={tmp_path}"])
    assert cfg.dataset.required_batch_size_multiple == 1
    for n in (5, 12):
        data = write_pairs(tmp_path / f"pairs{n}", n)
        task = make_task(data, tokenizer_dir)
        for split in ("train", "valid"):
            task.load_dataset(split)
            assert seen_ids(task, split, cfg.dataset) == list(range(n)), (name, split, n)


def test_fairseq_default_multiple_would_drop_pairs(tmp_path, tokenizer_dir):
    """The failure the configs avoid, shown with fairseq's default of 8."""
    cfg = compose(FINETUNE, "concode", [f"task.data={tmp_path}", "dataset.required_batch_size_multiple=8",
                                        "dataset.max_tokens=100000", "+dataset.batch_size=12"])
    task = make_task(write_pairs(tmp_path / "twelve", 12), tokenizer_dir)
    task.load_dataset("valid")
    assert len(seen_ids(task, "valid", cfg.dataset)) == 8
