"""A yardstick for the ``triton`` backend: bias-free FlashAttention-2 in Triton, at the same tiles.

The triton backend's kernels (`ast_t5/modules/triton_rpe_attention.py`) carry T5's relative-position
bias, the table gradient, dropout and key padding. To know what those cost, and what Triton itself
reaches at those tiles on a given GPU, this module holds the same three kernels with all of that
left out: a forward with an online softmax (log2 units, one ``exp2`` per probability), a dK/dV kernel
on transposed tiles (keys as rows) and a dQ kernel, launched with the backend's tiles, warps and
pipeline stages (`triton_rpe_attention.default_blocks`). What they keep is what any call of ours
needs as well: partial tiles masked at their edge only, and right padding as each row's end of keys
(``kv_end``: no tile past it is visited, the one straddling it is masked), so they run the
benchmark's padded conditions too. No dropout.

Not a backend: nothing dispatches it. Two uses:

- ``benchmarks/bench_attention.py``'s row ``triton-baseline`` times it beside ``triton`` and
  ``flash-nobias`` (PyTorch's flash kernels): triton - baseline is what the bias, the table gradient
  and the backend's host work cost; baseline - flash is what Triton's code at these tiles costs
  against hand-written CUDA;
- ``benchmarks/compile_triton_rpe.py --baseline`` compiles the three kernels without a GPU, beside
  the backend's, so that their instructions per element, registers and programs per SM compare.

Written for this project from the FlashAttention-2 paper (Dao, 2023); no code of other projects.
"""
import math
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure means "no triton here"
    triton = None

LOG2E = math.log2(math.e)

