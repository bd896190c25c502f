"""Tests for ast_t5.modules.attention_backends and relative_position_bias (CPU)."""
import contextlib
import logging

import pytest
import torch

from ast_t5.modules import attention_backends as ab
from ast_t5.modules.relative_position_bias import (RelativeBias, RelativePositionBias, distance_buckets, distance_grad,
                                                   distance_grad_reference, distance_index, relative_position_bucket)

from ..conftest import load_benchmark, load_script

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


def _untapped_fold(bias, pad, causal, dtype=None):
    """The folded mask as a plain tensor of the graph: what `fold_masks` returned before `TappedMask`."""
    bias = bias if dtype is None else bias.to(dtype)
    masked = ab._boolean_mask(pad, causal, bias.size(-2), bias.size(-1), bias.device)
    return bias if masked is None else bias.masked_fill(masked, ab._mask_value(bias.dtype))


def _stack(folded, q, k, v, backend, layers=3):
    x = q
    for _ in range(layers):
        x = ab.attention(x, k, v, bias=folded, backend=backend)
    return x


@pytest.mark.parametrize("backend", ["sdpa", "torch"])
@pytest.mark.parametrize("with_padding,causal", [(True, False), (False, False), (True, True), (False, True)])
def test_a_stacks_tapped_mask_gives_the_bias_the_folded_masks_gradient(backend, with_padding, causal):
    """Layers sharing a `TappedMask` compute what layers sharing the folded tensor compute, and each
    layer's share of the mask's gradient reaches the table, summed over the batch by that layer.
    The loss leaves out the rows with no key to attend to (causal queries before the left padding's
    end), as every loss of the model does (they are padding): there the two differ by design."""
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=not causal).double()
    q, k, v, _, pad = make_inputs(torch.float64, 11, 11, False, with_padding, batch=3)
    live = torch.ones(3, 1, 11, 1, dtype=torch.float64)
    if with_padding and causal:
        live[1, :, :2] = 0  # make_inputs pads sample 1's first two keys: its first two causal rows see none
    results = []
    for tapped in (True, False):
        rel = module(11, 11)
        if tapped:
            folded, fpad, fcausal = ab.fold_masks(backend, rel, pad, causal)
            assert isinstance(folded, ab.TappedMask) and fpad is None and fcausal is False
        else:
            folded = _untapped_fold(rel.dense(), pad, causal)
        out = _stack(folded, q, k, v, backend)
        results.append((out, torch.autograd.grad((out * live).square().sum(), (q, k, v, module.embedding.weight))))
    (out, grads), (ref, ref_grads) = results
    assert torch.equal(out, ref)
    for g, r in zip(grads, ref_grads):
        assert (g - r).abs().max() <= 1e-12 * r.abs().max()
    assert grads[3].abs().sum() > 0


def test_a_bf16_tables_tapped_gradient_is_summed_in_float32():
    """A bf16 model's (1, H, T, S) bias: the layers' shares are summed over the batch and added up in
    float32, then rounded once, as the folded tensor's fused sum did (not rounded per layer)."""
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True).to(torch.bfloat16)
    q, k, v, _, pad = make_inputs(torch.bfloat16, 40, 40, False, True, batch=4)
    folded, _, _ = ab.fold_masks("sdpa", module(40, 40), pad, False, dtype=torch.bfloat16)
    assert folded.bias.dtype == torch.float32 and folded.mask.dtype == torch.bfloat16
    grad_table = torch.autograd.grad(_stack(folded, q, k, v, "sdpa").float().sum(), module.embedding.weight)[0]
    exact_module = RelativePositionBias(HEADS, 32, 128, bidirectional=True).double()
    exact_module.load_state_dict(module.state_dict())
    exact = _untapped_fold(exact_module(40, 40).dense(), pad, False)
    with torch.no_grad():  # the same bf16 inputs, in fp64
        q64, k64, v64 = (t.double() for t in (q, k, v))
    exact_grad = torch.autograd.grad(_stack(exact, q64, k64, v64, "sdpa").sum(), exact_module.embedding.weight)[0]
    assert grad_table.dtype == torch.bfloat16
    assert (grad_table.double() - exact_grad).abs().max() <= 0.02 * exact_grad.abs().max()


class _FullSizeOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Every op dispatched (``names``); the adds, masked fills and sums whose output has ``shape``
    (``full``); the calls of `ab.sum_over_batch` (``sums``)."""

    def __init__(self, shape=()):
        super().__init__()
        self.shape, self.full, self.sums, self.names = tuple(shape), [], 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(func.__name__)
        if func is torch.ops.ast_t5.sum_over_batch.default:
            self.sums += 1
        elif torch.is_tensor(out) and tuple(out.shape) == self.shape and func.__name__.split(".")[0] in (
                "add", "add_", "masked_fill", "sum"):
            self.full.append(func.__name__)
        return out


def test_each_layer_reads_its_mask_gradient_once_and_nothing_adds_them_at_full_size():
    """Eager backward of a 3-layer stack: the tapped mask's gradient is read once per layer by
    `sum_over_batch`, and no (B, H, T, S) gradient is added to another or masked; the folded tensor's
    are (autograd adds the layers' gradients one by one, then masks the sum)."""
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    q, k, v, _, pad = make_inputs(torch.float32, 24, 24, False, True, batch=3)
    full = (3, HEADS, 24, 24)
    for tapped in (True, False):
        rel = module(24, 24)
        folded = ab.fold_masks("sdpa", rel, pad, False)[0] if tapped else _untapped_fold(rel.dense(), pad, False)
        out = _stack(folded, q, k, v, "sdpa")
        with _FullSizeOps(full) as ops:
            torch.autograd.grad(out.sum(), module.embedding.weight)
        if tapped:
            assert ops.sums == 3 and ops.full == [], ops.full
        else:
            assert ops.sums == 0 and len(ops.full) >= 2, ops.full


def test_tapped_masks_compile_to_the_eager_gradients():
    """torch.compile (inductor, this CPU) of a 2-layer stack with padding: the table's gradient equals eager's."""
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    q, k, v, _, pad = make_inputs(torch.float32, 16, 16, False, True, batch=3)

    def step(q, k, v, pad):
        folded, _, _ = ab.fold_masks("sdpa", module(16, 16), pad, False)
        return _stack(folded, q, k, v, "sdpa", layers=2).square().sum()

    torch._dynamo.reset()
    grads = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        grads.append(torch.autograd.grad(fn(q, k, v, pad), (q, module.embedding.weight)))
    for g, r in zip(*grads):
        assert (g - r).abs().max() <= 1e-5 * r.abs().max()


def test_fold_masks_taps_only_a_bias_that_takes_a_gradient():
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, -2:] = True
    tapped, _, _ = ab.fold_masks("sdpa", module(9, 9), pad, causal=False)
    assert isinstance(tapped, ab.TappedMask) and tapped.mask.shape == (2, HEADS, 9, 9)
    assert tapped.bias.shape == (1, HEADS, 9, 9) and not tapped.mask.requires_grad
    assert tapped.varying_tensors() == [tapped.mask, tapped.bias]
    with torch.no_grad():
        plain, _, _ = ab.fold_masks("sdpa", module(9, 9), pad, causal=False)
    assert torch.is_tensor(plain) and torch.equal(plain, tapped.mask)
    frozen = torch.randn(1, HEADS, 9, 9)  # a bias that takes no gradient
    assert torch.is_tensor(ab.fold_masks("sdpa", frozen, pad, causal=False)[0])
    per_sample = torch.randn(2, HEADS, 9, 9, requires_grad=True)  # (B, H, T, S): nothing to sum
    assert torch.is_tensor(ab.fold_masks("sdpa", per_sample, pad, causal=False)[0])


