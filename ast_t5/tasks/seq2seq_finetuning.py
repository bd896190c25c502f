"""Sequence-to-sequence fine-tuning of AST-T5 models on JSONL pairs (reference spec section 12).

Data: ``<data>/{train,valid,test}.jsonl``, one ``{"source": ..., "target": ...}`` object per line,
tokenized when a split is loaded with the pre-training tokenizer (``task.tokenizer``, default
``task.data``: a directory with ``spm.model``, ``dict.txt`` and ``tokenizer.json``). Classification
tasks are generation of a label string. Start from a pre-trained checkpoint with fairseq's
``checkpoint.finetune_from_model=PATH`` (weights only; fresh optimizer, schedule, meters and data
iterator; a restarted run resumes from its own ``checkpoint_last.pt`` instead).

Validation also generates (greedy or beam) and logs ``exact_match`` and ``bleu`` (percent, as in
``ast_t5.eval.metrics``), so ``checkpoint.best_checkpoint_metric=bleu`` (or ``exact_match``) with
``checkpoint.maximize_best_checkpoint_metric=true`` keeps the best checkpoint by that metric.
Parameter-efficient options freeze the encoder, the decoder and/or the token embeddings. Every
checkpoint stores the tokenizer in its task state, so it is self-contained for ``ast_t5.generate``.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks import register_task
from omegaconf import MISSING

from ..data.seq2seq_dataset import Seq2SeqDataset, inference_dataset, read_jsonl_pairs
from ..data.text_codec import TextCodec
from ..eval.metrics import CODE_TOKENIZER
from ..generation.checkpoints import TOKENIZER_STATE_KEY, tokenizer_state
from ..generation.scoring import generation_stats, log_generation_metrics
from .shared_vocab_task import SharedVocabTask

logger = logging.getLogger(__name__)

EM_NORMALIZATION = ChoiceEnum(["whitespace", "none"])


def _f(default, text):
    return field(default=default, metadata={"help": text})


@dataclass
class Seq2SeqFinetuningConfig(FairseqDataclass):
    data: str = _f(MISSING, "directory with train.jsonl, valid.jsonl (and test.jsonl)")
    tokenizer: str = _f("", "tokenizer directory (spm.model, dict.txt, tokenizer.json), e.g. the "
                            "pre-training data; default: task.data")
    source_field: str = _f("source", "JSONL field holding the source text")
    target_field: str = _f("target", "JSONL field holding the target text")
    max_source_positions: int = _f(512, "longer sources keep their first tokens (counted in logs)")
    max_target_positions: int = _f(256, "longer targets keep their first tokens (counted in logs)")
    freeze_encoder: bool = _f(False, "do not train the encoder (token embeddings excepted)")
    freeze_decoder: bool = _f(False, "do not train the decoder and output head (token embeddings "
                                     "excepted)")
    freeze_embeddings: bool = _f(False, "do not train the shared token (and position) embeddings")
    eval_generate: bool = _f(True, "generate on validation sets and log exact_match and bleu")
    eval_beam: int = _f(1, "beam size of validation generation (1 = greedy)")
    eval_max_new_tokens: int = _f(0, "longest validation output (0: max_target_positions - 1)")
    eval_length_penalty: float = _f(1.0, "length penalty of validation beam search")
    eval_bleu_tokenize: str = _f(CODE_TOKENIZER, "BLEU tokenizer: code, none, 13a, intl, char")
    eval_em_normalization: EM_NORMALIZATION = _f("whitespace", "exact match compares "
                                                 "whitespace-normalized text, or exact strings")
    eval_print_samples: bool = _f(False, "log the first hypothesis and reference of each batch")


def validate_config(cfg: Seq2SeqFinetuningConfig) -> None:
    """One-line ValueErrors for bad settings, before any data is read."""
    if cfg.max_source_positions < 2 or cfg.max_target_positions < 2:
        raise ValueError("task.max_source_positions and task.max_target_positions must be >= 2")
    if cfg.eval_beam < 1 or cfg.eval_max_new_tokens < 0:
        raise ValueError(f"task.eval_beam={cfg.eval_beam} must be >= 1 and "
                         f"task.eval_max_new_tokens={cfg.eval_max_new_tokens} >= 0")
    if cfg.freeze_encoder and cfg.freeze_decoder and cfg.freeze_embeddings:
        raise ValueError("freezing encoder, decoder and embeddings leaves nothing to train")
    if not os.path.isdir(cfg.data):
        raise ValueError(f"task.data={cfg.data}: no such directory")


def freeze_parameters(model: torch.nn.Module, encoder: bool = False, decoder: bool = False,
                      embeddings: bool = False) -> int:
    """Set ``requires_grad=False`` on the chosen parts; returns the number of frozen values.

    Embeddings are the token table (shared by encoder, decoder and, in the paper family, the
    output head) and learned position tables; the fairseq trainer gives the optimizer only
    parameters that require gradients, so frozen ones never change.
    """
    embedding_ids = {id(m.weight) for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Embedding) and name.split(".")[-1] in
                     ("embed_tokens", "embed_positions")}
    frozen = 0
    for name, param in model.named_parameters():
        stack = name.split(".", 1)[0]
        if id(param) in embedding_ids:
            freeze = embeddings
        else:
            freeze = (encoder and stack == "encoder") or (decoder and stack == "decoder")
        if freeze:
            param.requires_grad_(False)
            frozen += param.numel()
    total = sum(p.numel() for p in model.parameters())
    if frozen:
        logger.info("frozen: %s of %s parameters (encoder=%s decoder=%s embeddings=%s)",
                    f"{frozen:,}", f"{total:,}", encoder, decoder, embeddings)
    if frozen == total:
        raise ValueError("every parameter is frozen: nothing to train")
    return frozen


@register_task("ast_t5_seq2seq", dataclass=Seq2SeqFinetuningConfig)
class Seq2SeqFinetuningTask(SharedVocabTask):
    """Fine-tuning on JSONL source/target pairs; see the module docstring.

    Args:
        codec (TextCodec): the pre-training tokenizer.
    """

    cfg: Seq2SeqFinetuningConfig

    def __init__(self, cfg: Seq2SeqFinetuningConfig, codec: TextCodec):
        super().__init__(cfg)
        self.codec = codec
        self.dictionary = codec.dictionary()
        self.sequence_generator = None
        self.state.merge_state_dict({TOKENIZER_STATE_KEY: tokenizer_state(codec)})

    @classmethod
    def setup_task(cls, cfg: Seq2SeqFinetuningConfig, **kwargs):
        validate_config(cfg)
        try:
            codec = TextCodec.from_dir(cfg.tokenizer or cfg.data)
        except FileNotFoundError as e:
            hint = "" if cfg.tokenizer else " (set task.tokenizer=DIR of the pre-training data)"
            raise FileNotFoundError(f"{e}{hint}") from None
        logger.info("tokenizer %s: %d ids (%d sentinels)", cfg.tokenizer or cfg.data,
                    codec.vocab_size, codec.num_sentinels)
        return cls(cfg, codec)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        path = os.path.join(self.cfg.data, f"{split}.jsonl")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found (fine-tuning data is <data>/<split>.jsonl)")
        sources, targets = read_jsonl_pairs(path, self.cfg.source_field, self.cfg.target_field)
        if not sources:
            raise ValueError(f"{path} has no examples")
        self.datasets[split] = Seq2SeqDataset.from_texts(
            self.codec, sources, targets, self.cfg.max_source_positions,
            self.cfg.max_target_positions, name=split)

    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        return inference_dataset([t.tolist() for t in src_tokens], self.dictionary.pad(),
                                 self.dictionary.eos(), self.cfg.max_source_positions)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        for side, stack in (("source", model.encoder), ("target", model.decoder)):
            wanted = getattr(self.cfg, f"max_{side}_positions")
            if stack.max_positions() < wanted:
                raise ValueError(f"task.max_{side}_positions={wanted} exceeds model.max_{side}_"
                                 f"positions={stack.max_positions()}; lower one or raise the other")
        freeze_parameters(model, self.cfg.freeze_encoder, self.cfg.freeze_decoder,
                          self.cfg.freeze_embeddings)
        if self.cfg.eval_generate:
            max_new = self.cfg.eval_max_new_tokens or self.cfg.max_target_positions - 1
            self.sequence_generator = SequenceGenerator(
                [model], self.dictionary, beam_size=self.cfg.eval_beam, max_len_a=0,
                max_len_b=max_new, len_penalty=self.cfg.eval_length_penalty)
        return model

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.eval_generate:
            hypotheses = self.generate_texts(sample)
            references = sample.get("target_text") or [
                self.codec.decode(t.tolist()) for t in sample["target"]]
            logging_output.update(generation_stats(
                hypotheses, references, self.cfg.eval_bleu_tokenize,
                self.cfg.eval_em_normalization))
            if self.cfg.eval_print_samples:
                logger.info("example hypothesis: %r", hypotheses[0])
                logger.info("example reference:  %r", references[0])
        return loss, sample_size, logging_output

    def generate_texts(self, sample) -> List[str]:
        """Decoded best hypothesis of each sample of a batch."""
        net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
        with torch.no_grad():
            # the generator holds the model it was built with (its models argument is unused)
            hypos = self.sequence_generator.generate(None, {"net_input": net_input})
        return [self.codec.decode(h[0]["tokens"].tolist()) for h in hypos]

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        log_generation_metrics(logging_outputs)
