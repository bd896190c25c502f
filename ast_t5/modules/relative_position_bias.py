"""T5's bucketed relative position bias (Raffel et al., 2020, section 2.1; AST-T5 spec section 7.3).

Each (query i, key j) pair gets a learned per-head scalar, looked up by a bucket of the distance
j - i: exact buckets for short distances, logarithmically wider ones up to ``max_distance``, one
shared bucket beyond. We use Google T5's bucket function (also what Hugging Face T5 computes), for
both model families; the original AST-T5 code used a sign-symmetric variant (spec section 7.3),
which only matters when importing its checkpoints.
"""
import math

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

    def forward(self, q_len: int, k_len: int, query_offset: int = 0) -> torch.Tensor:
        """Bias for queries ``query_offset + [0, q_len)`` against keys ``[0, k_len)``.

        Returns:
            (1, num_heads, q_len, k_len) tensor in the table's dtype, broadcastable over batch.
        """
        device = self.embedding.weight.device
        query = torch.arange(query_offset, query_offset + q_len, device=device)
        key = torch.arange(k_len, device=device)
        buckets = relative_position_bucket(key[None, :] - query[:, None], self.bidirectional,
                                           self.num_buckets, self.max_distance)
        values = self.embedding(buckets)  # (q_len, k_len, H)
        return values.permute(2, 0, 1).unsqueeze(0)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")
