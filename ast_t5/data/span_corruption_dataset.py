"""fairseq dataset wrapper of the span-corruption objectives (STYLE.md 4.1 item 4).

Each item is computed once, from ``(seed, epoch, index)`` through a real 64-bit hash
(``spans.sample_rng``): ``{"id", "source", "target"}``, both ending with ``</s>``. Batches carry
``prev_output_tokens`` = ``</s>`` followed by the target without its last token, the one decoder
convention used everywhere (pre-training, fine-tuning, generation, Hugging Face export).
"""
from typing import Optional

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from .masking_options import AstMaskingOptions
from .node_categories import NodeCategories
from .sentinels import SentinelSpec
from .spans import sample_rng
from .subtree_masking import ast_span_corruption
from .t5_span_masking import t5_span_corruption


class SpanCorruptionDataset(FairseqDataset):
    """AST-aware (``asts`` given) or T5 random-span (``asts`` None) corruption of segments.

    Args:
        tokens: indexed dataset of segments, each ending with ``</s>``.
        asts: parallel dataset of flat (start, end, type) rows, or None for T5 corruption.
        sentinels: vocabulary layout; pad: padding id.
        ast_options: AST objective options (validated by the task); categories: node kinds.
        noise_density, mean_span_length: T5 objective options.
    """

    def __init__(self, tokens, asts, sentinels: SentinelSpec, pad: int, seed: int,
                 ast_options: Optional[AstMaskingOptions] = None,
                 categories: Optional[NodeCategories] = None,
                 noise_density: float = 0.15, mean_span_length: float = 3.0,
                 max_target_len: Optional[int] = None, name: str = ""):
        self.tokens, self.asts = tokens, asts
        self.sentinels, self.pad, self.seed = sentinels, pad, seed
        self.ast_options, self.categories = ast_options, categories
        self.noise_density, self.mean_span_length = noise_density, mean_span_length
        self.max_target_len = max_target_len
        self.name = name
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.tokens)

    def corrupt(self, index: int, epoch: int):
        """(source, target) int64 arrays of one item for one epoch."""
        item = self.tokens[index].numpy()
        rng = sample_rng(self.seed, epoch, index)
        try:
            if self.asts is not None:
                return ast_span_corruption(item, self.asts[index].numpy(), self.ast_options, rng,
                                           sentinels=self.sentinels, categories=self.categories)
            return t5_span_corruption(item, self.noise_density, self.mean_span_length, rng,
                                      sentinels=self.sentinels, max_target_len=self.max_target_len)
        except ValueError as e:
            raise ValueError(f"{self.name} item {index}: {e}") from None

    def __getitem__(self, index):
        source, target = self.corrupt(index, self.epoch)
        return {"id": index, "source": torch.from_numpy(source), "target": torch.from_numpy(target)}

    @property
    def sizes(self):
        return self.tokens.sizes

    def num_tokens(self, index):
        # the source is never longer than the segment; the target is bounded by the segment too
        return int(self.tokens.sizes[index])

    def size(self, index):
        return int(self.tokens.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.tokens.sizes, kind="stable")

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # only the noise changes with the epoch, not the item sizes

    def collater(self, samples):
        return collate_seq2seq(samples, self.pad, self.sentinels.eos)


def collate_seq2seq(samples, pad: int, eos: int):
    """Right-padded batch in fairseq's translation layout (no reordering)."""
    if not samples:
        return {}
    src = data_utils.collate_tokens([s["source"] for s in samples], pad, eos, left_pad=False)
    tgt = data_utils.collate_tokens([s["target"] for s in samples], pad, eos, left_pad=False)
    prev = data_utils.collate_tokens([s["target"] for s in samples], pad, eos, left_pad=False,
                                     move_eos_to_beginning=True)
    ids = [s["id"] for s in samples]
    src_lengths = [len(s["source"]) for s in samples]
    return {
        "id": torch.tensor(ids, dtype=torch.long),
        "nsentences": len(samples),
        "ntokens": sum(len(s["target"]) for s in samples),
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.tensor(src_lengths, dtype=torch.long),
            "prev_output_tokens": prev,
        },
        "target": tgt,
        # numpy copies that fairseq never moves to the GPU: the task reads them inside an update
        # (token budget, audit log) without a device-to-host copy
        "host": {"id": np.asarray(ids, dtype=np.int64), "src_lengths": np.asarray(src_lengths, dtype=np.int64)},
    }
