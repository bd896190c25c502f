"""task.batch_pool: training batches cut again by their masked lengths in pools of adjacent batches
(ast_t5/data/batch_pools.py), on the task's real data and iterator, and through fairseq-hydra-train."""
import os
import subprocess
import sys

import pytest
import torch

from ast_t5.data.batch_pools import PooledEpochBatchIterator, cut_order

from .conftest import train_env
from .test_pretrain import HYDRA_TRAIN, json_logs, tiny_args

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def make_iterator(data, pool, num_shards=1, shard_id=0, max_tokens=1024):
    """The pre-training task's training iterator for the tiny config, as fairseq's trainer asks for it."""
    from fairseq import tasks, utils

    sys.path.insert(0, BENCHMARKS)
    from bench_train import compose

    cfg = compose("tiny", [f"task.data={data}", "dataset.num_workers=0", "common.tensorboard_logdir=null",
                           f"task.batch_pool={pool}"])
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", epoch=1)
    return task, task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, max_positions=task.max_positions(),
        ignore_invalid_inputs=True, seed=1, num_shards=num_shards, shard_id=shard_id, num_workers=0, epoch=1)


def ids(batch):
    return batch["id"].tolist() if batch else []


def padded_source(batches):
    return sum(b["net_input"]["src_tokens"].numel() for b in batches if b)


def test_cut_order_sorts_the_pool_and_keeps_its_row_counts():
    keys = [(30, 9), (10, 2), (20, 8), (12, 3), (31, 1), (10, 2)]
    assert cut_order([2, 4], keys) == [[1, 5, 3, 2], [0, 4]]  # ties in pool order; most rows first
    assert cut_order([3, 0, 3], keys) == [[1, 5, 3], [2, 0, 4], []]
    with pytest.raises(ValueError, match="a pool of 6 samples cannot be cut into batches of \\[2, 2\\] rows"):
        cut_order([2, 2], keys)


def test_an_epoch_in_pools_trains_every_sample_once_in_batches_of_the_planned_sizes(pretrain_data):
    _, plain = make_iterator(pretrain_data, 1)
    task, pooled = make_iterator(pretrain_data, 4)
    assert not isinstance(plain, PooledEpochBatchIterator) and isinstance(pooled, PooledEpochBatchIterator)
    planned = list(plain.next_epoch_itr(shuffle=False))
    got = list(pooled.next_epoch_itr(shuffle=True))
    assert len(pooled) == len(plain) == len(planned) == len(got) > 8
    # the same samples, each once, in batches of the same sizes
    assert sorted(i for b in got for i in ids(b)) == sorted(i for b in planned for i in ids(b))
    assert sorted(len(ids(b)) for b in got) == sorted(len(ids(b)) for b in planned)
    # within each pool, sorted by masked source length: less padding in all
    assert padded_source(got) < padded_source(planned)
    # fairseq's dummy batch: the first planned batch, collated
    assert ids(pooled.first_batch) == [int(i) for i in pooled.frozen_batches[0][0]]
    # a validation split is not pooled
    task.load_dataset("valid", epoch=1)
    valid = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=1024,
                                    max_positions=task.max_positions(), ignore_invalid_inputs=True)
    assert not isinstance(valid, PooledEpochBatchIterator)


def test_a_run_resumed_in_the_middle_of_a_pool_continues_with_the_same_batches(pretrain_data):
    _, whole = make_iterator(pretrain_data, 4)
    reference = [ids(b) for b in whole.next_epoch_itr(shuffle=True)]
    _, first = make_iterator(pretrain_data, 4)
    itr = first.next_epoch_itr(shuffle=True)
    done = [ids(next(itr)) for _ in range(6)]  # one pool and a half
    state = first.state_dict()
    assert state["iterations_in_epoch"] == 6 and done == reference[:6]
    _, resumed = make_iterator(pretrain_data, 4)
    resumed.load_state_dict(state)
    rest = resumed.next_epoch_itr(shuffle=True)
    assert rest.n == 6 and len(rest) == len(reference)
    assert [ids(b) for b in rest] == reference[6:]
    assert resumed.end_of_epoch()


def test_ranks_run_as_many_batches_and_share_the_epoch_s_samples(pretrain_data):
    _, plain = make_iterator(pretrain_data, 1)
    everything = sorted(i for b in plain.next_epoch_itr(shuffle=False) for i in ids(b))
    ranks = [make_iterator(pretrain_data, 4, num_shards=2, shard_id=r)[1] for r in (0, 1)]
    epochs = [list(r.next_epoch_itr(shuffle=True)) for r in ranks]
    assert len(epochs[0]) == len(epochs[1]) == len(ranks[0]) == len(ranks[1])
    assert len(epochs[0]) % 4 == 0  # each rank's pools filled up to 4 batches with empty ones
    assert sorted(i for e in epochs for b in e for i in ids(b)) == everything


def test_fairseq_hydra_train_with_batch_pools(pretrain_data, tmp_path):
    run = subprocess.run(HYDRA_TRAIN + tiny_args(
        pretrain_data, tmp_path / "ckpt", "optimization.max_update=12", "common.log_interval=4",
        "task.batch_pool=4"), cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "training batches cut by masked lengths in pools of 4" in run.stdout + run.stderr
    logs = json_logs(run.stdout)
    assert logs and all(torch.isfinite(torch.tensor(float(r["loss"]))) for r in logs)


def test_a_pool_below_one_is_a_one_line_error():
    from ast_t5.tasks.ast_t5_pretraining import AstT5PretrainingConfig, validate_config

    cfg = AstT5PretrainingConfig(data="x", batch_pool=0, seed=1)
    with pytest.raises(ValueError, match="batch_pool=0 must be >= 1"):
        validate_config(cfg)
