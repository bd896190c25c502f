"""Host work between updates (issue 11): what the trainer does after an update's last host
synchronization and before the next forward, while a GPU has nothing queued.

- Under bf16 the tasks step fairseq's FP16Optimizer with one batched copy of the master weights
  into the model and release the master gradients (ast_t5/optim/mixed_precision.py): checked
  to give exactly fairseq's own step (weights, masters, optimizer state, losses), with gradient
  accumulation too, and to dispatch no per-parameter copy or zeroing op;
- the model's ``train()`` and ``set_num_updates()``, which fairseq calls before every forward,
  do what nn.Module's and fairseq's do, with one cheap walk over the modules.
Everything runs through fairseq's real Trainer on the CPU; the dispatched ops are counted with a
TorchDispatchMode (on a GPU each is a kernel launch)."""
import os
import sys

import pytest
import torch

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH_DIR))
import bench_train  # noqa: E402
from bench_host_overhead import OpCounter  # noqa: E402

from ast_t5.optim.mixed_precision import fp16_optimizer_step, takes_fast_step  # noqa: E402

TINY = ("common.cpu=true", "common.log_interval=1000000", "++model.attention_dropout=0.0",
        "lr_scheduler.warmup_updates=2")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return bench_train.write_task_dir(str(tmp_path_factory.mktemp("task")), 512)


def _trainer(task_dir, *overrides):
    return bench_train.build_trainer("tiny", task_dir, list(TINY) + list(overrides))[2]


def _fairseq_step(optimizer, model, update_num):
    optimizer.step()  # FairseqTask.optimizer_step, what fairseq alone would run


OPTIMIZERS = {
    "adamw_scale": (),
    "adamw_torch": ("optimizer._name=adamw_torch",),
    "t5_adafactor": ("optimizer._name=t5_adafactor", "~optimizer.adam_betas"),
}


@pytest.mark.parametrize("micro_batches,optimizer", [(1, "adamw_scale"), (2, "adamw_scale"), (1, "adamw_torch"),
                                                     (1, "t5_adafactor")])
def test_the_bf16_step_equals_fairseqs_own(task_dir, micro_batches, optimizer):
    batches = bench_train.make_batches(6 * micro_batches, 3, 40, 12, 512, seed=3)
    settings = ("common.bf16=true", *OPTIMIZERS[optimizer])
    ours, theirs = _trainer(task_dir, *settings), _trainer(task_dir, *settings)
    assert takes_fast_step(ours.optimizer)
    theirs.task.optimizer_step = _fairseq_step
    for i in range(6):
        group = batches[i * micro_batches:(i + 1) * micro_batches]
        a, b = ours.train_step(group), theirs.train_step(group)
        assert float(a["loss"]) == float(b["loss"])
        assert all(p32.grad is None for p32 in ours.optimizer.fp32_params)  # released after the step
        assert all(p32.grad is not None for p32 in theirs.optimizer.fp32_params)
    for p, q in zip(ours.model.parameters(), theirs.model.parameters()):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q)
    for m, n in zip(ours.optimizer.fp32_params, theirs.optimizer.fp32_params):
        assert torch.equal(m, n)
    for p, m in zip(ours.optimizer.fp16_params, ours.optimizer.fp32_params):
        assert torch.equal(p, m.to(torch.bfloat16))  # each weight is its master rounded
    sa, sb = ours.optimizer.fp32_optimizer.optimizer.state, theirs.optimizer.fp32_optimizer.optimizer.state
    for m, n in zip(ours.optimizer.fp32_params, theirs.optimizer.fp32_params):
        assert sa[m].keys() == sb[n].keys() and sa[m]
        for key in sa[m]:
            a, b = sa[m][key], sb[n][key]
            assert torch.equal(a, b) if torch.is_tensor(a) else a == b, key
    # the weights moved: the comparison is not between two untouched models
    initial = _trainer(task_dir, *settings)
    assert any(not torch.equal(p, q) for p, q in zip(ours.model.parameters(), initial.model.parameters()))


def test_the_bf16_step_dispatches_no_per_parameter_copy_or_zeroing(task_dir):
    trainer = _trainer(task_dir, "common.bf16=true")
    batches = bench_train.make_batches(3, 3, 40, 12, 512, seed=4)
    trainer.train_step([batches[0]])
    n_params = len(trainer.optimizer.fp32_params)
    assert n_params > 10
    opt = trainer.optimizer
    trainer.task.train_step(batches[1], trainer.model, trainer.criterion, opt, 1)
    opt.clip_grad_norm(1.0)
    with OpCounter() as step_ops:
        trainer.task.optimizer_step(opt, trainer.model, 1)
    with OpCounter() as zero_ops:
        trainer.zero_grad()
    assert step_ops.ops["copy_"] == 0 and step_ops.ops["_foreach_copy_"] == 1, step_ops.ops
    assert sum(zero_ops.ops.values()) == 0, zero_ops.ops
    # fairseq's own step: one copy_ per parameter, then one zero_ per master gradient
    trainer.task.train_step(batches[2], trainer.model, trainer.criterion, opt, 2)
    opt.clip_grad_norm(1.0)
    with OpCounter() as step_ops:
        opt.step()
    with OpCounter() as zero_ops:
        trainer.zero_grad()
    assert step_ops.ops["copy_"] == n_params and zero_ops.ops["zero_"] == n_params


