"""Language mixture: sample items of several datasets by fixed probabilities, per epoch.

Each epoch has ``epoch_size`` items (default: the total of all datasets). Dataset ``i``
contributes ``round(epoch_size * p_i)`` of them (largest remainders make the counts add up),
read through a seeded permutation that each epoch continues where the last one stopped, so a
large dataset is walked through slice by slice and a small one is repeated (spec section 3.1,
without its under-sampling of the epoch). Everything derives from ``(seed, epoch)``.
"""
from typing import List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset

MIXTURE_STREAM_TAG = 0x6D6978  # "mix": keeps these permutations apart from other streams


class WeightedMixtureDataset(FairseqDataset):
    """``language_ids[k]`` is the ``language`` label of dataset k's items (default: k); the task
    passes each dataset's index in its full language list, so that a split missing a language
    (or a single-language ``valid_<lang>``) still labels every item with its own language."""

    def __init__(self, datasets: Sequence[FairseqDataset], probs: Sequence[float], seed: int,
                 epoch_size: int = 0, language_ids: Optional[Sequence[int]] = None):
        if len(datasets) != len(probs) or not datasets:
            raise ValueError("need one probability per dataset")
        if language_ids is not None and len(language_ids) != len(datasets):
            raise ValueError("need one language id per dataset")
        self.language_ids = list(language_ids) if language_ids is not None else list(range(len(datasets)))
        self.datasets, self.probs = list(datasets), np.asarray(probs, dtype=np.float64)
        self.seed = seed
        self.epoch_size = epoch_size or int(sum(len(d) for d in datasets))
        self.counts = _apportion(self.epoch_size, self.probs)
        self.set_epoch(1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        parts: List[np.ndarray] = []
        for k, (ds, n) in enumerate(zip(self.datasets, self.counts)):
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(epoch)
            parts.append(np.stack([np.full(n, k), self._items(k, len(ds), n, epoch)], 1))
        self.index = np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, 2), np.int64)
        self._sizes = np.array([self.datasets[k].size(i) for k, i in self.index], dtype=np.int64) \
            if len(self.index) else np.zeros(0, np.int64)

    def _items(self, k: int, size: int, n: int, epoch: int) -> np.ndarray:
        """Items ``[(epoch - 1) * n, epoch * n)`` of dataset k's endless permuted stream."""
        start = (epoch - 1) * n
        positions = np.arange(start, start + n, dtype=np.int64)
        rounds = positions // size
        out = np.empty(n, dtype=np.int64)
        for r in np.unique(rounds):
            perm = np.random.default_rng([MIXTURE_STREAM_TAG, self.seed, k, int(r)]).permutation(size)
            sel = rounds == r
            out[sel] = perm[positions[sel] - r * size]
        return out

    def __getitem__(self, i):
        k, j = self.index[i]
        item = self.datasets[k][int(j)]
        item["language"] = int(self.language_ids[k])
        item["id"] = i
        return item

    def __len__(self):
        return len(self.index)

    def collater(self, samples):
        if not samples:
            return {}
        batch = self.datasets[0].collater(samples)
        batch["language"] = torch.tensor([s["language"] for s in samples], dtype=torch.long)
        if "sort_order" in batch:
            batch["language"] = batch["language"].index_select(0, batch["sort_order"])
        return batch

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return int(self._sizes[index])

    def size(self, index):
        return int(self._sizes[index])

    def ordered_indices(self):
        """A seeded shuffle, then a stable sort by length (batches of similar lengths)."""
        rng = np.random.default_rng([MIXTURE_STREAM_TAG, self.seed, self.epoch])
        order = rng.permutation(len(self))
        return order[np.argsort(self._sizes[order], kind="stable")]

    @property
    def supports_prefetch(self):
        return False

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # every epoch draws other items


def _apportion(total: int, probs: np.ndarray) -> np.ndarray:
    raw = total * probs / probs.sum()
    counts = np.floor(raw).astype(np.int64)
    rest = total - counts.sum()
    counts[np.argsort(-(raw - counts), kind="stable")[:rest]] += 1
    return counts
