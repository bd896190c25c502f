"""Weight initialization of both families, so that the initial loss is close to ln(vocab).

T5 v1.1 (Mesh TensorFlow's T5, as Hugging Face's T5 does it, with one fix): token embeddings
N(0, 1); attention q ~ N(0, (d * d_kv)^-0.5) (this absorbs the missing 1/sqrt(d_kv) of the
scores), k and v ~ N(0, d^-0.5), o ~ N(0, (H * d_kv)^-0.5); feed-forward in ~ N(0, d^-0.5),
out ~ N(0, d_ff^-0.5); relative-position tables ~ N(0, d^-0.5); norms 1. The untied output head is
~ N(0, d^-0.5), as in T5X (Hugging Face draws it with std 1.0, which puts the initial logits'
std at sqrt(d) and the initial loss far above ln(vocab)).

AST-T5 paper (spec section 7.4): every linear map ~ N(0, (fan_in + fan_out)^-0.5) with biases 0,
where the original read both fans from ``weight.size(0)`` (bug B-16); here fan_in is the input
width and fan_out the output width of each projection (q, k and v counted separately in the fused
``qkv_proj``). The tied token matrix is both embedding and output head: N(0, d^-0.5), pad row 0,
so the post-LayerNorm decoder output gives logits of std about 1. Learned positions
N(0, d^-0.5); relative-position tables 0; LayerNorm (1, 0).
"""
import math

import torch
import torch.nn as nn

from ast_t5.modules import FeedForward, RelativePositionBias, RMSNorm, T5MultiheadAttention


def _normal_rows(weight: torch.Tensor, row_blocks, stds) -> None:
    """Fill consecutive row blocks of a (fused) projection weight with N(0, std) each."""
    with torch.no_grad():
        for rows, std in zip(weight.split(row_blocks, dim=0), stds):
            rows.normal_(0.0, std)


def _fan_std(fan_in: int, fan_out: int, factor: float) -> float:
    return factor * (fan_in + fan_out) ** -0.5


def _init_attention(m: T5MultiheadAttention, d: int, factor: float, t5_style: bool) -> None:
    inner = m.inner_dim
    if t5_style:
        q_std, kv_std = factor * (d * m.head_dim) ** -0.5, factor * d ** -0.5
        out_std = factor * inner ** -0.5
    else:
        q_std = kv_std = out_std = _fan_std(d, inner, factor)
    if m.self_attention:
        _normal_rows(m.qkv_proj.weight, [inner] * 3, [q_std, kv_std, kv_std])
    else:
        _normal_rows(m.q_proj.weight, [inner], [q_std])
        _normal_rows(m.kv_proj.weight, [inner] * 2, [kv_std, kv_std])
    _normal_rows(m.out_proj.weight, [d], [out_std])


def _init_feed_forward(m: FeedForward, d: int, factor: float, t5_style: bool) -> None:
    blocks = [m.ffn_dim] * (2 if m.gated else 1)
    in_std = factor * d ** -0.5 if t5_style else _fan_std(d, m.ffn_dim, factor)
    out_std = factor * m.ffn_dim ** -0.5 if t5_style else _fan_std(m.ffn_dim, d, factor)
    _normal_rows(m.wi.weight, blocks, [in_std] * len(blocks))
    _normal_rows(m.wo.weight, [d], [out_std])


def _init_module(m: nn.Module, d: int, factor: float, t5_style: bool) -> None:
    if isinstance(m, T5MultiheadAttention):
        _init_attention(m, d, factor, t5_style)
    elif isinstance(m, FeedForward):
        _init_feed_forward(m, d, factor, t5_style)
    elif isinstance(m, RelativePositionBias):
        if t5_style:
            nn.init.normal_(m.embedding.weight, 0.0, factor * d ** -0.5)
        else:
            nn.init.zeros_(m.embedding.weight)
    elif isinstance(m, (nn.LayerNorm, RMSNorm)):
        nn.init.ones_(m.weight)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
    if isinstance(m, nn.LayerNorm) and m.bias is not None:
        nn.init.zeros_(m.bias)


def initialize_weights(model: nn.Module, family: str, embed_dim: int, factor: float = 1.0) -> None:
    """Initialize an AstT5Model in place (see the module docstring for the distributions)."""
    t5_style = family == "t5_v11"
    for m in model.modules():
        _init_module(m, embed_dim, factor, t5_style)
    embed = model.encoder.embed_tokens
    with torch.no_grad():
        embed.weight.normal_(0.0, factor * (1.0 if t5_style else embed_dim ** -0.5))
        if not t5_style and embed.padding_idx is not None:
            embed.weight[embed.padding_idx].zero_()
        for positions in (model.encoder.embed_positions, model.decoder.embed_positions):
            if positions is not None:
                positions.weight.normal_(0.0, factor * embed_dim ** -0.5)
        head = model.decoder.output_projection
        if head is not None:
            head.weight.normal_(0.0, factor * embed_dim ** -0.5)


def expected_initial_loss(vocab_size: int) -> float:
    """ln(vocab): the cross-entropy of uniform predictions, what a good initialization starts near."""
    return math.log(vocab_size)