def test_a_mask_is_laid_out_as_sdpa_reads_it():
    """`_rows_aligned`: a mask whose last dimension is not a multiple of 8 becomes a view of a padded
    buffer (rows 16 elements apart here), equal in value and passing its gradient; an aligned one is
    returned as is."""
    mask = torch.randn(2, HEADS, 5, 13, requires_grad=True)
    aligned = ab._rows_aligned(mask)
    assert torch.equal(aligned, mask) and aligned.stride() == (HEADS * 5 * 16, 5 * 16, 16, 1)
    assert all(stride % ab.SDPA_MASK_ALIGNMENT == 0 for stride in aligned.stride()[:-1])
    (aligned * 2).sum().backward()
    assert torch.equal(mask.grad, torch.full_like(mask, 2.0))
    even = torch.randn(1, HEADS, 5, 16)
    assert ab._rows_aligned(even) is even


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
    full = module(6, 6).dense()
    assert full.shape == (1, HEADS, 6, 6)
    assert torch.equal(module(1, 6, query_offset=5).dense(), full[:, :, 5:6, :])


class _UnwrittenRowsGrad(torch.autograd.Function):
    """Identity whose backward puts NaN in the rows from ``used`` on (what a varlen kernel's
    backward leaves in rows of its key buffer that no sequence covers)."""

    @staticmethod
    def forward(ctx, t, used):
        ctx.used = used
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[ctx.used:] = float("nan")
        return grad, None


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
        assert max_k >= int((cu_k[1:] - cu_k[:-1]).max())
        # like the real kernels' backward: the key rows that belong to no sequence get no gradient
        # written (uninitialized memory; NaN here)
        k, v = _UnwrittenRowsGrad.apply(k, int(cu_k[-1])), _UnwrittenRowsGrad.apply(v, int(cu_k[-1]))
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


# ------------------------------------------------------------------ per-distance bias (flex's input)
@pytest.mark.parametrize("bidirectional,buckets,distance", [(True, 32, 128), (False, 32, 128), (True, 128, 256)])
@pytest.mark.parametrize("q_len,k_len,offset", [(7, 13, 0), (300, 290, 0), (1, 600, 599), (3, 20, 5)])
def test_distance_table_gives_the_bucket_of_every_pair(bidirectional, buckets, distance, q_len, k_len, offset):
    table = distance_buckets(bidirectional, buckets, distance)
    assert table.shape == (2 * distance + 1,)
    i = torch.arange(q_len)[:, None]
    j = torch.arange(k_len)[None, :]
    expected = relative_position_bucket(j - (i + offset), bidirectional, buckets, distance)
    assert torch.equal(table[distance_index(q_len, k_len, offset, distance)], expected)


def test_relative_bias_dense_equals_the_bucket_matrix_lookup():
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    rel = module(5, 300)
    assert rel.per_distance.shape == (HEADS, 2 * 128 + 1)
    buckets = relative_position_bucket(torch.arange(300)[None, :] - torch.arange(5)[:, None], True, 32, 128)
    assert torch.equal(rel.dense(), module.embedding(buckets).permute(2, 0, 1)[None])


def test_relative_bias_keeps_its_buckets_once_and_out_of_checkpoints():
    """The bucket of each distance is a buffer made at construction (not a dozen launches per call):
    it follows the module's device, keeps its integer dtype through a float cast, and is not saved,
    so checkpoints hold the table alone and load both ways."""
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=False)
    assert torch.equal(module.buckets, distance_buckets(False, 32, 128))
    assert list(module.state_dict()) == ["embedding.weight"]
    module.double()
    assert module.buckets.dtype == torch.int64
    rel = module(4, 9)
    assert torch.equal(rel.per_distance, module.embedding(distance_buckets(False, 32, 128)).t())
    fresh = RelativePositionBias(HEADS, 32, 128, bidirectional=False).double()
    fresh.load_state_dict(module.state_dict(), strict=True)
    assert torch.equal(fresh(4, 9).dense(), rel.dense())


@pytest.mark.parametrize("q_len,k_len,offset", [(6, 11, 0), (2, 9, 7)])
def test_distance_gradient_formula_matches_autograd_of_the_eager_path(q_len, k_len, offset):
    """The table gradient = scatter-sum of dS over (batch, diagonal), then over buckets: checked
    against autograd through the dense (B, H, T, S) eager path (max_distance 4: most pairs saturate)."""
    torch.manual_seed(0)
    module = RelativePositionBias(HEADS, 6, 4, bidirectional=offset == 0).double()
    q, k, v, _, pad = make_inputs(torch.float64, q_len, k_len, with_bias=False, with_padding=True)
    rel = module(q_len, k_len, query_offset=offset)
    rel.per_distance.retain_grad()
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) + rel.dense()
    scores.retain_grad()
    probs = scores.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
    out = torch.einsum("bhts,bhsd->bhtd", probs, v)
    out.backward(torch.randn_like(out))
    by_distance = distance_grad_reference(scores.grad, 4, offset)
    assert (by_distance - rel.per_distance.grad).abs().max() < 1e-12
    buckets = distance_buckets(offset == 0, 6, 4)
    table_grad = torch.zeros(6, HEADS, dtype=torch.float64).index_add_(0, buckets, by_distance.t())
    assert (table_grad - module.embedding.weight.grad).abs().max() < 1e-12
    assert module.embedding.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("q_len,k_len,offset,max_distance", [(6, 11, 0, 4), (2, 9, 7, 4), (13, 5, 0, 3),
                                                             (4, 4, 0, 9), (1, 7, 30, 4), (9, 9, 0, 1)])
