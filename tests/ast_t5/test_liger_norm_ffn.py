"""model.fused_norm_ffn: liger-kernel's RMSNorm and gated GELU behind one switch.

liger's kernels cannot run on the CPU, not even under TRITON_INTERPRET=1 (triton 3.9's interpreter
lacks libdevice rsqrt/tanh and float scalar arguments). So on the CPU the liger path is wired to
reference functions that check the calling conventions we rely on (offset 0, casting "gemma",
no in-place gradient, contiguous gate/value, weight in x's dtype) and compute T5's math
independently; the CUDA tests run the real kernels, compare them with eager and fail if the
kernels did not run.
"""
import math

import pytest
import torch
from fairseq.data import Dictionary

from ast_t5.models import AstT5Model
from ast_t5.modules import FeedForward, RMSNorm
from ast_t5.modules import liger_norm_ffn


def _dictionary(n=60):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


def _model(arch="t5_v11_tiny", **overrides):
    torch.manual_seed(0)
    return AstT5Model.from_dictionary(_dictionary(), arch=arch, dropout=0.0, attention_dropout=0.0,
                                      activation_dropout=0.0, **overrides)


def _batch(device="cpu", bsz=3, src_len=11, tgt_len=7):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 60, (bsz, src_len), generator=g)
    src[0, -3:] = 1  # some padding
    prev = torch.randint(4, 60, (bsz, tgt_len), generator=g)
    return src.to(device), prev.to(device)


def _loss_and_grads(model, src, prev, autocast_dtype=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast(src.device.type, dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        logits = model(src, None, prev)[0]
    loss = logits.float().pow(2).mean()  # every logit contributes to the gradients
    loss.backward()
    return logits.detach().float(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_auto_and_eager_build_eager_modules():
    for choice in ("auto", "eager"):
        model = _model(fused_norm_ffn=choice)
        assert model.norm_ffn_impl == "eager"
        impls = {m.impl for m in model.modules() if isinstance(m, (RMSNorm, FeedForward))}
        assert impls == {"eager"}
    assert liger_norm_ffn.AUTO_USES_LIGER is False  # flip only with a GPU measurement (BENCHMARKS.md)


def test_unknown_choice_and_paper_family_are_refused_at_build():
    with pytest.raises(ValueError, match="fused_norm_ffn must be one of"):
        _model(fused_norm_ffn="fast")
    with pytest.raises(ValueError, match="fused_norm_ffn=liger: family ast_t5_paper has no RMSNorm"):
        _model(arch="ast_t5_paper_tiny", fused_norm_ffn="liger")
    assert _model(arch="ast_t5_paper_tiny", fused_norm_ffn="auto").norm_ffn_impl == "eager"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_liger_without_cuda_builds_with_warning_then_forward_fails_in_one_line(caplog):
    with caplog.at_level("WARNING", logger="ast_t5.modules.liger_norm_ffn"):
        model = _model(fused_norm_ffn="liger")
    assert "fused_norm_ffn=liger cannot run in this process" in caplog.text
    assert model.norm_ffn_impl == "liger"
    with pytest.raises(RuntimeError) as info:
        src, prev = _batch()
        model(src, None, prev)
    message = str(info.value)
    assert "\n" not in message and "fused_norm_ffn=eager" in message
    assert ("not importable" in message) or ("CUDA only" in message)


def test_state_dicts_are_interchangeable():
    eager = _model(fused_norm_ffn="eager")
    liger = _model(fused_norm_ffn="liger")
    a, b = eager.state_dict(), liger.state_dict()
    assert list(a) == list(b)
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    liger.load_state_dict(a)  # strict: same keys both ways
    eager.load_state_dict(liger.state_dict())


class _ReferenceRMSNorm(torch.autograd.Function):
    """Stands in for LigerRMSNormFunction on the CPU: checks our call, computes T5's RMSNorm."""

    calls = 0

    @staticmethod
    def forward(ctx, x, w, eps, offset, casting_mode, in_place, row_mode):
        assert offset == 0.0 and casting_mode == "gemma" and in_place is False and row_mode is None
        assert w.dtype == x.dtype and w.shape == x.shape[-1:]
        _ReferenceRMSNorm.calls += 1
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return _ReferenceRMSNorm.math(x, w, eps)

    @staticmethod
    def math(x, w, eps):
        x32 = x.float()
        return (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
            dx, dw = torch.autograd.grad(_ReferenceRMSNorm.math(x_, w_, ctx.eps), (x_, w_), dy)
        return dx, dw, None, None, None, None, None


class _ReferenceGeluMul(torch.autograd.Function):
    """Stands in for LigerGELUMulFunction: gelu_new(a) * b, written out (not F.gelu)."""

    calls = 0

    @staticmethod
    def forward(ctx, a, b):
        assert a.is_contiguous() and b.is_contiguous() and a.shape == b.shape
        _ReferenceGeluMul.calls += 1
        ctx.save_for_backward(a, b)
        return _ReferenceGeluMul.math(a, b)

    @staticmethod
    def math(a, b):
        a32 = a.float()
        gelu = 0.5 * a32 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a32 + 0.044715 * a32.pow(3))))
        return gelu.to(b.dtype) * b

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        with torch.enable_grad():
            a_, b_ = a.detach().requires_grad_(), b.detach().requires_grad_()
            return torch.autograd.grad(_ReferenceGeluMul.math(a_, b_), (a_, b_), dc)


@pytest.fixture
def reference_kernels(monkeypatch):
    monkeypatch.setattr(liger_norm_ffn, "_ops", (_ReferenceRMSNorm, _ReferenceGeluMul))
    monkeypatch.setattr(liger_norm_ffn, "LIGER_DEVICE_TYPES", ("cuda", "cpu"))
    _ReferenceRMSNorm.calls = _ReferenceGeluMul.calls = 0


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_liger_wiring_matches_eager_on_cpu(reference_kernels, autocast_dtype):
    eager = _model(fused_norm_ffn="eager")
    liger = _model(fused_norm_ffn="liger")
    liger.load_state_dict(eager.state_dict())
    src, prev = _batch()
    out_e, grads_e = _loss_and_grads(eager, src, prev, autocast_dtype)
    assert _ReferenceRMSNorm.calls == 0 and _ReferenceGeluMul.calls == 0
    out_l, grads_l = _loss_and_grads(liger, src, prev, autocast_dtype)
    cfg = liger.cfg
    layers = cfg.encoder_layers + cfg.decoder_layers
    # every norm (2 per encoder layer, 3 per decoder layer, 2 final) and every FFN took the liger path
    assert _ReferenceRMSNorm.calls == 2 * cfg.encoder_layers + 3 * cfg.decoder_layers + 2
    assert _ReferenceGeluMul.calls == layers
    tol = dict(rtol=1e-5, atol=1e-5) if autocast_dtype is None else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out_l, out_e, **tol)
    assert grads_l.keys() == grads_e.keys()
    for name in grads_e:
        scale = grads_e[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(grads_l[name] / scale, grads_e[name] / scale, **tol, msg=name)


def test_liger_ffn_keeps_dropout_after_the_product(reference_kernels):
    ffn = FeedForward(16, 24, "gated-gelu", activation_dropout=0.5, bias=False)
    ffn.impl = "liger"
    x = torch.randn(2, 5, 16)
    torch.manual_seed(3)
    fused = ffn(x)
    ffn.impl = "eager"
    torch.manual_seed(3)
    torch.testing.assert_close(fused, ffn(x))  # same dropout mask on the same hidden activations


def _liger_importable():
    return liger_norm_ffn.liger_norm_ffn_ops()[0] is not None


# liger-kernel 0.8.5's Triton kernels (the "_block_" variants of RMSNorm contain these names too)
LIGER_KERNELS = ("_rms_norm_forward_kernel", "_rms_norm_backward_kernel",
                 "_geglu_tanh_forward_kernel", "_geglu_tanh_backward_kernel")


def _kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="liger's kernels run on CUDA only")
@pytest.mark.skipif(torch.cuda.is_available() and not _liger_importable(),
                    reason="liger-kernel is not installed (optional: pip install liger-kernel)")
