"""CPU tests for fused_ops.softmax_dropout: the reference, dispatch, and the CUDA glue's helpers.

The kernel itself is tested in test_softmax_dropout_cuda.py (skipped without a GPU).
"""
import importlib
import logging
import math
import subprocess
import sys

import pytest
import torch

import fused_ops
from fused_ops import _fused_autograd

sd = importlib.import_module("fused_ops.softmax_dropout")  # the module (the package exports the function)




def inputs(dtype=torch.float64, shape=(2, 3, 5, 37), seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(shape, generator=g, dtype=dtype).requires_grad_(requires_grad)
    bias = torch.randn(1, *shape[1:], generator=g, dtype=dtype).requires_grad_(requires_grad)
    mask = torch.zeros(shape[0], 1, 1, shape[-1], dtype=dtype)
    mask[0, ..., -4:] = float("-inf")
    return scores, bias, mask


def test_reference_is_softmax_of_the_sum_without_dropout():
    scores, bias, mask = inputs()
    expected = torch.softmax(scores + bias + mask, dim=-1)
    for training, p in [(False, 0.3), (True, 0.0)]:
        out = fused_ops.softmax_dropout_reference(scores, p, training, bias=bias, mask=mask)
        assert torch.allclose(out, expected, atol=1e-12)
    assert (out[0, ..., -4:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_half_precision_uses_fp32_softmax(dtype):
    scores, bias, mask = inputs(torch.float32)
    out = fused_ops.softmax_dropout_reference(scores.to(dtype), 0.0, False, bias=bias, mask=mask)
    assert out.dtype == dtype
    expected = torch.softmax(scores.to(dtype).float() + bias + mask, dim=-1)
    assert torch.equal(out, expected.to(dtype))


def test_reference_never_modifies_its_inputs():
    scores, bias, mask = inputs()
    copies = [t.clone() for t in (scores, bias, mask)]
    fused_ops.softmax_dropout(scores, 0.5, True, bias=bias, mask=mask)
    assert all(torch.equal(a, b) for a, b in zip((scores, bias, mask), copies))


def test_gradcheck_reference_with_and_without_dropout():
    scores, bias, mask = inputs(shape=(1, 2, 3, 7), requires_grad=True)

    def fixed_dropout(s, b):
        torch.manual_seed(1234)  # the same keep mask on every evaluation
        return fused_ops.softmax_dropout_reference(s, 0.3, True, bias=b, mask=mask)

    def no_dropout(s, b):
        return fused_ops.softmax_dropout_reference(s, 0.0, True, bias=b, mask=mask)

    assert torch.autograd.gradcheck(no_dropout, (scores, bias))
    assert torch.autograd.gradcheck(fixed_dropout, (scores, bias))


def test_dropout_reproducible_under_manual_seed():
    scores, bias, _ = inputs(torch.float32)
    outs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        outs.append(fused_ops.softmax_dropout(scores, 0.4, True, bias=bias))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_reference_dropout_keep_rate_and_scaling():
    p = 0.2
    scores = torch.randn(64, 4, 32, 129)
    out, keep = fused_ops.softmax_dropout_with_mask(scores, p, True, backend="torch")
    probs = torch.softmax(scores, dim=-1)
    kept = keep.float().mean().item()
    assert abs(kept - (1 - p)) < 0.01
    assert torch.allclose(out[keep], probs[keep] / (1 - p)) and (out[~keep] == 0).all()


def test_fused_on_cpu_raises_and_auto_falls_back_once(caplog, monkeypatch):
    monkeypatch.setattr(sd, "_LOGGED_CHOICES", set())
    scores, bias, mask = inputs(torch.float32)
    with pytest.raises(RuntimeError, match="backend='fused'.* cannot run: scores are on cpu"):
        fused_ops.softmax_dropout(scores, 0.1, True, bias=bias, mask=mask, backend="fused")
    with caplog.at_level(logging.INFO, logger=sd.__name__):
        for _ in range(3):
            out = fused_ops.softmax_dropout(scores, 0.0, True, bias=bias, mask=mask, backend="auto")
    assert torch.equal(out, fused_ops.softmax_dropout_reference(scores, 0.0, True, bias=bias, mask=mask))
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "auto -> torch" in logged[0] and "cpu" in logged[0]


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_invalid_arguments(p):
    scores, _, _ = inputs(torch.float32)
    with pytest.raises(ValueError, match="dropout probability"):
        fused_ops.softmax_dropout(scores, p)
    with pytest.raises(ValueError, match="backend"):
        fused_ops.softmax_dropout(scores, 0.1, backend="cuda")


def test_no_gpu_means_no_fused_backend():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; see test_softmax_dropout_cuda.py")
    ok, reason = fused_ops.fused_backend_status()
    assert not ok and not fused_ops.fused_backend_available() and "CUDA" in reason


def test_import_is_cheap():
    code = ("import sys, torch, fused_ops, fused_ops._extension as e; "
            "assert not torch.cuda.is_initialized(); assert 'fused_ops._C' not in sys.modules; "
            "assert not e._STATE.searched")
    subprocess.run([sys.executable, "-c", code], check=True)


def pack_reference(keep: torch.Tensor) -> torch.Tensor:
    """The kernel's layout written out bit by bit: word w of a row holds keys 32w..32w+31."""
    rows = keep.reshape(-1, keep.size(-1))
    words = torch.zeros(rows.size(0), math.ceil(rows.size(1) / 32), dtype=torch.int64)
    for col in range(rows.size(1)):
        words[:, col // 32] |= rows[:, col].long() << (col % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # as the int32 words


@pytest.mark.parametrize("k_len", [1, 31, 32, 33, 97])
def test_keep_bits_unpack_matches_the_kernel_layout(k_len):
    keep = torch.rand(2, 3, 4, k_len) > 0.3
    bits = pack_reference(keep)
    assert torch.equal(_fused_autograd.unpack_keep_bits(bits, keep.shape), keep)


@pytest.mark.parametrize("bias_shape", [(1, 3, 5, 7), (3, 5, 7), (2, 1, 1, 7), (5, 7), (2, 3, 5, 7)])
def test_bias_gradient_reduction_matches_broadcasting(bias_shape):
    grad = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    bias = torch.zeros(bias_shape, dtype=torch.float64, requires_grad=True)
    (torch.zeros(2, 3, 5, 7, dtype=torch.float64) + bias).backward(grad)
    reduced = _fused_autograd._reduce_to(grad, bias.shape)
    assert reduced.shape == bias.shape and torch.allclose(reduced.double(), bias.grad)