def test_distance_grad_sums_the_diagonals_the_scatter_reference_sums(q_len, k_len, offset, max_distance):
    """The rows shifted into columns, then folded at +-M: the reference's scatter, value for value
    (T > S, S > T, distances that all saturate, an M beyond every distance, decoder offsets)."""
    torch.manual_seed(q_len * 100 + k_len)
    grad = torch.randn(3, HEADS, q_len, k_len, dtype=torch.float64)
    got = distance_grad(grad, max_distance, offset)
    assert got.shape == (HEADS, 2 * max_distance + 1)
    assert (got - distance_grad_reference(grad, max_distance, offset)).abs().max() < 1e-12
    half = grad.to(torch.bfloat16)  # a bf16 gradient is summed in fp32, as the reference does
    assert distance_grad(half, max_distance, offset).dtype == torch.float32
    assert torch.allclose(distance_grad(half, max_distance, offset),
                          distance_grad_reference(half, max_distance, offset), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_bias_gradient_is_the_gathers_gradient(dtype):
    """`RelativeBias.dense` has its own backward (`distance_grad`): the same gradient as autograd
    through a plain gather of the per-distance table, in the table's dtype."""
    torch.manual_seed(1)
    q_len, k_len, offset, max_distance = 7, 12, 3, 5
    table = torch.randn(HEADS, 2 * max_distance + 1, dtype=dtype)
    grad = torch.randn(1, HEADS, q_len, k_len, dtype=dtype)
    ours = table.clone().requires_grad_()
    RelativeBias(ours, q_len, k_len, offset).dense().backward(grad)
    plain = table.clone().requires_grad_()
    plain[:, distance_index(q_len, k_len, offset, max_distance)].unsqueeze(0).backward(grad)
    assert ours.grad.dtype == dtype
    assert torch.allclose(ours.grad, plain.grad, rtol=1e-6, atol=1e-5)
    assert torch.equal(RelativeBias(table, q_len, k_len, offset).dense()[0],
                       table[:, distance_index(q_len, k_len, offset, max_distance)])


# ops that inductor lowers to one atomic add per element on a GPU (embedding_dense_backward only for
# the bias tables' lookups of 2 M + 1 rows, and the token embeddings': one row per token)
SCATTERS = {torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
            torch.ops.aten._unsafe_index_put.default, torch.ops.aten.scatter_add.default,
            torch.ops.aten.scatter_add_.default, torch.ops.aten.index_add.default, torch.ops.aten.index_add_.default}


def compiled_backward_ops(fn, **compile_kwargs):
    """``torch.compile(fn)`` through aot_autograd (the graphs inductor gets), and the list that
    collects the ops of every backward graph it compiles."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    ops = []

    def backward_compiler(graph, _):
        ops.extend(node.target for node in graph.graph.nodes if node.op == "call_function")
        return make_boxed_func(graph.forward)

    backend = aot_autograd(fw_compiler=lambda graph, _: make_boxed_func(graph.forward), bw_compiler=backward_compiler)
    return torch.compile(fn, backend=backend, **compile_kwargs), ops


def test_compiled_dense_bias_backward_has_no_scatter():
    """Under torch.compile the gather's own backward is an accumulating index_put of every (b, h, i,
    j) onto the H (2 M + 1) table entries, which inductor makes one atomic add per element on a GPU,
    fused with the batch sum: on an H200 (2026-11-27) 1.3 s of a 1.4 s T5-base update (sdpa with
    the bias as a tensor). `dense`'s backward graph must hold no scatter at any length (dynamic
    shapes), and give the eager gradient."""
    def step(table, grad):
        return (RelativeBias(table, grad.size(-2), grad.size(-1)).dense() * grad).sum()

    torch._dynamo.reset()
    compiled, backward_ops = compiled_backward_ops(step, dynamic=True)
    torch.manual_seed(2)
    for q_len, k_len in ((24, 24), (40, 17), (33, 50)):
        table = torch.randn(HEADS, 2 * 8 + 1, requires_grad=True)
        grad = torch.randn(2, HEADS, q_len, k_len)
        compiled(table, grad).backward()
        got, table.grad = table.grad, None
        step(table, grad).backward()
        assert torch.allclose(got, table.grad, rtol=1e-5, atol=1e-4)
    torch._dynamo.reset()
    assert backward_ops, "no backward graph was compiled: the compiled path did not run"
    assert not SCATTERS.intersection(backward_ops), "the bias gradient compiled to a scatter (atomic adds)"


@pytest.mark.parametrize("arch", ["t5_v11_tiny", "ast_t5_paper_tiny"])
@pytest.mark.parametrize("backend", ["sdpa", "torch"])
def test_compiled_training_step_has_no_scatter_in_its_backward(arch, backend):
    """The whole model's compiled forward and backward (both families: bias in every layer or in the
    first): no scatter anywhere in the backward, where the bias tables' gradients are made."""
    from fairseq.data import Dictionary

    from ast_t5.models.ast_t5_model import AstT5Model

    dictionary = Dictionary()
    for i in range(60):
        dictionary.add_symbol(f"tok{i}")
    torch.manual_seed(3)
    model = AstT5Model.from_dictionary(dictionary, arch=arch, dropout=0.0, attention_backend=backend)
    torch._dynamo.reset()
    compiled, backward_ops = compiled_backward_ops(model)
    src = torch.randint(4, 60, (2, 24))
    src[1, -4:] = dictionary.pad()
    out, _ = compiled(src, torch.tensor([24, 20]), torch.randint(4, 60, (2, 10)))
    out.float().sum().backward()
    torch._dynamo.reset()
    assert torch.ops.aten.embedding_dense_backward.default in backward_ops  # the graph is the model's
    assert not SCATTERS.intersection(backward_ops), sorted(map(str, SCATTERS.intersection(backward_ops)))



def test_dense_bias_backward_compiles_to_gpu_kernels():
    """inductor's GPU code generation (Triton) of the bias gradient under dynamic shapes. On an
    H200 (2026-11-27) the first `distance_grad`, its two ends joined to the rest by `cat`, failed
    there: "The argument '((-1)) + 384' is not comparable" (the GPU lowering of a cat wraps each
    piece's index in an opaque term, which the tiling heuristic compared with the gather's clamp),
    so every compiled training step on a GPU failed while every CPU test passed, inductor's C++
    backend taking another path. On a CUDA host the step is compiled and run for real and its
    gradient checked; on a CPU host `scripts/check_gpu_codegen.py`'s `gpu_codegen_on_cpu` has
    inductor generate Triton kernels for CPU tensors (nothing runs: the graphs must compile). The
    old `cat` fails this way under torch 2.11, the GPU host's (checked on the CPU); torch 2.13's
    inductor compiles it."""
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    table_module = RelativePositionBias(HEADS, 32, 128, bidirectional=True).to(device)

    def step(x):
        return (x + table_module(x.size(-2), x.size(-1)).dense()).float().pow(2).sum()

    if cuda:
        context = contextlib.nullcontext([])
    else:
        codegen = load_script("check_gpu_codegen")
        context = codegen.gpu_codegen_on_cpu()
    torch._dynamo.reset()
    try:
        with context as kernels:
            compiled = torch.compile(step, dynamic=True)
            torch.manual_seed(4)
            for q_len, k_len in ((384, 384), (192, 64), (130, 300)):
                x = torch.randn(2, HEADS, q_len, k_len, device=device, dtype=torch.bfloat16)
                compiled(x).backward()
                got, table_module.embedding.weight.grad = table_module.embedding.weight.grad, None
                assert got is not None
                if cuda:
                    step(x).backward()
                    expected, table_module.embedding.weight.grad = table_module.embedding.weight.grad, None
                    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
            assert cuda or kernels, "no Triton kernel was generated"
    except Exception as e:
        if not cuda and type(e).__name__ == "CodegenUnavailable":
            pytest.skip(str(e))
        raise
    finally:
        torch._dynamo.reset()

# ---------------------------------------------------------------------------------- auto's table
@pytest.fixture
def fake_sm(monkeypatch):
    def set_sm(value):
        monkeypatch.setattr(ab, "_capability", lambda device: value if device.type == "cuda" else 0)
    return set_sm


