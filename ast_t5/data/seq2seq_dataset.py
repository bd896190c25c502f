"""Source/target pairs from JSONL for fine-tuning, tokenized when the split is loaded.

A split file ``<data>/<split>.jsonl`` has one JSON object per line with (by default) the string
fields ``"source"`` and ``"target"``. Both are encoded with the pre-training tokenizer
(:class:`~ast_t5.data.text_codec.TextCodec`, so ``<extra_id_N>`` in a source is a sentinel) and
end with ``</s>``; batches follow the one decoder convention of the project
(:func:`~ast_t5.data.span_corruption_dataset.collate_seq2seq`: decoder input = ``</s>`` + target
without its last token). Over-long sequences keep their first ``max - 1`` tokens plus ``</s>``;
truncations are counted and logged per split.
"""
import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset

from ..eval.jsonl_io import iter_jsonl
from .span_corruption_dataset import collate_seq2seq
from .text_codec import TextCodec

logger = logging.getLogger(__name__)


class Seq2SeqDataError(ValueError):
    """A JSONL file that cannot be read as source/target pairs (one-line message)."""


def read_jsonl_pairs(path: str, source_field: str = "source",
                     target_field: str = "target") -> Tuple[List[str], List[str]]:
    """Sources and targets of a JSONL file; raises Seq2SeqDataError naming file and line."""
    sources, targets = [], []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, record in iter_jsonl(f, path):
                for name in (source_field, target_field):
                    if not isinstance(record.get(name), str):
                        raise Seq2SeqDataError(f"{path}:{lineno}: needs a string field {name!r}")
                sources.append(record[source_field])
                targets.append(record[target_field])
    except UnicodeDecodeError:
        raise Seq2SeqDataError(f"{path}: not UTF-8 text") from None
    except FileNotFoundError:
        raise Seq2SeqDataError(f"{path}: no such file") from None
    except Seq2SeqDataError:
        raise
    except ValueError as e:  # invalid JSON or not an object, already "file:line: ..."
        raise Seq2SeqDataError(str(e)) from None
    return sources, targets


@dataclass
class TruncationStats:
    """How many sequences of a split were cut, and the longest length before cutting."""

    count: int = 0
    total: int = 0
    longest: int = 0

    def describe(self, what: str, limit: int) -> str:
        return (f"{self.count} of {self.total} {what} truncated to {limit} tokens "
                f"(longest {self.longest})")


def encode_with_eos(codec: TextCodec, text: str, max_len: int,
                    stats: TruncationStats) -> np.ndarray:
    """``text`` as int32 ids ending with ``</s>``, at most ``max_len`` long (``stats`` updated)."""
    ids = codec.encode(text)
    stats.total += 1
    stats.longest = max(stats.longest, len(ids) + 1)
    if len(ids) + 1 > max_len:
        stats.count += 1
        ids = ids[:max_len - 1]
    return np.asarray(ids + [codec.eos], dtype=np.int32)


class Seq2SeqDataset(FairseqDataset):
    """Tokenized source/target pairs; items are ``{"id", "source", "target"}`` int64 tensors.

    Args:
        sources, targets: lists of (n,) int arrays ending with ``</s>``.
        target_texts: the untruncated target strings (references for exact match and BLEU).
        pad, eos: special ids.
    """

    def __init__(self, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray],
                 target_texts: Sequence[str], pad: int, eos: int, name: str = ""):
        if not (len(sources) == len(targets) == len(target_texts)):
            raise ValueError("sources, targets and target_texts must have the same length")
        self.sources, self.targets, self.target_texts = sources, targets, target_texts
        self.pad, self.eos, self.name = pad, eos, name
        self.src_sizes = np.array([len(s) for s in sources], dtype=np.int64)
        self.tgt_sizes = np.array([len(t) for t in targets], dtype=np.int64)

    @classmethod
    def from_texts(cls, codec: TextCodec, sources: Sequence[str], targets: Sequence[str],
                   max_source_positions: int, max_target_positions: int,
                   name: str = "") -> "Seq2SeqDataset":
        """Encode text pairs, truncating to the limits and logging how many were cut."""
        src_stats, tgt_stats = TruncationStats(), TruncationStats()
        src = [encode_with_eos(codec, s, max_source_positions, src_stats) for s in sources]
        tgt = [encode_with_eos(codec, t, max_target_positions, tgt_stats) for t in targets]
        logger.info("%s: %d pairs; %s; %s", name, len(src),
                    src_stats.describe("sources", max_source_positions),
                    tgt_stats.describe("targets", max_target_positions))
        dataset = cls(src, tgt, list(targets), codec.pad, codec.eos, name)
        dataset.truncation = {"source": src_stats, "target": tgt_stats}
        return dataset

    def __getitem__(self, index):
        return {"id": index, "source": torch.from_numpy(self.sources[index].astype(np.int64)),
                "target": torch.from_numpy(self.targets[index].astype(np.int64))}

    def __len__(self):
        return len(self.sources)

    @property
    def sizes(self):
        return np.maximum(self.src_sizes, self.tgt_sizes)

    def num_tokens(self, index):
        return int(max(self.src_sizes[index], self.tgt_sizes[index]))

    def num_tokens_vec(self, indices):
        return np.maximum(self.src_sizes[indices], self.tgt_sizes[indices])

    def size(self, index):
        return (int(self.src_sizes[index]), int(self.tgt_sizes[index]))

    def ordered_indices(self):
        """By source length, ties by target length (fewer pads in both); stable."""
        order = np.argsort(self.tgt_sizes, kind="stable")
        return order[np.argsort(self.src_sizes[order], kind="stable")]

    def collater(self, samples):
        batch = collate_seq2seq(samples, self.pad, self.eos)
        if batch:
            batch["target_text"] = [self.target_texts[s["id"]] for s in samples]
        return batch


def inference_dataset(sources: Sequence[Sequence[int]], pad: int, eos: int,
                      max_source_positions: Optional[int] = None) -> Seq2SeqDataset:
    """A dataset of sources only (ids ending with ``</s>``), for fairseq's interactive tools."""
    arrays = []
    for ids in sources:
        ids = list(ids)
        if max_source_positions is not None and len(ids) > max_source_positions:
            ids = ids[:max_source_positions - 1] + [eos]
        arrays.append(np.asarray(ids, dtype=np.int32))
    empty = [np.asarray([eos], dtype=np.int32) for _ in arrays]
    return Seq2SeqDataset(arrays, empty, [""] * len(arrays), pad, eos, "inference")