if triton is not None:
    _LOG2E = tl.constexpr(LOG2E)

    @triton.jit
    def _base_dot(a, b, PRECISION: tl.constexpr):
        if PRECISION == "upcast":  # Triton's interpreter multiplies bf16 operands wrongly
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def _base_program(H, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """(bh, b, h, this program's BLOCK rows, the head's BLOCK_D columns) of a (rows, B x H) grid."""
        bh = tl.program_id(1)
        return bh, bh // H, bh % H, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), tl.arange(0, BLOCK_D)

    @triton.jit
    def _base_fwd_kernel(Q, K, V, KV_END, O, LSE, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,  # noqa: E741
                         so_b, so_h, so_t, H, T, S, scale, HAS_END: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        scale = tl.cast(scale, tl.float32)
        bh, b, h, offs_m, offs_d = _base_program(H, BLOCK_M, BLOCK_D)
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :],
                    mask=offs_m[:, None] < T, other=0.0)
        hi = S
        if HAS_END:
            hi = tl.load(KV_END + b)
        qk_scale = scale * _LOG2E
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        # at least one iteration: a loop the compiler sees may run none makes ptxas serialize the
        # matrix products (`compile_triton_rpe.py`, ``ser``); a row without keys masks that tile whole
        for start_n in range(0, tl.maximum(hi, 1), BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_ok = offs_n[:, None] < hi
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_ok, other=0.0)
            s = _base_dot(q, tl.trans(k), PRECISION) * qk_scale
            if start_n + BLOCK_N > hi:  # the tile straddling the end of the keys: its only mask
                s = tl.where(offs_n[None, :] < hi, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_ok, other=0.0)
            acc = acc * alpha[:, None] + _base_dot(p.to(v.dtype), v, PRECISION)
            m_i = m_new
        has_key = l_i > 0.0
        out = acc / tl.where(has_key, l_i, 1.0)[:, None]
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < T)
        lse = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("inf"))  # log2 units
        tl.store(LSE + bh * T + offs_m, lse, mask=offs_m < T)

    @triton.jit
    def _base_dkdv_kernel(Q, K, V, KV_END, DO, LSE, DELTA, DK, DV, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t,
                          sv_b, sv_h, sv_t, sd_b, sd_h, sd_t, sg_b, sg_h, sg_t, H, T, S, scale,
                          HAS_END: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """One program per BLOCK_N keys, walking the queries BLOCK_M at a time on transposed tiles
        (keys as rows): P^T = exp2(K Q^T - lse), dV += P^T dO, dS^T = P^T (V dO^T - delta),
        dK += dS^T Q. dK and dV go to DK and DV, which share the strides sg_*."""
        scale = tl.cast(scale, tl.float32)
        bh, b, h, offs_n, offs_d = _base_program(H, BLOCK_N, BLOCK_D)
        start_n = tl.program_id(0) * BLOCK_N
        hi = S
        if HAS_END:
            hi = tl.load(KV_END + b)
        qk_scale = scale * _LOG2E
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        if start_n < hi:  # keys all past the end: zero gradients, no loop
            key_ok = offs_n < hi
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=key_ok[:, None],
                        other=0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=key_ok[:, None],
                        other=0.0)
            edge = start_n + BLOCK_N > hi
            for start_m in range(0, T, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                q_ok = offs_m < T
                q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_ok[:, None],
                            other=0.0)
                do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :],
                             mask=q_ok[:, None], other=0.0)
                lse = tl.load(LSE + bh * T + offs_m, mask=q_ok, other=float("inf"))
                delta = tl.load(DELTA + bh * T + offs_m, mask=q_ok, other=0.0)
                p_t = tl.exp2(_base_dot(k, tl.trans(q), PRECISION) * qk_scale - lse[None, :])
                if edge:
                    p_t = tl.where(key_ok[:, None], p_t, 0.0)
                dv += _base_dot(p_t.to(do.dtype), do, PRECISION)
                ds_t = p_t * (_base_dot(v, tl.trans(do), PRECISION) - delta[None, :])
                dk += _base_dot(ds_t.to(q.dtype), q, PRECISION)
        dk = dk * scale
        g = b * sg_b + h * sg_h + offs_n[:, None] * sg_t + offs_d[None, :]
        tl.store(DK + g, dk.to(DK.dtype.element_ty), mask=offs_n[:, None] < S)
        tl.store(DV + g, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < S)

    @triton.jit
    def _base_dq_kernel(Q, K, V, KV_END, DO, LSE, DELTA, DQ, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                        sd_b, sd_h, sd_t, sg_b, sg_h, sg_t, H, T, S, scale, HAS_END: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        PRECISION: tl.constexpr):
        """One program per BLOCK_M queries, walking the keys BLOCK_N at a time:
        dS = P (dO V^T - delta), dQ += dS K."""
        scale = tl.cast(scale, tl.float32)
        bh, b, h, offs_m, offs_d = _base_program(H, BLOCK_M, BLOCK_D)
        q_ok = offs_m < T
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_ok[:, None], other=0.0)
        do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :], mask=q_ok[:, None],
                     other=0.0)
        lse = tl.load(LSE + bh * T + offs_m, mask=q_ok, other=float("inf"))
        delta = tl.load(DELTA + bh * T + offs_m, mask=q_ok, other=0.0)
        hi = S
        if HAS_END:
            hi = tl.load(KV_END + b)
        qk_scale = scale * _LOG2E
        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for start_n in range(0, tl.maximum(hi, 1), BLOCK_N):  # at least once (see the forward)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_ok = offs_n[:, None] < hi
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_ok, other=0.0)
            p = tl.exp2(_base_dot(q, tl.trans(k), PRECISION) * qk_scale - lse[:, None])
            if start_n + BLOCK_N > hi:
                p = tl.where(offs_n[None, :] < hi, p, 0.0)
            ds = p * (_base_dot(do, tl.trans(v), PRECISION) - delta[:, None])
            dq += _base_dot(ds.to(k.dtype), k, PRECISION)
        dq = dq * scale
        tl.store(DQ + b * sg_b + h * sg_h + offs_m[:, None] * sg_t + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=q_ok[:, None])


def _strides(x: torch.Tensor) -> tuple:
    return x.stride(0), x.stride(1), x.stride(2)


