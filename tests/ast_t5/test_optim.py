"""Optimizers and clipping: the foreach steps against the per-parameter references, and gradient
clipping on the gradients' own device (including a CUDA host training on the CPU)."""

import logging

import pytest
import torch

from ast_t5.optim.adafactor import Adafactor, T5Adafactor
from ast_t5.optim.adamw_scale import AdamWScale, FairseqAdamWScale
from ast_t5.optim.clipping import OwnClipMixin, clip_grad_norm_

SHAPES = [(6, 5), (7,), (3, 4, 2), (1,)]


def _params(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * (0.02 + k)).to(dtype))
            for k, s in enumerate(SHAPES)]


def _run(params, opt, steps=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_scale_foreach_matches_the_loop(weight_decay):
    a, b = _params(), _params()
    kw = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    out_loop = _run(a, AdamWScale(a, foreach=False, **kw))
    out_each = _run(b, AdamWScale(b, foreach=True, fused=False, **kw))
    for x, y, p0 in zip(out_loop, out_each, _params()):
        assert not torch.equal(x, p0)
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_scale_fused_kernel_matches_the_loop(weight_decay, monkeypatch):
    """fused=True: torch's fused AdamW kernel, one call per parameter with its RMS-scaled learning
    rate, gives the loop's update (and really ran: every parameter went through it each step)."""
    calls = []
    kernel = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(len(a[0])) or kernel(*a, **k))
    a, b = _params(), _params()
    kw = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    out_loop = _run(a, AdamWScale(a, foreach=False, **kw))
    fused = AdamWScale(b, foreach=True, fused=True, **kw)
    out_fused = _run(b, fused)
    assert calls == [1] * len(SHAPES) * 5
    for x, y, p0 in zip(out_loop, out_fused, _params()):
        assert not torch.equal(x, p0)
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7)
    assert all(s["step"] == 5 and s["exp_avg"].dtype == torch.float32 for s in fused.state.values())



