"""T5's bucketed relative position bias (Raffel et al., 2020, section 2.1; AST-T5 spec section 7.3).

Each (query i, key j) pair gets a learned per-head scalar, looked up by a bucket of the distance
j - i: exact buckets for short distances, logarithmically wider ones up to ``max_distance``, one
shared bucket beyond. We use Google T5's bucket function (also what Hugging Face T5 computes), for
both model families; the original AST-T5 code used a sign-symmetric variant (spec section 7.3),
which only matters when importing its checkpoints.
"""
import math
from typing import NamedTuple

import torch
import torch.nn as nn


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> torch.Tensor:
    """Map distances (key - query) to bucket ids.

    Args:
        relative_position: int64 tensor of key_position - query_position, any shape.
        bidirectional: True for encoder self-attention (half of the buckets for keys after the
            query); False for causal attention (only keys at or before the query get buckets).
        num_buckets: number of buckets (all of them when unidirectional, two halves otherwise).
        max_distance: distances at or beyond this share the last bucket of their direction.
    Returns:
        int64 tensor of bucket ids in [0, num_buckets), same shape.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets between max_exact and max_distance; clamp(min=1) keeps log finite where
    # the small branch is taken anyway
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


def distance_buckets(bidirectional: bool, num_buckets: int, max_distance: int, device=None) -> torch.Tensor:
    """Bucket ids of the distances -max_distance..max_distance, as one 1-D table of 2 M + 1 entries.

    Buckets stop changing at ``max_distance`` in both directions (a causal table puts every key
    after the query in bucket 0), so the bucket of any distance d is
    ``table[clamp(d, -M, M) + M]`` with M = max_distance: one small table, the same for every
    sequence length, replaces the (T, S) bucket matrix.
    """
    distances = torch.arange(-max_distance, max_distance + 1, device=device)
    return relative_position_bucket(distances, bidirectional, num_buckets, max_distance)


def distance_index(q_len: int, k_len: int, query_offset: int, max_distance: int, device=None) -> torch.Tensor:
    """(q_len, k_len) index into a per-distance table: clamp(key - query, -M, M) + M."""
    query = torch.arange(query_offset, query_offset + q_len, device=device)
    key = torch.arange(k_len, device=device)
    return (key[None, :] - query[:, None]).clamp(-max_distance, max_distance) + max_distance


class RelativeBias(NamedTuple):
    """A relative-position bias kept as one value per (head, clamped distance), never as (T, S).

    The bias of query ``query_offset + i`` and key j is
    ``per_distance[h, clamp(j - query_offset - i, -M, M) + M]`` with M = `max_distance`. The
    FlexAttention backend reads it inside the kernel; every other backend asks for `dense`.
    Gradients flow through ``per_distance`` to the bucket table.
    """

    per_distance: torch.Tensor  # (H, 2 M + 1)
    q_len: int
    k_len: int
    query_offset: int = 0

    @property
    def max_distance(self) -> int:
        return (self.per_distance.size(1) - 1) // 2

    def dense(self) -> torch.Tensor:
        """The (1, H, q_len, k_len) bias tensor (for kernels that take a bias as a tensor).

        Its gradient reaches ``per_distance`` through `distance_grad` (sums along diagonals), not
        through the gather's own backward, an accumulating index_put onto the H (2 M + 1) entries
        that inductor compiles to contended atomic adds, fused with the batch sum (1.3 s of a 1.4 s
        T5-base update on an H200, 2026-11-27).
        """
        return _DenseBias.apply(self.per_distance, self.q_len, self.k_len, self.query_offset).unsqueeze(0)

    @property
    def device(self) -> torch.device:
        return self.per_distance.device

    @property
    def dtype(self) -> torch.dtype:
        return self.per_distance.dtype


def distance_grad_reference(grad_scores: torch.Tensor, max_distance: int, query_offset: int = 0) -> torch.Tensor:
    """The gradient of ``per_distance`` given the logits' gradient dS (..., H, q_len, k_len).

    A score (i, j) reads ``per_distance[h, clamp(j - i - offset, -M, M) + M]``, so that entry's
    gradient is the sum of dS over the batch and over its diagonals: one reduction per distance,
    not one atomic add per (b, h, i, j) onto a few bucket addresses. This is the formula a fused
    kernel must implement; here in plain PyTorch (float32 or wider sums) as the test reference.
    Returns (H, 2 M + 1).
    """
    wide = torch.float64 if grad_scores.dtype == torch.float64 else torch.float32
    dS = grad_scores.reshape(-1, *grad_scores.shape[-3:]).sum(0, dtype=wide)  # (H, T, S)
    heads, q_len, k_len = dS.shape
    index = distance_index(q_len, k_len, query_offset, max_distance, dS.device).flatten().expand(heads, -1)
    out = torch.zeros(heads, 2 * max_distance + 1, dtype=wide, device=dS.device)
    return out.scatter_add_(1, index, dS.reshape(heads, -1))


def distance_grad(grad_dense: torch.Tensor, max_distance: int, query_offset: int = 0) -> torch.Tensor:
    """`distance_grad_reference` without a scatter over (T, S): the same (H, 2 M + 1) sums.

    ``grad_dense`` is (..., H, T, S); leading dimensions are summed first. Each row i of the (H, T,
    S) sum is shifted right by T - 1 - i (a pad of T zeros per row, read back with rows one
    element shorter), which lines up every diagonal j - i in one column; a sum over rows gives one
    value per distance -(T - 1)..S - 1, of which the 2 M + 1 results are gathered, the two ends
    summing every distance beyond +-M. Everything is reductions, views and gathers: inductor
    compiles it without atomics (so deterministically), and with no branch on T or S (no guard, no
    recompilation per length); no matrix product either, so model FLOP counts stay the model's.
    """
    wide = torch.float64 if grad_dense.dtype == torch.float64 else torch.float32
    g = grad_dense.reshape(-1, *grad_dense.shape[-3:]).sum(0, dtype=wide)  # (H, T, S)
    heads, q_len, k_len = g.shape
    width = q_len + k_len - 1
    shifted = torch.nn.functional.pad(g.flip(1), (0, q_len)).reshape(heads, -1)[:, :q_len * width]
    per_distance = shifted.reshape(heads, q_len, width).sum(1)  # column c: distance c - (T - 1)
    # column c holds distance c - (T - 1) - query_offset; entry k of the result is the column of
    # distance k - M (zero where no pair is that far apart), except the ends: entry 0 sums every
    # distance <= -M and entry 2 M every distance >= M (masked sums, no cancellation). The ends go
    # in by `where`, not `cat`: inductor's GPU lowering of a cat (torch 2.11) wraps each piece's
    # index in an opaque term that its tiling heuristic then fails to compare against the
    # gather's clamp, and the whole backward graph fails to compile under dynamic shapes
    shift = q_len - 1 + query_offset
    distance = torch.arange(width, device=g.device) - shift
    zero = per_distance.new_zeros(())
    below = torch.where(distance <= -max_distance, per_distance, zero).sum(1, keepdim=True)
    above = torch.where(distance >= max_distance, per_distance, zero).sum(1, keepdim=True)
    column = torch.arange(-max_distance, max_distance + 1, device=g.device) + shift
    inside = per_distance.gather(1, column.clamp(0, width - 1).expand(heads, -1))
    inside = torch.where((column >= 0) & (column < width), inside, zero)
    entry = torch.arange(2 * max_distance + 1, device=g.device)
    return torch.where(entry == 0, below, torch.where(entry == 2 * max_distance, above, inside))


class _DenseBias(torch.autograd.Function):
    """per_distance (H, 2 M + 1) -> (H, T, S), with `distance_grad` as its backward."""

    @staticmethod
    def forward(ctx, per_distance, q_len, k_len, query_offset):
        max_distance = (per_distance.size(1) - 1) // 2
        ctx.max_distance, ctx.query_offset = max_distance, query_offset
        index = distance_index(q_len, k_len, query_offset, max_distance, per_distance.device)
        return per_distance[:, index]

    @staticmethod
    def backward(ctx, grad):
        per_distance = distance_grad(grad, ctx.max_distance, ctx.query_offset).to(grad.dtype)
        return per_distance, None, None, None


class RelativePositionBias(nn.Module):
    """A table of (num_buckets, num_heads) biases; returns the bias for a block of positions.

    Args:
        num_heads: attention heads (one scalar per head and bucket).
        num_buckets: T5 buckets (128 in the AST-T5 paper's encoder, 32 in T5 v1.1).
        max_distance: distance where buckets stop growing (256 paper, 128 T5 v1.1).
        bidirectional: True for encoders, False for causal decoders.
    """

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)
        # the bucket of each distance -M..M: fixed, so made once (not a dozen launches per call); not
        # saved in checkpoints
        self.register_buffer("buckets", distance_buckets(bidirectional, num_buckets, max_distance), persistent=False)

    def forward(self, q_len: int, k_len: int, query_offset: int = 0) -> RelativeBias:
        """Bias for queries ``query_offset + [0, q_len)`` against keys ``[0, k_len)``.

        Returns:
            a `RelativeBias`: (H, 2 max_distance + 1) values, one per head and clamped distance,
            looked up from the table through `distance_buckets` (work independent of T and S);
            ``.dense()`` gives the (1, num_heads, q_len, k_len) tensor, broadcastable over batch.
            `attention_backends.fold_masks` turns it into what the chosen backend takes.
        """
        return RelativeBias(self.embedding(self.buckets).t(), q_len, k_len, query_offset)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")