def _launch_settings(q: torch.Tensor) -> tuple:
    """The triton backend's tiles for q (`default_blocks`, or its BLOCKS_OVERRIDE), its precision
    and BLOCK_D: (fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK, warps, stages, bwd warps, bwd STEP, bwd stages),
    precision, BLOCK_D."""
    from ast_t5.modules import triton_rpe_attention as tra

    blocks = tra.resolve_blocks(tra.BLOCKS_OVERRIDE or tra.default_blocks(q.size(-1), q.device, dtype=q.dtype))
    return blocks, tra._precision(q.dtype), max(16, tra._next_pow2(q.size(-1)))


class _BaselineAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kv_end, scale):
        B, H, T, D = q.shape
        S = k.size(2)
        (block_m, block_n, block_bwd, warps, stages, bwd_warps, step, bwd_stages), precision, block_d = \
            _launch_settings(q)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, T), device=q.device, dtype=torch.float32)
        has_end = kv_end is not None
        end = kv_end if has_end else lse  # an unread pointer
        _base_fwd_kernel[(triton.cdiv(T, block_m), B * H)](
            q, k, v, end, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o), H, T, S, scale,
            HAS_END=has_end, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, PRECISION=precision,
            num_warps=warps, num_stages=stages)
        ctx.save_for_backward(q, k, v, o, lse, kv_end)
        ctx.settings = (block_bwd, step, bwd_warps, bwd_stages, precision, block_d, scale)
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, o, lse, kv_end = ctx.saved_tensors
        block_bwd, step, warps, stages, precision, block_d, scale = ctx.settings
        B, H, T, _ = q.shape
        S = k.size(2)
        do = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        delta = (do.float() * o.float()).sum(-1)  # (B, H, T), contiguous
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        has_end = kv_end is not None
        end = kv_end if has_end else lse
        common = dict(HAS_END=has_end, BLOCK_D=block_d, PRECISION=precision, num_warps=warps, num_stages=stages)
        _base_dkdv_kernel[(triton.cdiv(S, block_bwd), B * H)](
            q, k, v, end, do, lse, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
            *_strides(dk), H, T, S, scale, BLOCK_N=block_bwd, BLOCK_M=step, **common)
        _base_dq_kernel[(triton.cdiv(T, block_bwd), B * H)](
            q, k, v, end, do, lse, delta, dq, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
            *_strides(dq), H, T, S, scale, BLOCK_M=block_bwd, BLOCK_N=step, **common)
        return dq, dk, dv, None, None


def baseline_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_end: Optional[torch.Tensor] = None,
                       scale: float = 1.0) -> torch.Tensor:
    """softmax(scale q k^T) v over each row's keys before ``kv_end[b]`` ((B,) int32; None: all S keys),
    q (B, H, T, D), k and v (B, H, S, D) with a unit last stride (dK and dV are written with k's
    strides, so k and v must share theirs), head size a power of two >= 16 (the kernels load whole
    heads, unmasked: the backend masks the head's padding, about 0.2 instructions per element),
    fwd and bwd on the three kernels above. A row without keys gets zeros."""
    if triton is None:
        raise RuntimeError("triton is not importable")
    if k.stride() != v.stride():
        raise ValueError("k and v must have the same strides")
    head = q.size(-1)
    if head < 16 or head & (head - 1) or v.size(-1) != head:
        raise ValueError(f"the baseline takes head sizes that are powers of two >= 16 (no head mask), got {head}")
    if kv_end is not None:
        kv_end = kv_end.to(device=q.device, dtype=torch.int32).contiguous()
    return _BaselineAttention.apply(q, k, v, kv_end, float(scale))


def kv_end_from_padding(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """(B,) int32: one past each row's last unpadded key of a right-padded (B, S) mask (True = padding).
    Only right padding is expressible: holes or left padding raise."""
    keep = ~key_padding_mask.bool()
    lengths = keep.sum(-1)
    positions = torch.arange(keep.size(-1), device=keep.device)
    if not torch.equal(keep, positions[None, :] < lengths[:, None]):
        raise ValueError("the baseline takes right padding only (each row's real keys first)")
    return lengths.to(torch.int32)