def _compiled_run(device, weight_decay, monkeypatch):
    """Five compiled steps (the learning rate changed between them, as a schedule does) against the
    loop on the CPU; returns the graphs dynamo compiled on the way."""
    import ast_t5.optim.adamw_scale as adamw_scale

    monkeypatch.setattr(adamw_scale, "_COMPILED_UPDATE", None)
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: pytest.fail("the fused kernel ran"))
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    a, b = _params(), [torch.nn.Parameter(p.detach().to(device)) for p in _params()]
    kw = dict(betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    loop = AdamWScale(a, foreach=False, lr=0.01, **kw)
    compiled = AdamWScale(b, compiled=True, fused=True, lr=0.01, **kw)
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        for opt in (loop, compiled):
            opt.param_groups[0]["lr"] = 0.01 * (step + 1)  # what the scheduler does between updates
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.to(device)
        loop.step()
        compiled.step()
    for x, y, p0 in zip(a, b, _params()):
        assert not torch.equal(x, p0)
        torch.testing.assert_close(y.detach().cpu(), x.detach(), rtol=1e-5, atol=1e-6)
    assert all(s["step"] == 5 for s in compiled.state.values())
    new_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    torch._dynamo.reset()
    return new_graphs


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_scale_compiled_matches_the_loop_and_compiles_once(weight_decay, monkeypatch, caplog):
    """compiled=True: the foreach update under torch.compile gives the loop's update (fused=True
    too: compiled takes precedence, the fused kernel never runs), and the learning rate that
    changes every step and the step count are tensors, not guards: one graph for five steps; the
    compilation is logged once, with its time."""
    with caplog.at_level(logging.INFO, logger="ast_t5.optim.adamw_scale"):
        assert _compiled_run("cpu", weight_decay, monkeypatch) == 1
    assert caplog.text.count("compiling the update of 4 tensors") == 1
    assert caplog.text.count("the update compiled and ran in") == 1


def test_adamw_scale_compiled_runs_eagerly_under_a_dispatch_mode(monkeypatch, caplog):
    """torch.compile refuses to run under a user's TorchDispatchMode (an op or flop counter): the
    compiled update raised "found no compiled frames" there (bench_host_overhead's op count with
    optimizer.compiled=true). It runs the same foreach update eagerly then, says so once, and
    compiles as before once the mode is gone."""
    import ast_t5.optim.adamw_scale as adamw_scale
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(adamw_scale, "_COMPILED_UPDATE", None)
    monkeypatch.setattr(adamw_scale, "_EAGER_UNDER_MODE_LOGGED", False)
    torch._dynamo.reset()
    a, b = _params(), _params()
    loop = AdamWScale(a, foreach=False, lr=0.01, weight_decay=0.1)
    compiled = AdamWScale(b, compiled=True, lr=0.01, weight_decay=0.1)
    g = torch.Generator().manual_seed(2)
    try:
        with caplog.at_level(logging.INFO, logger="ast_t5.optim.adamw_scale"):
            for step in range(3):
                for p, q in zip(a, b):
                    p.grad = torch.randn(p.shape, generator=g)
                    q.grad = p.grad.clone()
                loop.step()
                if step < 2:
                    with Counting() as mode:
                        compiled.step()
                    assert mode.ops > 0  # the mode saw the update's ops: it ran eagerly inside it
                else:
                    compiled.step()
        for x, y in zip(a, b):
            torch.testing.assert_close(y.detach(), x.detach(), rtol=1e-5, atol=1e-6)
        assert caplog.text.count("a TorchDispatchMode is active") == 1
        assert caplog.text.count("the update compiled and ran in") == 1  # the third step, without the mode
    finally:
        torch._dynamo.reset()


@pytest.mark.cuda
def test_adamw_scale_compiled_on_cuda_matches_the_cpu_loop(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the compiled update's GPU kernels are not run")
    assert _compiled_run("cuda", 0.1, monkeypatch) == 1

@pytest.mark.parametrize("path", ["loop", "foreach", "fused", "compiled"])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_adamw_scale_step_multiplies_the_gradients_by_grad_factor(path, as_tensor, monkeypatch):
    """step(grad_factor=f) (what our bf16 step hands over instead of fairseq's multiply pass) gives
    bit for bit the step on gradients multiplied by f first, on every path, f a number or a 0-dim
    tensor; the compiled update takes steps with and without a factor in one graph."""
    import ast_t5.optim.adamw_scale as adamw_scale

    monkeypatch.setattr(adamw_scale, "_COMPILED_UPDATE", None)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    settings = {"loop": dict(foreach=False), "foreach": dict(fused=False), "fused": dict(fused=True),
                "compiled": dict(compiled=True)}[path]
    a, b = _params(), _params()
    kw = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    first, folded = AdamWScale(a, **settings, **kw), AdamWScale(b, **settings, **kw)
    assert folded.folds_gradient_factor
    g = torch.Generator().manual_seed(1)
    for factor in (None, 0.25, 3.0, None):
        for p, q in zip(a, b):
            q.grad = torch.randn(p.shape, generator=g)
            p.grad = q.grad.clone()
            if factor is not None:
                torch._foreach_mul_([p.grad], torch.tensor(factor) if as_tensor else factor)
        first.step()
        folded.step(grad_factor=torch.tensor(factor) if as_tensor and factor is not None else factor)
    for x, y, p0 in zip(a, b, _params()):
        assert not torch.equal(x, p0)
        assert torch.equal(y, x)
    if path == "compiled":
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1
    torch._dynamo.reset()


def test_adamw_scale_fused_is_auto_on_cuda_and_cpu_and_leaves_other_dtypes_to_foreach(monkeypatch):
    from ast_t5.optim.adamw_scale import _takes_fused

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    fp32 = _params()
    for p in fp32:
        p.grad = torch.zeros_like(p)
    assert _takes_fused(None, cuda, torch.float32, fp32) and _takes_fused(None, cpu, torch.float32, fp32)
    assert not _takes_fused(None, torch.device("meta"), torch.float32, fp32)
    assert _takes_fused(True, cpu, torch.float32, fp32) and not _takes_fused(False, cuda, torch.float32, fp32)
    bf16 = _params(dtype=torch.bfloat16)
    for p in bf16:
        p.grad = torch.zeros_like(p)
    assert not _takes_fused(True, cuda, torch.bfloat16, bf16)
    fp32[0].grad = torch.zeros(fp32[0].shape[::-1]).t()  # a gradient laid out otherwise: the foreach ops
    assert not _takes_fused(True, cpu, torch.float32, fp32)
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: pytest.fail("bf16 took the fused kernel"))
    _run(bf16, AdamWScale(bf16, lr=0.01, fused=True), 2)


def test_adamw_scale_foreach_on_bf16_parameters_keeps_fp32_moments():
    a, b = _params(dtype=torch.bfloat16), _params(dtype=torch.bfloat16)
    loop, each = AdamWScale(a, lr=0.01, foreach=False), AdamWScale(b, lr=0.01, foreach=True)
    for x, y in zip(_run(a, loop, 3), _run(b, each, 3)):
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), x.float(), rtol=1e-2, atol=1e-3)
    assert all(s["exp_avg"].dtype == torch.float32 for s in each.state.values())


