"""Weight and config mapping between our T5 v1.1 family and Hugging Face ``T5ForConditionalGeneration``.

Only the ``t5_v11`` family maps onto stock Hugging Face T5 (the paper family's post-LayerNorm,
learned positions and per-layer encoder bias have no stock counterpart). Our fused projections
are split/concatenated along their rows:
``qkv_proj`` = [q; k; v], cross-attention ``kv_proj`` = [k; v], gated ``ffn.wi`` = [wi_0; wi_1].

Vocabulary and decoder conventions carry over unchanged (fairseq index == Hugging Face id):
pad = 1, eos = decoder start = 2.

Functions (transformers is imported only by the ones that build Hugging Face objects):
    ours_to_hf_state_dict(state_dict) -> dict
    hf_to_ours_state_dict(hf_state_dict) -> dict
    hf_t5_config(cfg, vocab_size, pad_token_id=1, eos_token_id=2) -> transformers.T5Config
    hf_dropout_rate(cfg) -> float  (raises when no single dropout_rate trains like cfg)
    ast_t5_config_from_hf(hf_config) -> AstT5Config
"""
import re
from typing import Dict, List, Mapping, Tuple

import torch
from torch import Tensor

from .config import AstT5Config, resolved_head_dim

PAD_ID = 1  # fairseq Dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3
EOS_ID = 2
_SELF = "layer.0.SelfAttention."
_CROSS = "layer.1.EncDecAttention."

