"""Tests for ast_t5.modules.attention_backends and relative_position_bias (CPU)."""
import logging

import pytest
import torch

from ast_t5.modules import attention_backends as ab
from ast_t5.modules.relative_position_bias import RelativePositionBias, relative_position_bucket

HEADS, HEAD_DIM = 3, 8




def manual_attention(q, k, v, bias, key_padding_mask, causal, scale):
    """Attention written out independently of the code under test (-inf masks, fp64 softmax)."""
    scores = torch.einsum("bhtd,bhsd->bhts", q.double(), k.double()) * scale
    if bias is not None:
        scores = scores + bias.double()
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhts,bhsd->bhtd", scores.softmax(-1), v.double()).to(q.dtype)


def make_inputs(dtype, q_len, k_len, with_bias, with_padding, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, HEADS, n, HEAD_DIM, generator=g, dtype=dtype).requires_grad_()
               for n in (q_len, k_len, k_len))
    bias = torch.randn(1, HEADS, q_len, k_len, generator=g, dtype=dtype).requires_grad_() if with_bias else None
    pad = None
    if with_padding:
        pad = torch.zeros(batch, k_len, dtype=torch.bool)
        pad[0, k_len - 3:] = True  # right padding
        pad[1, :2] = True  # left padding
    return q, k, v, bias, pad


def run(backend, inputs, causal, scale=1.0):
    q, k, v, bias, pad = inputs
    return ab.attention(q, k, v, bias=bias, key_padding_mask=pad, causal=causal, scale=scale, backend=backend)


def grads(out, inputs):
    tensors = [t for t in inputs[:4] if t is not None]
    return torch.autograd.grad(out, tensors, torch.ones_like(out))


CASES = [  # (q_len, k_len, bias, padding, causal)
    (7, 13, True, True, False),   # encoder-like, odd lengths, padding both sides
    (9, 9, True, False, True),    # T5 v1.1 decoder self-attention
    (5, 11, False, True, False),  # cross-attention
    (6, 6, False, False, True),   # paper decoder self-attention
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("case", CASES)
def test_reference_matches_manual_attention(dtype, tol, case):
    q_len, k_len, with_bias, with_padding, causal = case
    inputs = make_inputs(dtype, q_len, k_len, with_bias, with_padding)
    expected = manual_attention(*inputs, causal, scale=0.5)
    assert (run("torch", inputs, causal, scale=0.5) - expected).abs().max() < tol


@pytest.mark.parametrize("backend", ["sdpa", "flash", "auto"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 3e-5)])
@pytest.mark.parametrize("case", CASES)
def test_backends_match_reference_forward_and_backward(backend, dtype, tol, case):
    q_len, k_len, with_bias, with_padding, causal = case
    inputs = make_inputs(dtype, q_len, k_len, with_bias, with_padding)
    ref = run("torch", inputs, causal)
    out = run(backend, inputs, causal)
    assert out.shape == ref.shape and out.dtype == dtype
    assert (out - ref).abs().max() < tol
    for g_out, g_ref in zip(grads(out, inputs), grads(ref, inputs)):
        assert (g_out - g_ref).abs().max() < tol * 10


@pytest.mark.parametrize("case", [c for c in CASES if c[2]])  # folding applies to biased calls
def test_folded_masks_give_the_same_attention(case):
    q_len, k_len, with_bias, with_padding, causal = case
    q, k, v, bias, pad = make_inputs(torch.float64, q_len, k_len, with_bias, with_padding)
    folded_bias, folded_pad, folded_causal = ab.fold_masks("sdpa", bias, pad, causal)
    assert folded_pad is None and folded_causal is False
    for backend in ("torch", "sdpa"):
        ref = run(backend, (q, k, v, bias, pad), causal)
        out = ab.attention(q, k, v, bias=folded_bias, backend=backend)
        assert (out - ref).abs().max() < 1e-10


def test_fused_backend_on_cpu_is_a_clear_error():
    inputs = make_inputs(torch.float32, 4, 4, True, False)
    with pytest.raises(RuntimeError, match="fused.*cannot run"):
        run("fused", inputs, causal=False)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="attention backend"):
        run("magic", make_inputs(torch.float32, 3, 3, False, False), causal=False)


def test_auto_logs_each_choice_once(caplog, monkeypatch):
    monkeypatch.setattr(ab, "_LOGGED", set())
    inputs = make_inputs(torch.float32, 4, 4, True, False)
    with caplog.at_level(logging.INFO, logger=ab.__name__):
        for _ in range(3):
            run("auto", inputs, causal=False)
    messages = [r.getMessage() for r in caplog.records if "auto" in r.getMessage()]
    assert len(messages) == 1 and "sdpa" in messages[0] and "cpu" in messages[0]


def test_relative_buckets_match_hugging_face():
    transformers_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-600, 600)[None, :] - torch.arange(0, 3)[:, None]
    for bidirectional, buckets, distance in [(True, 32, 128), (False, 32, 128), (True, 128, 256)]:
        ours = relative_position_bucket(rel, bidirectional, buckets, distance)
        theirs = transformers_t5.T5Attention._relative_position_bucket(rel, bidirectional, buckets, distance)
        assert torch.equal(ours, theirs)


def test_relative_buckets_are_exact_near_and_saturate_far():
    rel = torch.arange(-300, 301)
    b = relative_position_bucket(rel, bidirectional=True, num_buckets=128, max_distance=256)
    assert b.min() >= 0 and b.max() < 128
    assert torch.equal(b[300 - torch.arange(32)], torch.arange(32))  # keys 0..31 before: exact
    assert torch.equal(b[301:332], 64 + torch.arange(1, 32))  # keys 1..31 after: exact, upper half
    assert b[300 + 256] == b[300 + 300] == 127  # distances >= max_distance share the last bucket
    assert (b[300:].diff() >= 0).all() and (b[:301].diff() <= 0).all()
    assert len(set(b.tolist())) == 127  # every bucket but 64 ("after, distance 0") is reachable
    causal = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert (causal[301:] == 0).all()  # future keys (masked anyway) fall in bucket 0


def test_relative_bias_module_offsets_queries():
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=False)
    full = module(6, 6)
    assert full.shape == (1, HEADS, 6, 6)
    assert torch.equal(module(1, 6, query_offset=5), full[:, :, 5:6, :])


def fake_flash_attn_module():
    """Stand-in for the flash-attn package (same call signatures, computed with SDPA) to test our
    unpadding / cu_seqlens plumbing on CPU."""
    import types

    def sdpa_bshd(q, k, v, scale, causal):  # (T, H, D) or (B, T, H, D)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3), scale=scale, is_causal=causal)
        return out.transpose(-2, -3)

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        return sdpa_bshd(q, k, v, softmax_scale, causal)

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
        assert max_k == int((cu_k[1:] - cu_k[:-1]).max())
        return torch.cat([sdpa_bshd(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]],
                                    softmax_scale, causal) for i in range(len(cu_q) - 1)])

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("with_padding,causal", [(True, False), (False, True), (False, False)])
def test_flash_attn_adapter_plumbing(monkeypatch, with_padding, causal):
    import sys

    from ast_t5.modules.flash_attn_adapter import flash_attn_bshd

    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn_module())
    q_len, k_len = (6, 6) if causal else (5, 11)
    q, k, v, _, pad = make_inputs(torch.float32, q_len, k_len, with_bias=False, with_padding=with_padding)
    out = flash_attn_bshd(q, k, v, pad, causal, 0.0, 0.5)
    ref = run("torch", (q, k, v, None, pad), causal, scale=0.5)
    assert out.shape == ref.shape and (out - ref).abs().max() < 1e-5
