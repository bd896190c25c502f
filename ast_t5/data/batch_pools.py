"""Training batches cut by their samples' corrupted lengths (``task.batch_pool``).

fairseq forms an epoch's batches before any sample is masked: it sorts the segments by their own
length and cuts the sorted list at the token budget. The AST objective then shortens each source and
draws each target at random, so the samples of one batch spread (on the default corpus a target is
0.19 to 0.31 of its segment) and every batch pads to its longest: the collated batches cost 1 / 0.852
of their samples' own FLOPs (``benchmarks/bench_padding.py``). Masking a whole epoch first to batch by
the masked lengths would cost the main process about 0.9 ms per sample (a quarter of an hour per
million segments, every epoch).

With ``task.batch_pool=K`` the training iterator keeps fairseq's batches but groups every K of them
that are adjacent in the sorted order into a pool. The DataLoader's workers mask a pool's samples as
they always mask a batch's, and the collater sorts them by masked source length (then target length)
and cuts the pool again into K batches with the pool's row counts, the shortest samples to the batch
with the most rows. Pools, not batches, are shuffled each epoch and sharded over the ranks. Every
sample is still trained on once per epoch and each batch still has its planned number of rows. On
the default corpus pools of 8 batches saved 8.5% of the FLOPs, of 16 8.9%, and no cut batch held more
source or target tokens than the largest planned one (a measurement, not a guarantee; BENCHMARKS.md).

Off by default (``batch_pool: 1`` in every recipe). What it changes besides the padding: a batch now
holds samples of similar masked length, so samples that the masking treated alike (much masked or
little, or one masking mode) gather in the same batches, as fairseq's sort gathers segments of one
length. On the tiny recipe at equal tokens (six seeds, RESULTS.md) the pooled batches trained worse:
0.07-0.08 nats mid-run, 0.026 at the end, about what the saved FLOPs buy back.

The epoch's progress is still counted in batches, so checkpoints, ``len()``, the learning-rate
schedule and a resume in the middle of an epoch (even in the middle of a pool) behave as without
pools: a resumed run loads the pool it stopped in and skips the batches it had trained on. With
several ranks each pool is filled up to K batches with empty ones (fairseq's dummy batches), so that
every rank runs the same number of batches.
"""
import logging
import math
from typing import List, Sequence, Tuple

import numpy as np
import torch
from fairseq.data import iterators

logger = logging.getLogger(__name__)


def cut_order(row_counts: Sequence[int], lengths: Sequence[Tuple]) -> List[List[int]]:
    """How a pool is cut again: ``lengths[i]`` is sample i's sort key (masked source length, target
    length, ...), ``row_counts`` the pool's batch sizes. Returns, per batch in the order of the row
    counts from most rows to fewest, the positions of its samples: the samples sorted by key (ties in
    their order in the pool), cut into runs of those sizes."""
    if sum(row_counts) != len(lengths):
        raise ValueError(f"a pool of {len(lengths)} samples cannot be cut into batches of {list(row_counts)} rows")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out, start = [], 0
    for rows in sorted(row_counts, reverse=True):
        out.append(order[start:start + rows])
        start += rows
    return out