@pytest.mark.parametrize("sm,dtype,dropout,bias,q_len,expected", [
    (90, torch.bfloat16, 0.0, True, 1024, "sdpa"),  # sm90: sdpa won the T5-base step (H200, 2026-11-26)
    (90, torch.bfloat16, 0.1, True, 1024, "sdpa"),
    (90, torch.float16, 0.0, True, 512, "sdpa"),
    (90, torch.bfloat16, 0.0, True, 128, "sdpa"),
    (90, torch.bfloat16, 0.0, True, 1, "sdpa"),  # incremental decoding
    (80, torch.bfloat16, 0.0, True, 1024, "flex"),
    (80, torch.float16, 0.0, True, 512, "flex"),
    (80, torch.bfloat16, 0.1, True, 1024, "sdpa"),  # flex has no dropout; fused lost to sdpa
    (80, torch.bfloat16, 0.0, True, 1, "sdpa"),  # incremental decoding: no flex recompiles
    (80, torch.bfloat16, 0.0, True, 128, "sdpa"),  # one flex block: its own compiled-graph class
    (80, torch.bfloat16, 0.0, True, 129, "flex"),
    (90, torch.float32, 0.0, True, 1024, "sdpa"),
    (75, torch.float16, 0.0, True, 1024, "sdpa"),
    (90, torch.bfloat16, 0.1, False, 1024, "sdpa"),  # bias-free: varlen flash lost the step to sdpa
    (90, torch.bfloat16, 0.0, False, 1, "sdpa"),
    (80, torch.bfloat16, 0.0, False, 1024, "sdpa"),
    (90, torch.float32, 0.0, False, 1024, "sdpa"),
])
def test_auto_table(fake_sm, sm, dtype, dropout, bias, q_len, expected):
    fake_sm(sm)
    assert ab.auto_choice(torch.device("cuda"), dtype, dropout, bias, q_len)[0] == expected


def test_auto_never_picks_a_backend_that_lost(fake_sm):
    """fused lost to sdpa on the H100; triton, flex and varlen flash lost the T5-base step to sdpa on
    an H200 (BENCHMARKS.md): no row of the table may send an sm90 call to them."""
    fake_sm(90)
    assert not {"fused", "triton", "flash"} & {rule.backend for rule in ab.AUTO_TABLE}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for dropout in (0.0, 0.1):
            for bias in (True, False):
                for q_len in (1, 128, 129, 512, 2048):
                    assert ab.auto_choice(torch.device("cuda"), dtype, dropout, bias, q_len)[0] == "sdpa"
    for device in ("cpu", "cuda"):
        for dtype in (torch.float32, torch.bfloat16):
            for dropout in (0.0, 0.1):
                for bias in (True, False):
                    choice, _ = ab.auto_choice(torch.device(device), dtype, dropout, bias, 1024)
                    assert choice in ("sdpa", "flex") and (device == "cuda" or choice == "sdpa")


def test_fold_masks_keeps_the_bias_per_distance_for_flex():
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    folded, folded_pad, folded_causal = ab.fold_masks("flex", module(9, 9), pad, causal=False)
    assert isinstance(folded, ab.FoldedBias) and folded.dense is None
    assert folded_pad is None and folded_causal is False
    assert folded.rel.per_distance.shape == (HEADS, 257)
    dense, _, _ = ab.fold_masks("auto", module(9, 9), pad, causal=False)  # CPU: dense, as before
    assert isinstance(dense, ab.TappedMask) and dense.mask.shape == (2, HEADS, 9, 9)  # the table takes a gradient


@pytest.mark.parametrize("sm,dropout,q_len,expected", [
    (90, 0.0, 512, "sdpa"), (90, 0.1, 128, "sdpa"),  # measured on sm90 (H200): sdpa wins the step
    (80, 0.0, 512, "flex"), (80, 0.1, 512, "sdpa"),  # sm80: the H100 figures of the attention alone
    (100, 0.0, 512, "flex"), (100, 0.1, 512, "sdpa")])  # newer GPUs: not measured either
def test_auto_table_sends_every_call_on_sm90_to_sdpa(sm, dropout, q_len, expected, monkeypatch):
    monkeypatch.setattr(ab, "_capability", lambda device: sm)
    backend, evidence = ab.auto_choice(torch.device("cuda"), torch.bfloat16, dropout, True, q_len)
    assert backend == expected, evidence
    assert "2026-11-26" in evidence if sm == 90 else "H100" in evidence
    assert ab.auto_choice(torch.device("cuda"), torch.bfloat16, dropout, False, q_len)[0] == "sdpa"


@pytest.mark.parametrize("choice", ["flex", "triton", "sdpa"])
def test_fold_masks_auto_prepares_only_the_form_of_the_backend_the_table_gives(choice, monkeypatch):
    """With the dropout known (the stacks always pass it), ``auto`` builds no dense (B, H, T, S)
    bias beside a per-distance one, and a table row for triton gets the per-distance bias too."""
    seen = []
    monkeypatch.setattr(ab, "auto_choice", lambda *a: (seen.append(a), (choice, "test row"))[1])
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.enable_grad():
        folded, fpad, fcausal = ab.fold_masks("auto", module(9, 9), pad, causal=False,
                                              dtype=torch.bfloat16, dropout_p=0.0)
    assert seen and seen[0][1:] == (torch.bfloat16, 0.0, True, 9)
    if choice == "sdpa":  # the dense mask, tapped: the table takes a gradient
        assert isinstance(folded, ab.TappedMask) and folded.mask.shape == (2, HEADS, 9, 9)
    else:
        assert isinstance(folded, ab.FoldedBias) and folded.dense is None and folded._flex_dense is None
        assert folded.key_padding_mask is pad and fpad is None and fcausal is False


def test_stacks_tell_fold_masks_their_attention_dropout(monkeypatch):
    from ast_t5.models import AstT5Model, t5_stacks

    from .test_model import make_batch, make_dictionary

    calls = []
    real = t5_stacks.fold_masks
    monkeypatch.setattr(t5_stacks, "fold_masks", lambda *a, **k: (calls.append(k["dropout_p"]), real(*a, **k))[1])
    model = AstT5Model.from_dictionary(make_dictionary(), arch="t5_v11_tiny", attention_dropout=0.1)
    src, prev = make_batch(60)[:2]
    model.train()
    model(src, None, prev)
    model.eval()
    model(src, None, prev)
    assert calls == [0.1, 0.1, 0.0, 0.0]  # encoder, decoder; training, then evaluation


@pytest.mark.parametrize("case", [c for c in CASES if c[2]])
def test_flex_with_dropout_falls_back_to_sdpa_with_the_same_result(case):
    """Flex has no dropout: the call densifies its per-distance bias and runs sdpa (CPU, eager)."""
    q_len, k_len, _, with_padding, causal = case
    q, k, v, _, pad = make_inputs(torch.float64, q_len, k_len, with_bias=False, with_padding=with_padding)
    rel = RelativePositionBias(HEADS, 32, 128, bidirectional=not causal).double()(q_len, k_len)
    folded, fpad, fcausal = ab.fold_masks("flex", rel, pad, causal)
    torch.manual_seed(3)
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, bias=folded, key_padding_mask=fpad, causal=fcausal, dropout_p=0.2, backend="flex")
    assert ab.DISPATCH_COUNTS["sdpa"] == 1 and ab.DISPATCH_COUNTS["flex"] == 0
    torch.manual_seed(3)
    ref = ab.attention(q, k, v, bias=rel.dense(), key_padding_mask=pad, causal=causal, dropout_p=0.2, backend="sdpa")
    assert (out - ref).abs().max() < 1e-12