ADAFACTOR_SETTINGS = [
    dict(lr=0.01, relative_step=False, scale_parameter=True),
    dict(lr=0.01, relative_step=False, scale_parameter=False, beta1=0.9, weight_decay=0.01),
    dict(lr=None, relative_step=True, scale_parameter=True, warmup_init=True),
    dict(lr=0.01, relative_step=False, scale_parameter=True, beta1=0.9, weight_decay=0.1,
         clip_threshold=0.5),
]


@pytest.mark.parametrize("settings", ADAFACTOR_SETTINGS)
def test_adafactor_foreach_matches_fairseqs_with_one_parameter_per_group(settings):
    """fairseq's Adafactor (the reference), each parameter in its own group so that its
    compounding of group["lr"] (see ast_t5/optim/adafactor.py) cannot act."""
    from fairseq.optim.adafactor import Adafactor as FairseqAdafactor

    a, b = _params(), _params()
    base_lr = settings.get("lr")
    ref = FairseqAdafactor([{"params": [p]} for p in a], **settings)
    ours = Adafactor(b, **settings)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        ref.step()
        ours.step()
        if base_lr is not None:  # what fairseq's lr scheduler does before every update
            for group in ref.param_groups:
                group["lr"] = base_lr
    for p, q, p0 in zip(a, b, _params()):
        assert not torch.equal(q, p0)
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-7)
    assert ours.param_groups[0]["lr"] == base_lr  # never overwritten


def test_adafactor_step_size_does_not_depend_on_the_parameter_order():
    a, b = _params(), _params()
    together = Adafactor(a, lr=0.01, relative_step=False)
    apart = Adafactor([{"params": [p]} for p in b], lr=0.01, relative_step=False)
    for x, y in zip(_run(a, together), _run(b, apart)):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-8)


def _grads(seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.zeros(s, device=device)) for s in SHAPES]
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=g) * 3).to(device)
    return ps


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_clip_matches_fairseq_on_cpu(max_norm):
    from fairseq import utils

    a, b = _grads(), _grads()
    ref = utils.clip_grad_norm_(a, max_norm)
    ours = clip_grad_norm_(b, max_norm)
    assert ours.device.type == "cpu" and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref.to(ours))
    for p, q in zip(a, b):
        torch.testing.assert_close(q.grad, p.grad)
    if max_norm == 0.5:
        assert torch.linalg.vector_norm(torch.cat([q.grad.flatten() for q in b])) <= 0.5 + 1e-5


