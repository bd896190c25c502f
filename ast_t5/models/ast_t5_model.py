"""The ``ast_t5`` fairseq model: a T5 encoder-decoder in two families (see config.py).

Registered with ``@register_model("ast_t5", dataclass=AstT5Config)``; named size presets are in
architectures.py. The model's forward is fairseq's ``(src_tokens, src_lengths, prev_output_tokens)``
and its decoder is a FairseqIncrementalDecoder, so fairseq's criterions and SequenceGenerator
(beam search with cached keys/values) work unchanged.

Building one without a task (tests, demos, conversion)::

    model = AstT5Model.from_dictionary(dictionary, arch="t5_v11_tiny", dropout=0.0)
"""
import logging
from typing import Optional

import torch.nn as nn
from fairseq.models import FairseqEncoderDecoderModel, register_model

import fused_ops

from .config import AstT5Config, config_from, structure
from .initialization import initialize_weights
from .presets import ARCH_PRESETS, MODEL_NAME
from .t5_stacks import T5Decoder, T5Encoder

logger = logging.getLogger(__name__)


@register_model(MODEL_NAME, dataclass=AstT5Config)
class AstT5Model(FairseqEncoderDecoderModel):
    """T5 encoder-decoder; ``cfg`` is the resolved AstT5Config it was built from."""

    def __init__(self, cfg: AstT5Config, encoder: T5Encoder, decoder: T5Decoder):
        super().__init__(encoder, decoder)
        self.cfg = cfg

    @classmethod
    def build_model(cls, cfg, task):
        """fairseq entry point. Source and target must share one dictionary (tied embeddings)."""
        src, tgt = task.source_dictionary, task.target_dictionary
        if tgt is not None and src is not None and (len(src) != len(tgt) or src.pad() != tgt.pad()):
            raise ValueError("ast_t5 needs one shared source/target dictionary; got sizes "
                             f"{len(src)} and {len(tgt)}")
        return cls.build(config_from(cfg), src if src is not None else tgt)

    @classmethod
    def build(cls, cfg: AstT5Config, dictionary) -> "AstT5Model":
        """Build and initialize a model over ``dictionary`` (a fairseq Dictionary)."""
        embed_tokens = nn.Embedding(len(dictionary), cfg.embed_dim, padding_idx=dictionary.pad())
        encoder = T5Encoder(cfg, dictionary, embed_tokens)
        decoder = T5Decoder(cfg, dictionary, embed_tokens)
        model = cls(cfg, encoder, decoder)
        initialize_weights(model, str(cfg.family), cfg.embed_dim, cfg.init_factor)
        if str(cfg.attention_backend) == "fused":
            ok, reason = fused_ops.fused_backend_status()
            if not ok:  # not an error yet: a CPU machine may build the model only to convert it
                logger.warning("attention_backend=fused cannot run in this process (%s); the first "
                               "forward will raise. Use auto to fall back.", reason)
        logger.info("ast_t5 %s: %s parameters (%s without embeddings), attention backend %s",
                    cfg.family, f"{model.num_parameters():,}", f"{model.num_parameters(False):,}",
                    cfg.attention_backend)
        return model

    @classmethod
    def from_dictionary(cls, dictionary, arch: Optional[str] = None, **overrides) -> "AstT5Model":
        """Build from a dictionary, an optional preset name (e.g. "t5_v11_tiny") and field overrides."""
        values = dict(ARCH_PRESETS[arch]) if arch is not None else {}
        values.update(overrides)
        unknown = set(values) - set(AstT5Config.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown AstT5Config fields: {sorted(unknown)}")
        return cls.build(config_from(AstT5Config(**values)), dictionary)

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count; without embeddings leaves out the token table and the output head."""
        total = sum(p.numel() for p in self.parameters())
        if not include_embeddings:
            total -= self.encoder.embed_tokens.weight.numel()
            if self.decoder.output_projection is not None:
                total -= self.decoder.output_projection.weight.numel()
        return total

    @property
    def family(self) -> str:
        return str(self.cfg.family)

    @property
    def tied_output(self) -> bool:
        return structure(self.cfg).tie_output