def test_flex_forward_in_the_model_matches_eager_and_compiles_once_per_graph():
    """Tiny T5 v1.1 on CPU, eval: encoder (bias + padding block mask) and decoder (bias + causal)
    through FlexAttention equal the eager reference; the second layer and a second forward with
    other tokens reuse the compiled graphs; under torch.inference_mode too (the mask kept for the layers
    was keyed on its version counter, which inference tensors lack). (FlexAttention compiles forward on
    CPU: ~20 s each.)"""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", attention_backend="flex").eval()
    reference = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", attention_backend="torch").eval()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(d), (2, 21), generator=g)
    src[1, -6:] = d.pad()
    prev = torch.randint(4, len(d), (2, 9), generator=g)
    ab.DISPATCH_COUNTS.clear()
    with torch.no_grad():
        out = model(src, None, prev)[0]
        assert ab.DISPATCH_COUNTS["flex"] == 4  # 2 encoder + 2 decoder self-attention layers
        assert (out - reference(src, None, prev)[0]).abs().max() < 1e-4
        from torch._dynamo.utils import counters
        graphs = counters["stats"]["unique_graphs"]
        src2 = src.flip(0)  # other padding per row, same shapes
        assert (model(src2, None, prev)[0] - reference(src2, None, prev)[0]).abs().max() < 1e-4
        assert counters["stats"]["unique_graphs"] == graphs  # no recompilation
    with torch.inference_mode():  # an inference tensor's mask has no version counter to key the kept block mask on
        assert (model(src, None, prev)[0] - out).abs().max() < 1e-6


# --------------------------------------------------------------- GPU: fast paths must really run
_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex backward, "
                                        "flash/varlen kernels and the cuDNN guards run only there)")


def requires_cuda(test):
    """Skipped with a reason without a GPU; marked ``cuda`` so `scripts/gpu_check.sh` runs it in its
    CUDA step (``pytest -m cuda``)."""
    return pytest.mark.cuda(_skip_without_cuda(test))


