"""Autograd glue between `softmax_dropout` and the compiled ops (``torch.ops.fused_ops.*``).

The ops see 4-D tensors: scores (B, H, Tq, Tk) contiguous; bias and mask float32 views expanded to
the scores' shape (stride 0 on broadcast dimensions, unit stride on keys). The forward op returns
(out, probs, keep_bits): ``probs`` (the softmax before dropout) and ``keep_bits`` ((B*H*Tq,
ceil(Tk/32)) int32, bit j of word w = key 32*w + j kept) are empty when no dropout is applied, in
which case backward reuses ``out`` as the softmax.
"""
from typing import Optional, Tuple

import torch

MASK_WORD_BITS = 32


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """View (..., Tq, Tk) as (B, H, Tq, Tk): missing leading dims become 1, extra ones fold into B."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t.reshape(-1, *t.shape[-3:]) if t.dim() > 4 else t


def _expanded_fp32(term: Optional[torch.Tensor], shape) -> Optional[torch.Tensor]:
    """An additive term as a float32 view of ``shape`` with unit stride on the key axis."""
    if term is None:
        return None
    view = _as_4d(term.detach().float()).expand(shape)
    return view if view.stride(-1) == 1 else view.contiguous()


def _reduce_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """Sum a (B, H, Tq, Tk) gradient over the dimensions that ``shape`` broadcast (fp32 sums)."""
    lead = grad.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and grad.size(lead + i) != 1]
    if not dims:
        return grad
    return grad.sum(dim=dims, keepdim=True, dtype=torch.float32).reshape(shape)


def unpack_keep_bits(bits: torch.Tensor, shape) -> torch.Tensor:
    """Turn the kernel's packed words (rows, ceil(Tk/32)) int32 into a bool mask of ``shape``."""
    k_len = shape[-1]
    shifts = torch.arange(MASK_WORD_BITS, device=bits.device, dtype=torch.int32)
    unpacked = (bits.unsqueeze(-1) >> shifts).bitwise_and(1).bool()
    return unpacked.reshape(bits.size(0), -1)[:, :k_len].reshape(shape)


class _FusedSoftmaxDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, bias, mask, p, training, ops):
        shape4 = _as_4d(scores).shape
        scores4 = _as_4d(scores).contiguous()
        out, probs, keep_bits = ops.softmax_dropout_forward(
            scores4, _expanded_fp32(bias, shape4), _expanded_fp32(mask, shape4), float(p), bool(training))
        dropped = keep_bits.numel() > 0
        ctx.save_for_backward(probs if dropped else out, keep_bits)
        ctx.p = float(p) if dropped else 0.0
        ctx.ops = ops
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.scores_shape = scores.shape
        ctx.mark_non_differentiable(keep_bits)
        return out.view(scores.shape), keep_bits

    @staticmethod
    def backward(ctx, grad_out, _grad_bits):
        probs, keep_bits = ctx.saved_tensors
        grad4 = _as_4d(grad_out).contiguous()
        grad_scores = ctx.ops.softmax_dropout_backward(grad4, probs, keep_bits, ctx.p)
        grad_bias = None
        if ctx.bias_shape is not None and ctx.needs_input_grad[1]:
            grad_bias = _reduce_to(grad_scores.view(ctx.scores_shape), ctx.bias_shape).to(ctx.bias_dtype)
        return grad_scores.view(ctx.scores_shape), grad_bias, None, None, None, None


def fused_softmax_dropout(scores, p, training, bias, mask, ops,
                          return_keep: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Run the kernel with autograd; the keep mask is unpacked only when asked for."""
    out, keep_bits = _FusedSoftmaxDropout.apply(scores, bias, mask, p, training, ops)
    keep = None
    if return_keep and keep_bits.numel() > 0:
        keep = unpack_keep_bits(keep_bits, scores.shape)
    return out, keep