def test_clip_on_a_cuda_host_keeps_cpu_gradients_on_the_cpu(monkeypatch):
    """common.cpu=true on a machine with CUDA: fairseq moves the norms to cuda:0 (then fails);
    ours never asks where CUDA is."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("asked for the CUDA device"))
    ps = _grads()
    norm = clip_grad_norm_(ps, 1.0)
    assert norm.device.type == "cpu"
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ps]))
    torch.testing.assert_close(total, torch.tensor(1.0), rtol=1e-4, atol=1e-5)


def test_clip_with_no_gradients_is_zero():
    assert float(clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0)) == 0.0


@pytest.mark.parametrize("cls", [FairseqAdamWScale, T5Adafactor])
def test_registered_optimizers_clip_with_ours(cls, monkeypatch):
    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY, OPTIMIZER_REGISTRY
    from omegaconf import OmegaConf

    name = [k for k, v in OPTIMIZER_REGISTRY.items() if v is cls][0]
    assert cls.clip_grad_norm is OwnClipMixin.clip_grad_norm
    cfg = merge_with_parent(OPTIMIZER_DATACLASS_REGISTRY[name](), OmegaConf.create({"_name": name, "lr": [0.01]}))
    ps = _grads()
    opt = cls(cfg, ps)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    norm = opt.clip_grad_norm(0.1)
    assert norm.device.type == "cpu" and float(norm) > 0.1
    opt.step()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_clip_and_foreach_steps_on_cuda_match_cpu(monkeypatch):
    cpu, gpu = _grads(), _grads(device="cuda")
    n_cpu, n_gpu = clip_grad_norm_(cpu, 1.0), clip_grad_norm_(gpu, 1.0)
    assert n_gpu.device.type == "cuda"
    torch.testing.assert_close(n_gpu.cpu(), n_cpu, rtol=1e-5, atol=1e-6)
    calls = []
    kernel = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(a[0][0].device.type) or kernel(*a, **k))
    kw = dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    a = _params()
    reference = _run(a, AdamWScale(a, foreach=False, **kw))
    for fused in (None, False):  # auto: the fused kernel on CUDA; then the foreach ops
        calls.clear()
        b = [torch.nn.Parameter(p.detach().cuda()) for p in _params()]
        g = torch.Generator().manual_seed(1)  # _run's gradients, made on the CPU and moved
        opt = AdamWScale(b, fused=fused, **kw)
        for _ in range(5):
            for q in b:
                q.grad = torch.randn(q.shape, generator=g).cuda()
            opt.step()
        assert calls == (["cuda"] * len(SHAPES) * 5 if fused is None else [])
        for p, q in zip(reference, b):
            torch.testing.assert_close(q.detach().cpu(), p, rtol=1e-5, atol=1e-6)


def test_adamw_torch_follows_fairseqs_adam():
    """Same algorithm as fairseq's adam (decoupled weight decay); epsilon placement differs only
    by sqrt(1 - beta2^t), invisible with a tiny epsilon."""
    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY, OPTIMIZER_REGISTRY
    from omegaconf import OmegaConf

    a, b = _params(), _params()
    settings = {"lr": [0.01], "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-12, "weight_decay": 0.01}
    opts = []
    for name, ps in (("adam", a), ("adamw_torch", b)):
        extra = {"tpu": False} if name == "adam" else {}
        cfg = merge_with_parent(OPTIMIZER_DATACLASS_REGISTRY[name](),
                                OmegaConf.create({"_name": name, **settings, **extra}))
        opts.append(OPTIMIZER_REGISTRY[name](cfg, ps))
    assert type(opts[1]).clip_grad_norm is OwnClipMixin.clip_grad_norm
    assert opts[1]._optimizer.defaults["fused"]  # torch's fused kernel, on the CPU too
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        for opt in opts:
            opt.step()
    for p, q, p0 in zip(a, b, _params()):
        assert not torch.equal(q, p0)
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)