def test_liger_kernels_run_on_cuda_and_match_eager(autocast_dtype):
    eager = _model(fused_norm_ffn="eager").cuda()
    liger = _model(fused_norm_ffn="liger").cuda()
    liger.load_state_dict(eager.state_dict())
    src, prev = _batch("cuda", bsz=4, src_len=40, tgt_len=24)
    out_e, grads_e = _loss_and_grads(eager, src, prev, autocast_dtype)
    results = {}
    names = _kernel_names(lambda: results.update(zip(("out", "grads"),
                                                     _loss_and_grads(liger, src, prev, autocast_dtype))))
    for kernel in LIGER_KERNELS:
        assert any(kernel in n for n in names), f"{kernel} did not run: the liger path was not taken"
    eager_names = _kernel_names(lambda: _loss_and_grads(eager, src, prev, autocast_dtype))
    assert not any(kernel in n for kernel in LIGER_KERNELS for n in eager_names)
    tol = dict(rtol=1e-4, atol=1e-4) if autocast_dtype is None else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(results["out"], out_e, **tol)
    for name in grads_e:
        scale = grads_e[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(results["grads"][name] / scale, grads_e[name] / scale, **tol, msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="liger's kernels run on CUDA only")
@pytest.mark.skipif(torch.cuda.is_available() and not _liger_importable(),
                    reason="liger-kernel is not installed (optional: pip install liger-kernel)")
def test_liger_refuses_cpu_inputs_on_a_cuda_host():
    model = _model(fused_norm_ffn="liger")  # builds without a warning: CUDA and liger are here
    with pytest.raises(RuntimeError, match="CUDA only .input on cpu.*fused_norm_ffn=eager"):
        src, prev = _batch()
        model(src, None, prev)


def test_bench_model_norm_ffn_needs_cuda():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_model

    assert bench_model.parse_args(["--norm-ffn", "--norm-ffn-compile"]).norm_ffn_compile
    if torch.cuda.is_available():
        return
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("ast_t5", "fused_ops", "transformers")}
    try:  # main() configures logging for a script; put it back afterwards
        assert bench_model.main(["--norm-ffn"]) == 2  # usage error: the kernels are CUDA only
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, lvl in levels.items():
            logging.getLogger(name).setLevel(lvl)
