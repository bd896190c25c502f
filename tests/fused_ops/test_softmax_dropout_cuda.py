"""GPU tests for the fused softmax-dropout kernel (skipped, with the reason shown by -rs, without CUDA).

Oracle design: an fp64 reference; the kernel's error must stay within a small multiple of
PyTorch's own error in the same dtype. Dropout is checked through the kernel's own keep mask
(so the reference applies the same mask) and statistically. Every test first asserts that the
fused path can run, so a missing extension fails instead of silently testing the fallback.
"""
import os

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import fused_ops
from ast_t5.modules import attention_backends as ab

CUDA = torch.cuda.is_available()
EXTENSION_REQUESTED = os.environ.get("AST_T5_BUILD_CUDA_EXT", "0") == "1"
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
pytestmark = pytest.mark.cuda
ERROR_MULTIPLE = 4  # kernel error <= this x PyTorch's same-dtype error (or x the dtype's eps)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KEY_LENGTHS = [1, 31, 97, 257, 1025, 2049, 4096, fused_ops.MAX_FUSED_COLS]


@pytest.fixture
def fused():
    ok, reason = fused_ops.fused_backend_status(torch.device("cuda"))
    assert ok, f"fused kernel unavailable on this GPU machine, tests would not test it: {reason}"


@pytest.mark.skipif(not (CUDA or EXTENSION_REQUESTED), reason="no GPU and AST_T5_BUILD_CUDA_EXT is not 1")
def test_fused_path_is_available_when_expected():
    ok, reason = fused_ops.fused_backend_status()
    assert ok, f"softmax_dropout would silently fall back to the reference: {reason}"


