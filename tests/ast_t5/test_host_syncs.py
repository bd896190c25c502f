"""No host reads inside an update (issue 11, item 6).

On a GPU every read of a device value by the host (``.item()``, ``bool(t)``, ``.tolist()``,
``.cpu()``, ``nonzero``, boolean-mask indexing, one-argument ``torch.where``...) waits for all
queued kernels, so the CPU stops running ahead of the GPU. These tests run one real update of the
tiny model on the CPU (our task's train_step, i.e. criterion forward + backward, then our
optimizers' clipping and step) with those entry points patched to record every call, and fail
on any. fairseq's own Trainer code around it (logging, grad-norm checks) is outside this scope;
`benchmarks/bench_train.py --device cuda --profile` lists what remains there on a GPU.
"""
import os
import sys
import traceback
import types

import numpy as np
import pytest
import torch

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH_DIR))
import bench_train  # noqa: E402

from ast_t5.data.span_corruption_dataset import collate_seq2seq  # noqa: E402

TINY = ("common.cpu=true", "common.log_interval=1000000", "++model.attention_dropout=0.0")
TENSOR_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
                "nonzero", "masked_select", "unique")
TORCH_READS = ("nonzero", "masked_select", "argwhere", "unique")
OUR_PACKAGES = ("ast_t5", "fused_ops")


class HostReads:
    """Records every call of a host-reading tensor entry point while ``active``."""

    def __init__(self):
        self.active = False
        self.calls = []

    def _record(self, name):
        """Records calls made by our own code (the frame that called the entry point lies in our
        packages); reads inside torch or fairseq are theirs (e.g. torch's CPU AdamW reads its
        CPU step counter, which never waits for a GPU)."""
        if self.active:
            caller = traceback.extract_stack()[-3]  # [-1] here, [-2] the wrapper
            path = caller.filename.replace(os.sep, "/")
            if any(f"/{pkg}/" in path for pkg in OUR_PACKAGES) and "/tests/" not in path:
                self.calls.append(f"{name} at {path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{caller.lineno}")
            elif "/tests/" in path:
                self.calls.append(f"{name} at test")

    def install(self, monkeypatch):
        for name in TENSOR_READS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        for name in TORCH_READS:
            monkeypatch.setattr(torch, name, self._wrap("torch." + name, getattr(torch, name)))
        original_where, original_getitem = torch.where, torch.Tensor.__getitem__

        def where(*args, **kwargs):
            if len(args) + len(kwargs) == 1:
                self._record("torch.where(condition)")
            return original_where(*args, **kwargs)

        def getitem(tensor, index):
            parts = index if isinstance(index, tuple) else (index,)
            if any(torch.is_tensor(p) and p.dtype == torch.bool for p in parts):
                self._record("boolean-mask indexing")
            return original_getitem(tensor, index)

        monkeypatch.setattr(torch, "where", where)
        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)

    def _wrap(self, name, fn):
        def wrapper(*args, **kwargs):
            self._record(name)
            return fn(*args, **kwargs)
        return wrapper


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return bench_train.write_task_dir(str(tmp_path_factory.mktemp("task")), 512)


def _sample(seed=0, batch=4):
    """A collated batch as the task's data loader gives it (padded sources, language ids)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(batch):
        src = torch.randint(4, 400, (30 - 4 * i,), generator=g)
        tgt = torch.randint(4, 400, (9 + i,), generator=g)
        src[-1] = tgt[-1] = 2
        items.append({"id": i, "source": src, "target": tgt})
    sample = collate_seq2seq(items, pad=1, eos=2)
    sample["language"] = torch.zeros(batch, dtype=torch.long)
    return sample


def _one_update(task_dir, overrides, monkeypatch, budget=False):
    _, task, trainer, _ = bench_train.build_trainer("tiny", task_dir, list(TINY) + list(overrides))
    if budget:  # the budget reads the items' segment sizes from the training set
        task.datasets["train"] = types.SimpleNamespace(sizes=np.full(16, 40, dtype=np.int64))
    model, criterion, optimizer = trainer.model, trainer.criterion, trainer.optimizer
    sample = _sample()
    reads = HostReads()
    reads.install(monkeypatch)
    reads.active = True
    try:
        loss, sample_size, log = task.train_step(sample, model, criterion, optimizer, update_num=0)
        optimizer.clip_grad_norm(1.0)
        optimizer.step()
        optimizer.zero_grad()
    finally:
        reads.active = False
    assert torch.is_tensor(loss) and loss.requires_grad
    return reads.calls, task


@pytest.mark.parametrize("optimizer", ["adamw_scale", "adamw_scale foreach", "t5_adafactor", "adamw_torch"])
def test_one_update_reads_nothing_back_to_the_host(task_dir, monkeypatch, optimizer):
    """adamw_scale: its fused kernel (the default on CPU and CUDA); "foreach": its foreach ops."""
    switch = [] if optimizer.startswith("adamw_scale") else [f"optimizer._name={optimizer}"]
    if optimizer == "adamw_scale foreach":
        switch += ["++optimizer.fused=false"]
    if optimizer == "t5_adafactor":
        switch += ["~optimizer.adam_betas"]
    calls, _ = _one_update(task_dir, switch, monkeypatch)
    assert calls == [], f"host reads inside the update: {calls}"


def test_token_budget_update_reads_host_copies_only(task_dir, monkeypatch):
    calls, task = _one_update(task_dir, ["++task.max_train_tokens=100000"], monkeypatch, budget=True)
    assert calls == [], f"host reads inside the update: {calls}"
    assert task._token_budget.tokens == 4 * 40  # the sizes were read (from the host copy of the ids)
    assert task._token_budget.source_tokens == sum(30 - 4 * i for i in range(4))


def test_the_counter_sees_a_host_read(task_dir, monkeypatch):
    """The patched entry points do catch a read: the mask test outside a training forward."""
    reads = HostReads()
    reads.install(monkeypatch)
    reads.active = True
    mask = torch.zeros(2, 3, dtype=torch.bool)
    if mask.any():
        pass
    mask.nonzero()
    torch.ones(3)[mask[0]]
    reads.active = False
    assert [c.split(" at ")[0] for c in reads.calls] == ["__bool__", "nonzero", "boolean-mask indexing"]


def test_subset_sample_keeps_the_host_copies_in_step():
    from ast_t5.tasks import token_budget

    sample = _sample()
    keep = np.array([True, False, True, False])
    sub = token_budget.subset_sample(sample, keep, pad=1)
    assert sub["host"]["id"].tolist() == [0, 2] == sub["id"].tolist()
    assert sub["host"]["src_lengths"].tolist() == sub["net_input"]["src_lengths"].tolist() == [30, 22]