@pytest.mark.parametrize("compiled", [False, True])
def test_the_bf16_step_hands_the_gradient_factor_to_adamw_scale(task_dir, compiled, monkeypatch):
    """Under bf16 our step hands the wrapper's gradient factor (sample-size normalization times the
    clip coefficient, a device tensor once clipping ran) to adamw_scale, and fairseq's multiply pass
    over the fp32 gradients never runs; the factor is reset after each update, and the weights equal
    fairseq's own multiply-then-step, bit for bit, with the compiled update too."""
    from fairseq.optim.fairseq_optimizer import FairseqOptimizer

    multiplied = []
    original = FairseqOptimizer.multiply_grads
    monkeypatch.setattr(FairseqOptimizer, "multiply_grads", lambda self, c: multiplied.append(c) or original(self, c))
    settings = ("common.bf16=true", "optimization.clip_norm=0.05",  # small enough to clip every update
                *(("+optimizer.compiled=true",) if compiled else ()))
    batches = bench_train.make_batches(4, 3, 40, 12, 512, seed=5)
    ours, theirs = _trainer(task_dir, *settings), _trainer(task_dir, *settings)
    theirs.task.optimizer_step = _fairseq_step
    for batch in batches:
        a = ours.train_step([batch])
        assert multiplied == [] and ours.optimizer._multiply_factor == 1.0
        b = theirs.train_step([batch])
        assert len(multiplied) == 1 and torch.is_tensor(multiplied.pop())
        assert float(a["loss"]) == float(b["loss"])
    for m, n in zip(ours.optimizer.fp32_params, theirs.optimizer.fp32_params):
        assert torch.equal(m, n)
    initial = _trainer(task_dir, *settings)
    assert any(not torch.equal(m, n) for m, n in zip(ours.optimizer.fp32_params, initial.optimizer.fp32_params))
    torch._dynamo.reset()


def test_other_optimizers_take_their_own_step(task_dir):
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    fp32 = _trainer(task_dir, "common.bf16=false")
    assert not takes_fast_step(fp32.optimizer)
    with pytest.raises(TypeError, match="FP16Optimizer"):
        fp16_optimizer_step(fp32.optimizer)
    fp32.train_step(bench_train.make_batches(1, 3, 40, 12, 512)[0:1])  # the plain step still trains
    bf16 = _trainer(task_dir, "common.bf16=true")

    class Subclass(FP16Optimizer):
        pass

    bf16.optimizer.__class__ = Subclass  # a subclass may step otherwise: not ours to replace
    assert not takes_fast_step(bf16.optimizer)


def _tiny_model():
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    return AstT5Model.from_dictionary(d, arch="t5_v11_tiny")


def test_train_and_eval_set_every_module_and_return_the_model():
    model = _tiny_model()
    assert model.eval() is model and not any(m.training for m in model.modules())
    assert model.train() is model and all(m.training for m in model.modules())
    assert model.train() is model and all(m.training for m in model.modules())  # the early return
    model.decoder.layers[1].eval()  # one submodule switched on its own: train() must reach it
    model.train()
    assert all(m.training for m in model.modules())
    model.train(False)
    assert not any(m.training for m in model.modules())
    with pytest.raises(ValueError, match="boolean"):
        model.train("yes")


def test_set_num_updates_reaches_each_module_that_takes_it_once():
    model = _tiny_model()
    calls = []

    class Scheduled(torch.nn.Module):
        def set_num_updates(self, n):
            calls.append((id(self), n))

    deep, shared = Scheduled(), Scheduled()
    model.encoder.layers[0].scheduled = deep  # under the encoder, whose own walker fairseq calls too
    model.encoder.extra = shared
    model.decoder.extra = shared  # registered twice: still one call
    plain = torch.nn.Linear(2, 2)
    plain.set_num_updates = lambda n: calls.append((id(plain), n))  # a method set on the instance
    model.decoder.layers[0].plain = plain
    model.set_num_updates(7)
    assert sorted(calls) == sorted([(id(deep), 7), (id(shared), 7), (id(plain), 7)])
    # fairseq's own walk reaches the same modules (the one under the encoder twice)
    calls.clear()
    from fairseq.models import BaseFairseqModel

    BaseFairseqModel.set_num_updates(model, 8)
    assert set(calls) == {(id(deep), 8), (id(shared), 8), (id(plain), 8)}
    assert calls.count((id(deep), 8)) == 2
