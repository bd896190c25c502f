"""Encoder and decoder stacks of the ``ast_t5`` model (fairseq FairseqEncoder / incremental decoder).

Internally tensors are batch-first (B, T, C). The encoder's output dictionary follows fairseq's
TransformerEncoder format: ``encoder_out`` is [(S, B, C)] (a transposed view, no copy),
``encoder_padding_mask`` [(B, S) bool, True at padding].

Padding: sources may be left- or right-padded (learned positions count only real tokens);
decoder inputs must be right-padded (fairseq's default ``left_pad_target=False``), because decoder
self-attention masks the future only: padding after the last real token is never attended to by
real tokens.
"""
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import FairseqEncoder, FairseqIncrementalDecoder
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ast_t5.modules import LayerSpec, RelativePositionBias, T5DecoderLayer, T5EncoderLayer, build_norm
from ast_t5.modules.attention_backends import compute_dtype, fold_masks, stack_block_mask
from ast_t5.modules.projections import linear

from .config import AstT5Config, resolved_head_dim, structure

EncoderOut = Dict[str, List[Tensor]]


def layer_spec(cfg: AstT5Config) -> LayerSpec:
    s = structure(cfg)
    head_dim = resolved_head_dim(cfg)
    return LayerSpec(cfg.embed_dim, cfg.ffn_dim, cfg.num_heads, head_dim, cfg.dropout,
                     cfg.attention_dropout, cfg.activation_dropout, s.activation, s.norm,
                     s.normalize_before, s.bias, head_dim ** -0.5 if s.scale_by_head_dim else 1.0,
                     str(cfg.attention_backend))


def _rel_bias(cfg: AstT5Config, bidirectional: bool) -> RelativePositionBias:
    return RelativePositionBias(cfg.num_heads, cfg.rel_pos_buckets, cfg.rel_pos_max_distance, bidirectional)


def _check_length(length: int, limit: int, what: str) -> None:
    if length > limit:
        raise ValueError(f"{what} length {length} exceeds max_{what}_positions={limit} "
                         f"(the learned position table); filter or crop longer inputs")


def _mask_if_any(mask: Tensor) -> Optional[Tensor]:
    """The padding mask, or None when nothing is padded (lets SDPA take mask-free kernels).

    Testing the mask reads a value back to the host, which on a GPU waits for every queued
    kernel. So it is only tested without gradients (validation, generation, export); a training
    forward (gradients on) and a compiled one always keep the mask, which gives the same result:
    no host sync inside an update, and no graph split under torch.compile (model.compile pads
    lengths to buckets, so batches have padding anyway)."""
    if torch.compiler.is_compiling() or torch.is_grad_enabled():
        return mask
    return mask if mask.any() else None


class _StackMixin:
    """Embedding recipe and layer loop shared by the encoder and the decoder."""

    def _build_embedding_parts(self, cfg: AstT5Config, max_positions: int) -> None:
        s = structure(cfg)
        self.embed_positions = nn.Embedding(max_positions, cfg.embed_dim) if s.learned_positions else None
        self.layernorm_embedding = build_norm(s.norm, cfg.embed_dim) if s.layernorm_embedding else None
        self.final_norm = build_norm(s.norm, cfg.embed_dim) if s.final_norm else None
        self.dropout_module = nn.Dropout(cfg.dropout)
        self.checkpoint_activations = cfg.checkpoint_activations
        self.attention_backend = str(cfg.attention_backend)
        self.attention_dropout = cfg.attention_dropout

    def _attention_dropout_now(self) -> float:
        """The layers' attention dropout in this pass (0 in eval), for `fold_masks`: with it,
        ``auto`` prepares only the form its backend takes (no dense bias beside a flex one)."""
        return self.attention_dropout if self.training else 0.0

    def _embed(self, tokens: Tensor, positions: Optional[Tensor]) -> Tensor:
        x = self.embed_tokens(tokens)
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x)

    # With ``model.compile_scope=layers``: the compiled ``(layer, *args) -> layer(*args)`` that
    # `AstT5Model.forward` sets for the duration of a compiled training forward (None otherwise:
    # validation, generation and incremental decoding call the layers eagerly).
    layer_call = None

    def _run_layer(self, layer: nn.Module, *args) -> Tensor:
        call = self.layer_call
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            if call is not None:
                return checkpoint(call, layer, *args, use_reentrant=False)
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args) if call is None else call(layer, *args)

    def _finish(self, x: Tensor) -> Tensor:
        if self.final_norm is not None:
            x = self.dropout_module(self.final_norm(x))
        return x