# (our name relative to "encoder.layers.N." / "decoder.layers.N.", HF names relative to
# "encoder.block.N." / "decoder.block.N.", concatenated along rows in this order)
_ENCODER_LAYER: List[Tuple[str, List[str]]] = [
    ("self_attn.qkv_proj.weight", [_SELF + "q.weight", _SELF + "k.weight", _SELF + "v.weight"]),
    ("self_attn.out_proj.weight", [_SELF + "o.weight"]),
    ("self_attn_norm.weight", ["layer.0.layer_norm.weight"]),
    ("ffn.wi.weight", ["layer.1.DenseReluDense.wi_0.weight", "layer.1.DenseReluDense.wi_1.weight"]),
    ("ffn.wo.weight", ["layer.1.DenseReluDense.wo.weight"]),
    ("ffn_norm.weight", ["layer.1.layer_norm.weight"]),
]
_DECODER_LAYER: List[Tuple[str, List[str]]] = _ENCODER_LAYER[:3] + [
    ("encoder_attn.q_proj.weight", [_CROSS + "q.weight"]),
    ("encoder_attn.kv_proj.weight", [_CROSS + "k.weight", _CROSS + "v.weight"]),
    ("encoder_attn.out_proj.weight", [_CROSS + "o.weight"]),
    ("encoder_attn_norm.weight", ["layer.1.layer_norm.weight"]),
    ("ffn.wi.weight", ["layer.2.DenseReluDense.wi_0.weight", "layer.2.DenseReluDense.wi_1.weight"]),
    ("ffn.wo.weight", ["layer.2.DenseReluDense.wo.weight"]),
    ("ffn_norm.weight", ["layer.2.layer_norm.weight"]),
]
_GLOBAL: List[Tuple[str, List[str]]] = [
    ("encoder.embed_tokens.weight", ["shared.weight"]),
    ("encoder.rel_pos_bias.embedding.weight", ["encoder.block.0." + _SELF + "relative_attention_bias.weight"]),
    ("decoder.rel_pos_bias.embedding.weight", ["decoder.block.0." + _SELF + "relative_attention_bias.weight"]),
    ("encoder.final_norm.weight", ["encoder.final_layer_norm.weight"]),
    ("decoder.final_norm.weight", ["decoder.final_layer_norm.weight"]),
    ("decoder.output_projection.weight", ["lm_head.weight"]),
]
_OUR_ALIASES = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}  # one shared table
_HF_ALIASES = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
# Stored by some of Google's converted checkpoints, never used (HF ignores it on load too).
_HF_IGNORED = {"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}


def _count_layers(keys, pattern: str) -> int:
    found = {int(m.group(1)) for k in keys for m in [re.match(pattern, k)] if m}
    return max(found) + 1 if found else 0


def _name_pairs(num_encoder_layers: int, num_decoder_layers: int) -> List[Tuple[str, List[str]]]:
    pairs = list(_GLOBAL)
    for prefix, hf_prefix, table, n in (("encoder.layers", "encoder.block", _ENCODER_LAYER, num_encoder_layers),
                                        ("decoder.layers", "decoder.block", _DECODER_LAYER, num_decoder_layers)):
        for i in range(n):
            pairs += [(f"{prefix}.{i}.{ours}", [f"{hf_prefix}.{i}.{h}" for h in hf]) for ours, hf in table]
    return pairs


def _check_keys(available, expected, direction: str) -> None:
    missing = sorted(set(expected) - set(available))
    unexpected = sorted(set(available) - set(expected))
    if missing or unexpected:
        raise KeyError(f"{direction}: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                       f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''} "
                       "(only the t5_v11 family maps to Hugging Face T5)")


def ours_to_hf_state_dict(state_dict: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """Our t5_v11 model's state dict -> a ``T5ForConditionalGeneration`` state dict.

    The shared embedding is written under ``shared``, ``encoder.embed_tokens`` and
    ``decoder.embed_tokens``. Tensors are views of the inputs (clone before editing them).
    """
    pairs = _name_pairs(_count_layers(state_dict, r"encoder\.layers\.(\d+)\."),
                        _count_layers(state_dict, r"decoder\.layers\.(\d+)\."))
    _check_keys(state_dict, [o for o, _ in pairs] + list(_OUR_ALIASES), "ours -> HF")
    hf = {}
    for ours, hf_names in pairs:
        for name, part in zip(hf_names, state_dict[ours].chunk(len(hf_names), dim=0)):
            hf[name] = part
    for alias, source in _HF_ALIASES.items():
        hf[alias] = hf[source]
    return hf


def _shared_embedding(hf_state_dict: Mapping[str, Tensor]) -> Tensor:
    """The one token table our model shares: the stacks' tables (what HF's forward reads), which
    must agree; ``shared.weight`` when a checkpoint stores only that."""
    stacks = [hf_state_dict[k] for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
              if k in hf_state_dict]
    if not stacks:
        return hf_state_dict["shared.weight"]
    if len(stacks) == 2 and not torch.equal(stacks[0], stacks[1]):
        raise ValueError("the Hugging Face model's encoder and decoder token embeddings differ; "
                         "our model shares one table between them")
    return stacks[0]


def hf_to_ours_state_dict(hf_state_dict: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """A ``T5ForConditionalGeneration`` (T5 v1.1, untied head) state dict -> our t5_v11 state dict.

    Raises ValueError when the encoder and decoder token tables differ (transformers >= 5 builds
    separate random tables for an untied T5; Google's checkpoints store one).
    """
    hf_state_dict = dict(hf_state_dict)
    hf_state_dict["shared.weight"] = _shared_embedding(hf_state_dict)
    pairs = _name_pairs(_count_layers(hf_state_dict, r"encoder\.block\.(\d+)\."),
                        _count_layers(hf_state_dict, r"decoder\.block\.(\d+)\."))
    expected = [h for _, hf_names in pairs for h in hf_names]
    present = {k: v for k, v in hf_state_dict.items() if k not in _HF_ALIASES and k not in _HF_IGNORED}
    _check_keys(present, expected, "HF -> ours")
    ours = {}
    for name, hf_names in pairs:
        parts = [hf_state_dict[h] for h in hf_names]
        ours[name] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    for alias, source in _OUR_ALIASES.items():
        ours[alias] = ours[source]
    return ours


def hf_dropout_rate(cfg: AstT5Config) -> float:
    """Hugging Face T5's one ``dropout_rate`` that trains like ``cfg``. HF applies it to the
    embeddings and sub-layer outputs (our ``dropout``), the attention probabilities
    (``attention_dropout``) and the gated feed-forward's hidden activations
    (``activation_dropout``); raises ValueError, naming the three, when ours sets them apart, so a
    comparison of the two cannot silently train different models (inference is unaffected)."""
    rates = {"dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
             "activation_dropout": cfg.activation_dropout}
    if len(set(rates.values())) != 1:
        raise ValueError("Hugging Face T5 has one dropout_rate, but this model sets "
                         + ", ".join(f"{k}={v:g}" for k, v in rates.items())
                         + ": set them equal (e.g. model.attention_dropout=0.0) to train the same model")
    return float(cfg.dropout)


def hf_t5_config(cfg: AstT5Config, vocab_size: int, pad_token_id: int = PAD_ID,
                 eos_token_id: int = EOS_ID):
    """The ``transformers.T5Config`` of our t5_v11 model (untied head, decoder start = eos)."""
    from transformers import T5Config

    if str(cfg.family) != "t5_v11":
        raise ValueError(f"only the t5_v11 family maps to Hugging Face T5, got {cfg.family}")
    config = T5Config(
        vocab_size=vocab_size, d_model=cfg.embed_dim, d_kv=resolved_head_dim(cfg), d_ff=cfg.ffn_dim,
        num_layers=cfg.encoder_layers, num_decoder_layers=cfg.decoder_layers, num_heads=cfg.num_heads,
        relative_attention_num_buckets=cfg.rel_pos_buckets,
        relative_attention_max_distance=cfg.rel_pos_max_distance, dropout_rate=cfg.dropout,
        layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, decoder_start_token_id=eos_token_id)
    # transformers >= 5 forces tie_word_embeddings=True in T5Config.__post_init__ (keeping only
    # "do not rescale the decoder output"); T5 v1.1's head is untied, so set it back.
    config.tie_word_embeddings = False
    return config


def ast_t5_config_from_hf(hf_config) -> AstT5Config:
    """Our t5_v11 AstT5Config matching a Hugging Face T5 v1.1 config (gated GELU, untied head)."""
    gelu_tanh = getattr(hf_config, "dense_act_fn", "") in ("gelu_new", "gelu_pytorch_tanh")
    if not (getattr(hf_config, "is_gated_act", False) and gelu_tanh):
        raise ValueError("only T5 v1.1-style configs (feed_forward_proj='gated-gelu') map to t5_v11")
    return AstT5Config(
        family="t5_v11", embed_dim=hf_config.d_model, ffn_dim=hf_config.d_ff, num_heads=hf_config.num_heads,
        head_dim=hf_config.d_kv, encoder_layers=hf_config.num_layers,
        decoder_layers=hf_config.num_decoder_layers, rel_pos_buckets=hf_config.relative_attention_num_buckets,
        rel_pos_max_distance=hf_config.relative_attention_max_distance, dropout=hf_config.dropout_rate,
        attention_dropout=hf_config.dropout_rate, activation_dropout=hf_config.dropout_rate)