def make_inputs(dtype, k_len, shape=(2, 3, 5), seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch, heads, q_len = shape
    scores = (3 * torch.randn(batch, heads, q_len, k_len, device="cuda", generator=g)).to(dtype)
    bias = torch.randn(1, heads, q_len, k_len, device="cuda", generator=g)
    mask = torch.zeros(batch, 1, 1, k_len, device="cuda")
    mask[0, ..., k_len - k_len // 3:] = float("-inf") if k_len > 1 else 0.0  # keep >= 1 key per row
    return scores.requires_grad_(), bias.requires_grad_(), mask


def reference(scores, bias, mask, compute_dtype, keep=None, p=0.0):
    """softmax(scores + bias + mask) in ``compute_dtype`` (then the given dropout), with fresh leaves."""
    s, b = scores.detach().to(compute_dtype).requires_grad_(), bias.detach().to(compute_dtype).requires_grad_()
    x = s + b + mask.to(compute_dtype)
    y = torch.softmax(x, dim=-1)
    if keep is not None:
        y = y * keep / (1 - p)
    return y, s, b


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def bound(torch_err, dtype, scale):
    return ERROR_MULTIPLE * max(torch_err, torch.finfo(dtype).eps * scale)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k_len", KEY_LENGTHS)
def test_forward_and_backward_match_reference(fused, dtype, k_len):
    scores, bias, mask = make_inputs(dtype, k_len)
    grad = torch.randn(scores.shape, device="cuda").to(dtype)
    out = fused_ops.softmax_dropout(scores, 0.0, True, bias=bias, mask=mask, backend="fused")
    g_scores, g_bias = torch.autograd.grad(out, (scores, bias), grad)
    ref, rs, rb = reference(scores, bias, mask, torch.float64)
    same, ss, sb = reference(scores, bias, mask, dtype)  # PyTorch's own error in this dtype
    assert out.dtype == dtype and out.shape == scores.shape
    assert max_err(out, ref) <= bound(max_err(same, ref), dtype, 1.0)
    ref_gs, ref_gb = torch.autograd.grad(ref, (rs, rb), grad.double())
    same_gs, same_gb = torch.autograd.grad(same, (ss, sb), grad)
    scale = ref_gs.abs().max().item()
    assert max_err(g_scores, ref_gs) <= bound(max_err(same_gs, ref_gs), dtype, scale)
    assert g_bias.dtype == bias.dtype
    assert max_err(g_bias, ref_gb) <= bound(max_err(same_gb, ref_gb), dtype, ref_gb.abs().max().item())


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k_len", [97, 1025, 4096])
def test_dropout_applies_its_returned_mask_forward_and_backward(fused, dtype, k_len):
    p = 0.17
    scores, bias, mask = make_inputs(dtype, k_len)
    out, keep = fused_ops.softmax_dropout_with_mask(scores, p, True, bias=bias, mask=mask, backend="fused")
    grad = torch.randn(scores.shape, device="cuda").to(dtype)
    g_scores, g_bias = torch.autograd.grad(out, (scores, bias), grad)
    ref, rs, rb = reference(scores, bias, mask, torch.float64, keep, p)
    same, ss, sb = reference(scores, bias, mask, dtype, keep, p)
    assert (out[~keep] == 0).all()
    assert max_err(out, ref) <= bound(max_err(same, ref), dtype, 1.0 / (1 - p))
    ref_gs, ref_gb = torch.autograd.grad(ref, (rs, rb), grad.double())
    same_gs, _ = torch.autograd.grad(same, (ss, sb), grad)
    assert max_err(g_scores, ref_gs) <= bound(max_err(same_gs, ref_gs), dtype, ref_gs.abs().max().item())


@needs_gpu
@pytest.mark.parametrize("p", [0.1, 0.17, 0.5])
@pytest.mark.parametrize("k_len", [97, 1024, 4097])
def test_dropout_rate_and_scaling(fused, p, k_len):
    scores = torch.randn(8, 8, 64, k_len, device="cuda")
    out, keep = fused_ops.softmax_dropout_with_mask(scores, p, True, backend="fused")
    dropped = 1.0 - keep.float().mean().item()
    assert 0.98 <= dropped / p <= 1.02
    probs = torch.softmax(scores, dim=-1)
    assert torch.allclose(out[keep], probs[keep] / (1 - p), rtol=1e-5, atol=1e-7)


@needs_gpu
def test_dropout_follows_torch_manual_seed_and_advances(fused):
    scores, bias, _ = make_inputs(torch.float16, 300)
    torch.manual_seed(0)
    a = fused_ops.softmax_dropout(scores, 0.3, True, bias=bias, backend="fused")
    b = fused_ops.softmax_dropout(scores, 0.3, True, bias=bias, backend="fused")
    torch.manual_seed(0)
    c = fused_ops.softmax_dropout(scores, 0.3, True, bias=bias, backend="fused")
    assert torch.equal(a, c) and not torch.equal(a, b)


@needs_gpu
def test_activation_checkpointing_recomputes_the_same_dropout(fused):
    scores, bias, _ = make_inputs(torch.bfloat16, 513)
    weight = torch.randn(scores.shape, device="cuda")

    def f(s, b):
        return (fused_ops.softmax_dropout(s, 0.2, True, bias=b, backend="fused").float() * weight).sum()

    torch.manual_seed(3)
    plain = torch.autograd.grad(f(scores, bias), (scores, bias))
    torch.manual_seed(3)
    recomputed = torch.autograd.grad(checkpoint(f, scores, bias, use_reentrant=False), (scores, bias))
    assert all(torch.equal(x, y) for x, y in zip(plain, recomputed))


@needs_gpu
def test_too_long_rows_fall_back_in_auto_and_fail_in_fused(fused):
    scores = torch.randn(1, 1, 2, fused_ops.MAX_FUSED_COLS + 1, device="cuda")
    with pytest.raises(RuntimeError, match="cannot run"):
        fused_ops.softmax_dropout(scores, 0.0, backend="fused")
    out = fused_ops.softmax_dropout(scores, 0.0, backend="auto")
    assert torch.allclose(out, torch.softmax(scores, dim=-1))


@needs_gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fused_attention_backend_matches_eager(fused, dtype, tol):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, device="cuda", generator=g).to(dtype).requires_grad_() for n in (7, 13, 13))
    bias = torch.randn(1, 4, 7, 13, device="cuda", generator=g).requires_grad_()
    pad = torch.zeros(2, 13, dtype=torch.bool, device="cuda")
    pad[1, -5:] = True
    outs = [ab.attention(q, k, v, bias=bias, key_padding_mask=pad, backend=b) for b in ("fused", "torch")]
    grads = [torch.autograd.grad(o.float().sum(), (q, k, v, bias)) for o in outs]
    assert max_err(outs[0], outs[1]) < tol
    assert all(max_err(a, b) < tol * 10 for a, b in zip(*grads))