class T5Encoder(_StackMixin, FairseqEncoder):
    """Token embedding (shared with the decoder) -> layers -> optional final norm."""

    def __init__(self, cfg: AstT5Config, dictionary, embed_tokens: nn.Embedding):
        FairseqEncoder.__init__(self, dictionary)
        s = structure(cfg)
        self.padding_idx = dictionary.pad()
        self.max_source_positions = cfg.max_source_positions
        self.embed_tokens = embed_tokens
        self._build_embedding_parts(cfg, cfg.max_source_positions)
        spec = layer_spec(cfg)
        self.rel_pos_bias = None if s.per_layer_encoder_bias else _rel_bias(cfg, bidirectional=True)
        self.layers = nn.ModuleList([
            T5EncoderLayer(spec, _rel_bias(cfg, True) if s.per_layer_encoder_bias else None)
            for _ in range(cfg.encoder_layers)])

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **kwargs) -> EncoderOut:
        """src_tokens: (B, S) int64. Returns fairseq's encoder dictionary (see module docstring)."""
        padding_mask = src_tokens.eq(self.padding_idx)  # (B, S)
        positions = None
        if self.embed_positions is not None:
            _check_length(src_tokens.size(1), self.max_source_positions, "source")
            positions = ((~padding_mask).long().cumsum(dim=1) - 1).clamp(min=0)  # skips left padding
        x = self._embed(src_tokens, positions)
        attn_mask = _mask_if_any(padding_mask)
        shared_bias, layer_block_mask = None, None
        if self.rel_pos_bias is not None:
            shared_bias, attn_mask, _ = fold_masks(
                self.attention_backend, self.rel_pos_bias(src_tokens.size(1), src_tokens.size(1)),
                attn_mask, causal=False, dtype=compute_dtype(x), dropout_p=self._attention_dropout_now())
        elif self.layers and self.layers[0].rel_pos_bias is not None:  # per-layer tables (the paper's)
            layer_block_mask = stack_block_mask(self.attention_backend, attn_mask, False, src_tokens.size(1),
                                                src_tokens.size(1), src_tokens.device, compute_dtype(x),
                                                self._attention_dropout_now())
        for layer in self.layers:
            x = self._run_layer(layer, x, attn_mask, shared_bias, layer_block_mask)
        x = self._finish(x)
        return {
            "encoder_out": [x.transpose(0, 1)],  # (S, B, C)
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [] if src_lengths is None else [src_lengths],
        }

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        """Select batch entries ``new_order`` (beam search), keeping the batch-first memory layout."""
        states = encoder_out["encoder_out"][0].transpose(0, 1).index_select(0, new_order)
        reordered = {"encoder_out": [states.transpose(0, 1)]}
        for key in ("encoder_padding_mask", "src_lengths"):
            reordered[key] = [t.index_select(0, new_order) for t in encoder_out.get(key, [])]
        for key in ("encoder_embedding", "encoder_states", "src_tokens"):
            reordered[key] = []
        return reordered

    def max_positions(self) -> int:
        return self.max_source_positions


class T5Decoder(_StackMixin, FairseqIncrementalDecoder):
    """Causal decoder with cross-attention; output head tied to the embedding or separate."""

    def __init__(self, cfg: AstT5Config, dictionary, embed_tokens: nn.Embedding):
        FairseqIncrementalDecoder.__init__(self, dictionary)
        s = structure(cfg)
        self.max_target_positions = cfg.max_target_positions
        self.embed_tokens = embed_tokens
        self._build_embedding_parts(cfg, cfg.max_target_positions)
        self.rel_pos_bias = _rel_bias(cfg, bidirectional=False) if s.decoder_bias else None
        spec = layer_spec(cfg)
        self.layers = nn.ModuleList([T5DecoderLayer(spec) for _ in range(cfg.decoder_layers)])
        self.output_projection = None
        if not s.tie_output:
            self.output_projection = linear(cfg.embed_dim, len(dictionary), bias=False)

    def forward(self, prev_output_tokens: Tensor, encoder_out: Optional[EncoderOut] = None,
                incremental_state=None, features_only: bool = False, **kwargs):
        """prev_output_tokens: (B, T) int64, starting with </s>. With ``incremental_state`` only the
        last token is processed (fairseq's convention) and the output covers that step.
        Returns ((B, T, V) logits or (B, T, C) features, {"attn": [None]})."""
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: Optional[EncoderOut] = None,
                         incremental_state=None, **kwargs):
        step = 0
        if incremental_state is not None:
            step = prev_output_tokens.size(1) - 1
            prev_output_tokens = prev_output_tokens[:, -1:]
        tgt_len = prev_output_tokens.size(1)
        positions = None
        if self.embed_positions is not None:
            _check_length(step + tgt_len, self.max_target_positions, "target")
            positions = torch.arange(step, step + tgt_len, device=prev_output_tokens.device)
        x = self._embed(prev_output_tokens, positions)
        enc, enc_mask = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, S, C)
            enc_mask = encoder_out["encoder_padding_mask"][0]
            enc_mask = _mask_if_any(enc_mask)
        self_bias, causal = None, incremental_state is None  # a cached step sees every cached key
        if self.rel_pos_bias is not None:
            self_bias, _, causal = fold_masks(self.attention_backend,
                                              self.rel_pos_bias(tgt_len, step + tgt_len, query_offset=step),
                                              None, causal, dtype=compute_dtype(x),
                                              dropout_p=self._attention_dropout_now())
        for layer in self.layers:
            if incremental_state is None:
                x = self._run_layer(layer, x, enc, enc_mask, self_bias, causal)
            else:
                x = layer(x, enc, enc_mask, self_bias, causal, incremental_state)
        x = self._finish(x)
        return x, {"attn": [None]}  # no attention weights: fused/SDPA kernels do not return them

    def output_layer(self, features: Tensor) -> Tensor:
        """(B, T, C) features -> (B, T, V) logits."""
        if self.output_projection is None:
            return F.linear(features, self.embed_tokens.weight)
        return self.output_projection(features)

    def max_positions(self) -> int:
        return self.max_target_positions