def _cuda_inputs(dtype, q_len, k_len, batch=3, heads=4, head_dim=64, pad=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=g).requires_grad_()
               for n in (q_len, k_len, k_len))
    mask = None
    if pad:
        mask = torch.zeros(batch, k_len, dtype=torch.bool, device="cuda")
        mask[0, k_len - k_len // 3:] = True
        mask[1, : k_len // 5] = True
    return q, k, v, mask


def _kernel_names(fn):
    """Names of the CUDA kernels ``fn`` launched (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key.lower() for e in prof.key_averages()]


@requires_cuda
@pytest.mark.parametrize("table_grad", ["dense", "distance"])
@pytest.mark.parametrize("q_len,causal", [(192, False), (1024, False), (320, True)])
def test_flex_forward_and_backward_on_gpu_match_eager_and_reach_the_table(monkeypatch, table_grad, q_len, causal):
    monkeypatch.setattr(ab, "FLEX_TABLE_GRAD", table_grad)
    torch.manual_seed(0)
    module = RelativePositionBias(4, 32, 128, bidirectional=not causal).cuda()
    q, k, v, pad = _cuda_inputs(torch.bfloat16, q_len, q_len, pad=not causal)
    grad_out = torch.randn_like(q)
    results = {}
    for backend in ("flex", "torch"):
        module.zero_grad()
        folded, fpad, fcausal = ab.fold_masks(backend, module(q_len, q_len), pad, causal, dtype=torch.bfloat16)
        ab.DISPATCH_COUNTS.clear()
        out = ab.attention(q, k, v, bias=folded, key_padding_mask=fpad, causal=fcausal, backend=backend)
        assert ab.DISPATCH_COUNTS[backend] == 1
        grads = torch.autograd.grad(out, (q, k, v, module.embedding.weight), grad_out)
        results[backend] = (out.float(), [g.float() for g in grads])
    # fp32 reference for the error scale: PyTorch's own bf16 error
    module32 = module.float()
    folded, fpad, fcausal = ab.fold_masks("torch", module32(q_len, q_len), pad, causal)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out32 = ab.attention(q32, k32, v32, bias=folded, key_padding_mask=fpad, causal=fcausal, backend="torch")
    exact = (out32, torch.autograd.grad(out32, (q32, k32, v32, module32.embedding.weight), grad_out.float()))
    for i, (flex_t, eager_t, exact_t) in enumerate(zip([results["flex"][0], *results["flex"][1]],
                                                       [results["torch"][0], *results["torch"][1]],
                                                       [exact[0], *exact[1]])):
        flex_err = (flex_t - exact_t).abs().max().item()
        eager_err = (eager_t - exact_t).abs().max().item()
        assert flex_err <= 4 * eager_err + 1e-3 * exact_t.abs().max().item(), (i, flex_err, eager_err)
    assert results["flex"][1][3].abs().sum() > 0  # the table got a gradient
    folded, _, _ = ab.fold_masks("flex", module(q_len, q_len), pad, causal, dtype=torch.bfloat16)
    names = _kernel_names(lambda: ab.attention(q, k, v, bias=folded, backend="flex").sum().backward())
    assert any("flex" in n or "triton_tem" in n for n in names), names  # inductor's flex templates
    assert not any("fmha" in n or "flash" in n or "efficient" in n for n in names), names  # not SDPA


@requires_cuda
@pytest.mark.parametrize("k_len", [437, 512])
def test_a_stacks_mask_on_gpu_is_not_padded_again_by_sdpa(k_len):
    """Eager SDPA pads a mask whose rows are not 8 elements apart in every call; `fold_masks` lays a
    stack's mask out aligned once, so no call pads it, and the results equal a contiguous mask's."""
    q, k, v, pad = _cuda_inputs(torch.bfloat16, k_len, k_len)
    module = RelativePositionBias(4, 32, 128, bidirectional=True).cuda()
    folded, _, _ = ab.fold_masks("sdpa", module(k_len, k_len), pad, False, dtype=torch.bfloat16)
    assert all(stride % ab.SDPA_MASK_ALIGNMENT == 0 for stride in folded.mask.stride()[:-1])
    with _FullSizeOps() as ops:
        out = ab.attention(q, k, v, bias=folded, backend="sdpa")
    assert "constant_pad_nd" not in " ".join(ops.names), ops.names
    grads = torch.autograd.grad(out, (q, module.embedding.weight), torch.ones_like(out))
    contiguous = folded.mask.contiguous()
    ref = ab.attention(q, k, v, bias=contiguous, backend="sdpa")
    ref_grad_q = torch.autograd.grad(ref, q, torch.ones_like(ref))[0]
    assert torch.equal(out, ref)  # the same kernel on the same values
    # its backward may sum the query gradient in another order (atomic adds): close, not equal
    assert (grads[0].float() - ref_grad_q.float()).abs().max() <= 1e-2 * ref_grad_q.float().abs().max()
    assert torch.isfinite(grads[1]).all() and grads[1].abs().sum() > 0


@requires_cuda
@pytest.mark.parametrize("k_len", [192, 320, 1024])  # seq % 128 == 64: the cuDNN NaN grad_q shapes
@pytest.mark.parametrize("backend", ["sdpa", "auto", "flash"])
def test_masked_calls_on_gpu_stay_finite_and_flash_keeps_bias_free_padding_on_flash(backend, k_len):
    q, k, v, pad = _cuda_inputs(torch.bfloat16, k_len, k_len)
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, key_padding_mask=pad, backend=backend)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    ref = ab.attention(*(t.detach().float() for t in (q, k, v)), key_padding_mask=pad, backend="torch")
    assert (out.float() - ref).abs().max() < 3e-2
    if backend == "flash":  # padding does not push bias-free calls off flash
        assert ab.DISPATCH_COUNTS["flash-attn"] + ab.DISPATCH_COUNTS["torch-varlen"] == 1, ab.DISPATCH_COUNTS
    else:  # auto: SDPA's masked kernel, faster in the T5-base step than varlen flash (AUTO_TABLE)
        assert ab.DISPATCH_COUNTS["sdpa-masked-no-cudnn"] == 1, ab.DISPATCH_COUNTS


@requires_cuda
@pytest.mark.parametrize("k_len", [192, 1024])
def test_biased_sdpa_on_gpu_never_gets_an_fp32_mask_with_bf16_queries(k_len):
    q, k, v, pad = _cuda_inputs(torch.bfloat16, k_len, k_len)
    bias = torch.randn(1, 4, k_len, k_len, device="cuda", requires_grad=True)  # fp32 bias, bf16 q
    out = ab.attention(q, k, v, bias=bias, key_padding_mask=pad, backend="sdpa", dropout_p=0.0)
    grads = torch.autograd.grad(out, (q, bias), torch.ones_like(out))
    ref = ab.attention(*(t.detach().float() for t in (q, k, v)), bias=bias.detach(), key_padding_mask=pad,
                       backend="torch")
    assert all(torch.isfinite(g).all() for g in grads)
    assert (out.float() - ref).abs().max() < 3e-2


@requires_cuda
def test_auto_on_gpu_dispatches_the_tables_backends():
    """The kernels that ran are those of the backend `AUTO_TABLE` gives for this GPU: on sm90 SDPA for
    all three calls (its masked kernel for the two with masks), elsewhere flex for the biased one."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("auto's flex row needs sm80+")
    choice = ab.auto_choice(torch.device("cuda"), torch.bfloat16, 0.0, True, 512)[0]
    assert choice in ("sdpa", "flex") and (choice == "sdpa") == (torch.cuda.get_device_capability() == (9, 0))
    q, k, v, pad = _cuda_inputs(torch.bfloat16, 512, 512)
    module = RelativePositionBias(4, 32, 128, bidirectional=True).cuda()
    folded, fpad, fcausal = ab.fold_masks("auto", module(512, 512), pad, False, dtype=torch.bfloat16)
    ab.DISPATCH_COUNTS.clear()
    ab.attention(q, k, v, bias=folded, key_padding_mask=fpad, causal=fcausal, backend="auto")
    ab.attention(q, k, v, key_padding_mask=pad, backend="auto")
    ab.attention(q, k, v, causal=True, backend="auto")
    if choice == "flex":
        assert ab.DISPATCH_COUNTS["flex"] == 1, ab.DISPATCH_COUNTS
    # the biased call's masks are folded into its bias; the padded bias-free call takes a mask; the
    # causal one none (SDPA's is_causal)
    assert ab.DISPATCH_COUNTS["sdpa-masked-no-cudnn"] == (2 if choice == "sdpa" else 1), ab.DISPATCH_COUNTS
    assert ab.DISPATCH_COUNTS["sdpa"] == 1, ab.DISPATCH_COUNTS
    assert not {"flash-attn", "torch-varlen", "sdpa-flash", "triton-rpe"} & set(ab.DISPATCH_COUNTS)


@pytest.mark.parametrize("head_dim", [HEAD_DIM, 4, 12])
def test_torch_varlen_adapter_plumbing(head_dim):
    """Unpadding + cu_seqlens for PyTorch's varlen kernel, with a CPU stand-in for the kernel that, as
    the kernel, refuses head sizes that are not multiples of 8: the adapter pads them (the narrow
    models of bench_host_overhead.py have head size 4, their cross-attention runs here on a GPU)."""
    from ast_t5.modules.flash_attn_adapter import torch_varlen_bshd

    fake = fake_flash_attn_module().flash_attn_varlen_func

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=None):
        assert q.size(-1) % 8 == 0, "head_size must be a multiple of 8, this is ensured by padding!"
        return fake(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale)

    q, k, v, _, pad = make_inputs(torch.float32, 5, 11, with_bias=False, with_padding=True)
    q, k, v = (t[..., :head_dim].detach().requires_grad_() if head_dim <= HEAD_DIM else
               torch.cat([t, t], -1)[..., :head_dim].detach().requires_grad_() for t in (q, k, v))
    out = torch_varlen_bshd(q, k, v, pad, 0.5, varlen_attn=varlen_attn)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = run("torch", (q, k, v, None, pad), False, scale=0.5)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert out.shape == ref.shape and (out - ref).abs().max() < 1e-5
    for g, r in zip(grads, ref_grads):  # finite: the unwritten rows' NaN never reaches the inputs
        assert torch.isfinite(g).all() and (g - r).abs().max() < 1e-5


def test_unpadding_is_one_graph_without_host_reads():
    """The varlen path's packing traces into one torch.compile graph (static shapes, no nonzero,
    no int(tensor)): a compiled model keeps cross-attention on flash without graph breaks."""
    from ast_t5.modules.flash_attn_adapter import _unpad_keys

    k, v = torch.randn(3, 10, 4, 8), torch.randn(3, 10, 4, 8)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[0, 7:], pad[2, 4:] = True, True
    explained = torch._dynamo.explain(_unpad_keys)(k, v, pad)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    k_packed, v_packed, cu_k, max_k = _unpad_keys(k, v, pad)
    assert k_packed.shape == (30, 4, 8) and max_k == 10 and cu_k.tolist() == [0, 7, 17, 21]
    assert torch.equal(k_packed[:7], k[0, :7]) and torch.equal(k_packed[7:17], k[1])
    assert torch.equal(v_packed[17:21], v[2, :4]) and not k_packed[21:].any()


def test_attention_benchmark_cpu_mode_writes_its_table(tmp_path, capsys):
    """benchmarks/bench_attention.py's CPU smoke mode (tiny shape, no flex: its CPU compile is slow).
    sdpa-prebuilt (the dense bias built outside the timed call) gets its own rows, is compared
    (``x pre``) but never wins: it leaves out the table gradient. Every timed row has its host time
    (on CPU the same as ms); ``--graph`` does nothing on CPU but show its column as n/a."""
    import json

    bench = load_benchmark("bench_attention")
    out = tmp_path / "sub" / "attention.json"
    assert bench.main(["--backends", "eager", "sdpa", "sdpa-prebuilt", "auto", "flash-nobias", "sdpa-nobias",
                       "--lengths", "24", "--dropouts", "0", "--repeats", "1", "--warmup", "0", "--graph",
                       "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert len(rows) == 12 and payload["device"] == "cpu"  # 6 backends x (no padding, padding)
    assert all(w["backend"] != "sdpa-prebuilt" for w in payload["winners"]) and len(payload["winners"]) == 2
    assert all(row["x_prebuilt"] > 0 for row in rows), rows
    # one bias-free winner per condition, among the bias-free rows, with the others' times beside it
    assert [(w["padded"], sorted([w["backend"], *w["others"]])) for w in payload["nobias_winners"]] == [
        (False, ["flash-nobias", "sdpa-nobias"]), (True, ["flash-nobias", "sdpa-nobias"])]
    for row in rows:
        assert row["ms"] > 0 and row["pass"] == "fwd+bwd", row
        assert row["host_ms"] > 0 and row["host_ms"] == row["ms"], row  # CPU: the same perf_counter samples
        assert "graph_ms" not in row and "graph_note" not in row, row
        assert row["max_err"] < 1e-5 and row["err_ratio"] is not None, row
    assert {row["ran"] for row in rows if row["backend"] == "auto"} == {"sdpa"}
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "err/ref" in line)
    assert header.split()[5:10] == ["ms", "host", "ms", "graph", "ms"], header
    eager = next(line for line in printed.splitlines() if " eager " in line)
    assert eager.split()[5:8] == [f"{rows[0]['ms']:.3f}", f"{rows[0]['host_ms']:.3f}", "n/a"], eager
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cuda"] if not torch.cuda.is_available() else ["--lengths", "1"])
    assert exc.value.code == 2


def test_attention_benchmark_records_a_backend_s_triton_error_and_measures_the_others(tmp_path, monkeypatch):
    """A backend failing with one of Triton's errors (they derive from Exception, not RuntimeError:
    a tile needing more shared memory than the GPU has raises OutOfResources at its first launch)
    gets a row with the error; the run goes on with the next backend and condition."""
    errors = pytest.importorskip("triton.runtime.errors")
    import json

    bench = load_benchmark("bench_attention", "bench_attention_errors")
    real_step_fn = bench.step_fn

    def step_fn(name, *args):
        if name != "sdpa":
            return real_step_fn(name, *args)

        def run():
            raise errors.OutOfResources(245760, 232448, "shared memory")
        return run

    monkeypatch.setattr(bench, "step_fn", step_fn)
    out = tmp_path / "attention.json"
    assert bench.main(["--backends", "eager", "sdpa", "--lengths", "24", "--dropouts", "0", "--padding", "none",
                       "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    rows = {row["backend"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["sdpa"]["ms"] is None and rows["sdpa"]["note"].startswith("OutOfResources:"), rows["sdpa"]
    assert "host_ms" not in rows["sdpa"] and " n/a n/a " in " ".join(bench.format_row(rows["sdpa"]).split())
    assert rows["eager"]["ms"] > 0 and rows["eager"]["max_err"] < 1e-5, rows["eager"]
    # dynamo's refusal past its recompile limit (flex's fullgraph wrapper) derives from Exception only too
    from torch._dynamo.exc import FailOnRecompileLimitHit

    def refused(name, *args):
        if name != "sdpa":
            return real_step_fn(name, *args)

        def run():
            raise FailOnRecompileLimitHit("recompile_limit reached with fullgraph=True")
        return run
    monkeypatch.setattr(bench, "step_fn", refused)
    assert bench.main(["--backends", "eager", "sdpa", "--lengths", "24", "--dropouts", "0", "--padding", "none",
                       "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    rows = {row["backend"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["sdpa"]["ms"] is None and rows["sdpa"]["note"].startswith("FailOnRecompileLimitHit:"), rows["sdpa"]
    assert rows["eager"]["ms"] > 0


class _FakeEvent:
    """torch.cuda.Event stand-in: each pair of records measures the next of ``TIMES``."""
    TIMES = []

    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def elapsed_time(self, end):
        return _FakeEvent.TIMES.pop(0)


def test_attention_benchmark_graph_timing_warms_up_captures_once_and_names_a_failed_capture_s_first_error(
        monkeypatch):
    """bench_attention.graph_ms (``--graph``) without a GPU, on stand-ins for torch.cuda's streams,
    events, graphs and generators: warm-up calls and the capture on the current stream (a --graph run's
    side stream), one call under the capture, the median of the replays' event times; a call that fails
    under the capture (whose end then fails too) gives the first error as the note and resets every
    CUDA generator (a failed capture leaves them marked as capturing); the graph is dropped and the
    cache emptied either way."""
    import contextlib

    bench = load_benchmark("bench_attention", "bench_attention_graph_cpu")
    log = []

    class Graph:
        def replay(self):
            log.append("replay")

    class Stream:
        pass

    current = Stream()

    @contextlib.contextmanager
    def capture(graph, stream=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local" and stream is current
        log.append("capture")
        try:
            yield
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture\nmore")
        finally:
            log.append("capture end")

    class Generator:
        def __init__(self, name):
            self.name = name

        def clone_state(self):
            return f"clone of {self.name}"

        def graphsafe_set_state(self, state):
            log.append(f"{self.name} <- {state}")

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "current_stream", lambda: current)
    monkeypatch.setattr(cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(cuda, "graph", capture)
    monkeypatch.setattr(cuda, "Event", _FakeEvent)
    monkeypatch.setattr(cuda, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(cuda, "empty_cache", lambda: log.append("empty_cache"))
    monkeypatch.setattr(cuda, "default_generators", (Generator("gen0"), Generator("gen1")))
    _FakeEvent.TIMES = [0.5, 0.2, 0.3]
    assert bench.graph_ms(lambda: log.append("call"), 3) == (0.3, None)
    warm = ["call"] * bench.GRAPH_WARMUP
    assert log == ([*warm, "capture", "call", "capture end", "replay"]
                   + ["replay", "sync"] * 3 + ["sync", "empty_cache"]), log

    def host_sync():
        if "capture" in log and "capture end" not in log:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors")

    log.clear()
    replay_ms, why = bench.graph_ms(host_sync, 3)
    assert replay_ms is None and why == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert "replay" not in log, log
    assert log[-4:] == ["gen0 <- clone of gen0", "gen1 <- clone of gen1", "sync", "empty_cache"], log
    # a reset that fails too is said in the note, not raised
    monkeypatch.setattr(cuda, "default_generators", (None,))
    log.clear()
    replay_ms, why = bench.graph_ms(host_sync, 3)
    assert replay_ms is None and why.startswith("RuntimeError: CUDA error: operation not permitted when stream is "
                                                "capturing; the CUDA generators could not be reset (AttributeError")
    # a failed capture is tried once more: a one-time failure gives the second try's figure
    tries = []

    def fails_once(fn, repeats):
        tries.append(fn)
        return (None, "AcceleratorError: first") if len(tries) == 1 else (0.7, None)

    monkeypatch.setattr(bench, "graph_ms", fails_once)
    assert bench.graph_ms_retried(print, 3) == (0.7, None, "AcceleratorError: first") and len(tries) == 2
    assert bench.graph_ms_retried(print, 3) == (0.7, None, None) and len(tries) == 3  # first try worked: no retry
    monkeypatch.setattr(bench, "graph_ms", lambda fn, repeats: (None, "RuntimeError: always"))
    assert bench.graph_ms_retried(print, 3) == (None, "RuntimeError: always", None)
    # which rows --graph captures: ours and the rows they are read against, not the dense ones
    assert all(bench.graphed(name) for name in ("triton", "triton-one-loop", "triton-far-all:64x64x64x4x2",
                                                "flash-nobias", "sdpa", "sdpa-prebuilt"))
    assert not any(bench.graphed(name) for name in ("eager", "fused", "flex", "flex-distance"))


def test_folded_bias_builds_its_dense_fallback_lazily_and_caches_it_only_without_autograd():
    module = RelativePositionBias(HEADS, 32, 128, bidirectional=True)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, -2:] = True
    folded, _, _ = ab.fold_masks("flex", module(9, 9), pad, causal=False)
    with torch.no_grad():
        first = folded.dense_mask(torch.float32)
        assert folded.dense is first and folded.dense_mask(torch.float32) is first
    with torch.no_grad():
        expected, _, _ = ab.fold_masks("sdpa", module(9, 9), pad, causal=False)
    assert torch.equal(first, expected)
    folded, _, _ = ab.fold_masks("flex", module(9, 9), pad, causal=False)
    with_grad = folded.dense_mask(torch.float32)
    assert isinstance(with_grad, ab.TappedMask) and torch.equal(with_grad.mask, expected)
    assert with_grad.bias.requires_grad and folded.dense is None  # not cached: checkpoint-safe


@requires_cuda
def test_attention_benchmark_graph_times_sdpa_and_triton_rows_on_gpu(tmp_path):
    """bench_attention.py --graph on CUDA: the sdpa and triton rows, with and without dropout and
    padding, capture in a CUDA graph (no host sync inside the call: the triton backend draws its seed
    on the device) and their replays are timed; every row has its host time too."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "attention.json"
    # in a process of its own: a capture that fails leaves CUDA state behind (the generators, before
    # `reset_cuda_generators`), which must not reach the other tests of this pytest worker
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention.py"
    done = subprocess.run([sys.executable, str(script), "--device", "cuda",
                           "--backends", "sdpa", "triton", "--lengths", "256", "--batch", "2", "--heads", "4",
                           "--head-dim", "64", "--dropouts", "0", "0.1", "--repeats", "3", "--warmup", "1",
                           "--graph", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "not timed" not in done.stdout and "first try" not in done.stdout, done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["backend"], r["dropout"], r["padded"]) for r in rows} == {
        (b, p, pad) for b in ("sdpa", "triton") for p in (0.0, 0.1) for pad in (False, True)}
    for row in rows:
        assert row["ms"] > 0 and row["host_ms"] > 0, row
        assert "graph_note" not in row and row["graph_ms"] > 0, row
    assert any(r["ran"] == "triton-rpe" for r in rows if r["backend"] == "triton"), rows


@requires_cuda
def test_flex_inside_a_compiled_model_on_gpu_matches_eager_and_runs_flex_kernels():
    """trainspeed's model.compile path: the whole model under torch.compile with the flex backend
    (dropout 0, so biased calls stay on flex), loss and gradients as in eager, flex kernels ran,
    and a second step with the same shapes compiles nothing new."""
    check_flex_in_a_compiled_model_on_gpu(checkpointing=False)


def check_flex_in_a_compiled_model_on_gpu(checkpointing: bool):
    """The test above; with activation checkpointing (`test_train_speed.py`, in the other group of
    gpu_check.sh) the forward must also be one graph: block masks built outside the layers."""
    from fairseq.data import Dictionary
    from torch._dynamo.utils import counters

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    kwargs = dict(arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0, head_dim=16)
    model = AstT5Model.from_dictionary(d, attention_backend="flex", checkpoint_activations=checkpointing,
                                       **kwargs).cuda().train()
    reference = AstT5Model.from_dictionary(d, attention_backend="torch", **kwargs).cuda().train()
    reference.load_state_dict(model.state_dict())
    src = torch.randint(4, len(d), (4, 200), device="cuda")
    src[1, -60:] = d.pad()
    prev = torch.randint(4, len(d), (4, 136), device="cuda")

    def loss_of(m):
        return m(src, None, prev)[0].float().logsumexp(-1).mean()

    if checkpointing:
        explained = torch._dynamo.explain(loss_of)(model)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
        model.zero_grad()
    compiled = torch.compile(model)
    loss = loss_of(compiled)
    loss.backward()
    ref = loss_of(reference)
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-4
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() < 1e-3 * (p_ref.grad.abs().max() + 1e-6), name
    graphs = counters["stats"]["unique_graphs"]
    names = _kernel_names(lambda: loss_of(compiled).backward())
    assert counters["stats"]["unique_graphs"] == graphs
    assert any("flex" in n or "triton_tem" in n for n in names), names


@requires_cuda
def test_compiled_bf16_model_keeps_padded_cross_attention_on_varlen_flash_in_one_graph():
    """The flash backend compiled (bf16, torch.compile): padded cross-attention runs a varlen flash
    kernel, the whole forward traces as one graph (no graph break or host read in the unpadding),
    and the compiled loss and gradients match eager."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash kernels need sm80+")
    if not (ab.torch_varlen_available() or ab.flash_attn_installed()):
        pytest.skip("neither torch.nn.attention.varlen nor flash-attn in this PyTorch")
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0, head_dim=16,
                                       attention_backend="flash").cuda().to(torch.bfloat16).train()
    src = torch.randint(4, len(d), (4, 192), device="cuda")
    src[1, -60:], src[3, -7:] = d.pad(), d.pad()
    prev = torch.randint(4, len(d), (4, 128), device="cuda")

    def loss_of(m):
        return m(src, None, prev)[0].float().logsumexp(-1).mean()

    ab.DISPATCH_COUNTS.clear()
    eager = loss_of(model)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))
    assert ab.DISPATCH_COUNTS["torch-varlen"] + ab.DISPATCH_COUNTS["flash-attn"] == len(model.decoder.layers)
    explained = torch._dynamo.explain(loss_of)(model)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(model)
    loss = loss_of(compiled)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert abs(loss.item() - eager.item()) < 2e-2 * abs(eager.item())
    for g, r in zip(grads, eager_grads):
        assert torch.isfinite(g).all() and (g.float() - r.float()).abs().max() <= 5e-2 * r.float().abs().max() + 1e-3


def test_the_flex_wrapper_raises_dynamo_s_recompile_limit(monkeypatch):
    """Eager models run flex through one compiled function (fullgraph=True), whose graphs per mask kind,
    bias form and grad mode can reach torch's default limit of 8 in a run that trains and validates on
    flex (auto on an A100); past it fullgraph raises instead of running eagerly. Making the wrapper raises
    the limit to the model's."""
    import torch._dynamo.config as dynamo_config

    from ast_t5.models.ast_t5_model import MIN_RECOMPILE_LIMIT

    monkeypatch.setattr(ab, "_FLEX_COMPILED", {})
    saved = dynamo_config.recompile_limit  # restored by hand: see test_train_speed's gpu_dispatch_on_cpu
    try:
        dynamo_config.recompile_limit = 8
        ab._flex_compiled("cpu")
        assert dynamo_config.recompile_limit == MIN_RECOMPILE_LIMIT
        dynamo_config.recompile_limit = 32  # a higher limit set by the user stays
        ab._flex_compiled("cuda")
        assert dynamo_config.recompile_limit == 32
    finally:
        dynamo_config.recompile_limit = saved