class _PoolItems(torch.utils.data.Dataset):
    """The dataset as the DataLoader reads it for pools: item ``(sample, row_counts)``. A pool's first
    key is ``(index, row_counts)`` (the collater needs the pool's row counts to cut it), the others
    plain indices, whose row counts are None."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, row_counts = key if isinstance(key, tuple) else (key, None)
        return self.dataset[index], row_counts


class _PoolSampler:
    """The DataLoader's batch sampler over pools: one pool's keys at a time (the epoch's list of every
    index would cost the main process about 100 bytes per sample), the first carrying the row counts."""

    def __init__(self, pools):
        self.pools = pools

    def __len__(self):
        return len(self.pools)

    def __iter__(self):
        for pool in self.pools:
            keys = [int(i) for batch in pool for i in batch]
            if keys:
                keys[0] = (keys[0], tuple(len(batch) for batch in pool))
            yield keys


class PoolCollater:
    """Collates one pool into its batches (a list; an empty batch is ``{}``, fairseq's dummy)."""

    def __init__(self, collate_fn, pool_size: int):
        self.collate_fn, self.pool_size = collate_fn, pool_size

    def __call__(self, items):
        if not items:  # a pool of empty batches: the fill that keeps the ranks' counts equal
            return [{} for _ in range(self.pool_size)]
        row_counts = items[0][1]
        samples = [sample for sample, _ in items]
        keys = [(len(s["source"]), len(s["target"])) for s in samples]
        return [self.collate_fn([samples[i] for i in batch]) if batch else {}
                for batch in cut_order(row_counts, keys)]


def _flatten(pools, skip: int):
    """Each pool's batches in turn, the first ``skip`` batches of the first pool left out."""
    for batches in pools:
        yield from batches[skip:]
        skip = 0


class PooledEpochBatchIterator(iterators.EpochBatchIterator):
    """fairseq's epoch iterator over pools of ``pool_size`` adjacent batches, cut again by the masked
    lengths (the module's docstring). Made from fairseq's own iterator by `pool_batches`."""

    pool_size = 1

    def _pools(self, epoch, fix_batches_to_gpus, shuffle):
        """This rank's pools of this epoch, each a list of index arrays (shuffled and sharded as fairseq
        does with batches); with several ranks every pool has ``pool_size`` batches, empty ones added."""
        pools = [list(pool) for pool in self.ordered_batches(epoch, fix_batches_to_gpus, shuffle)]
        if self.num_shards > 1:
            pools = [pool + [[]] * (self.pool_size - len(pool)) for pool in pools]
        return pools

    def __len__(self):
        pools = self.frozen_batches
        if self.num_shards > 1:
            return int(math.ceil(len(pools) / float(self.num_shards))) * self.pool_size
        return sum(len(pool) for pool in pools)

    @property
    def first_batch(self):
        if len(self.frozen_batches) == 0:
            return super().first_batch  # fairseq's error for an empty dataset
        return self.collate_fn([self.dataset[i] for i in self.frozen_batches[0][0]])

    def _get_iterator_for_epoch(self, epoch, shuffle, fix_batches_to_gpus=False, offset=0):
        pools = self._pools(epoch, fix_batches_to_gpus, shuffle)
        total = sum(len(pool) for pool in pools)
        if offset > 0 and offset >= total:
            return None
        start, skip = 0, offset
        while start < len(pools) and skip >= len(pools[start]):  # the offset's pool, and its batches done
            skip -= len(pools[start])
            start += 1
        loader = torch.utils.data.DataLoader(
            _PoolItems(self.dataset), collate_fn=PoolCollater(self.collate_fn, self.pool_size),
            batch_sampler=_PoolSampler(pools[start:]), num_workers=self.num_workers, timeout=self.timeout,
            pin_memory=True, persistent_workers=self.persistent_workers)
        itr = loader
        if self.buffer_size > 0:
            itr = iterators.BufferedIterator(self.buffer_size, itr)
        itr = iterators.CountingIterator(_flatten(itr, skip), start=offset, total=total)
        if self.skip_remainder_batch:
            itr.take(total - 1)
        return itr


_POOLED = {}  # fairseq's iterator class (or ours, `distributed.WorldSizeAwareIterator`) -> its pooled subclass


def pool_batches(itr, pool_size: int):
    """Turn fairseq's ``EpochBatchIterator`` (or our subclass of it) ``itr`` into a
    `PooledEpochBatchIterator` over pools of ``pool_size`` adjacent batches; ``pool_size`` 1 leaves
    it as it is. Its batches must be in their planned order (sorted by length), as fairseq freezes
    them."""
    if pool_size <= 1 or isinstance(itr, PooledEpochBatchIterator):  # fairseq caches a task's iterators
        return itr
    if not isinstance(itr, iterators.EpochBatchIterator) or callable(itr.batch_sampler):
        raise ValueError(f"task.batch_pool={pool_size} needs fairseq's EpochBatchIterator with fixed batches, "
                         f"not {type(itr).__name__}")
    if getattr(itr.dataset, "supports_prefetch", False):
        raise ValueError(f"task.batch_pool={pool_size}: datasets that prefetch are not supported")
    batches = itr.frozen_batches
    itr._frozen_batches = tuple(tuple(np.asarray(b) for b in batches[start:start + pool_size])
                                for start in range(0, len(batches), pool_size))
    itr.reuse_dataloader, itr.dataloader = False, None
    base = type(itr)
    if base not in _POOLED:
        _POOLED[base] = type("Pooled" + base.__name__, (PooledEpochBatchIterator, base), {})
    itr.__class__ = _POOLED[base]
    itr.pool_size = pool_size
    logger.info("training batches cut by masked lengths in pools of %d: %d batches in %d pools",
                pool_size, len(batches), len(itr.frozen_batches))
    return itr
