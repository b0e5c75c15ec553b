"""Epoch plans: which samples each rank reads, in which order. Pure functions, no I/O.

The plan of an epoch is a deterministic function of (shard sizes, world size, epoch, seed,
batch size, shuffle, drop_last, block size, window). Every rank computes its own part from
the same inputs, so ranks agree without talking to each other.

How an epoch is laid out:

1. Shard order: the identity, or a seeded permutation of the shards when shuffling.
2. Blocks: each shard is cut into blocks of ``block_size`` consecutive samples. When
   shuffling, blocks are permuted within windows of ``window`` consecutive shards (of the
   shuffled shard order), so one batch mixes samples of up to ``window`` shards while a reader
   keeps only a few shards open. Samples inside a block keep their storage order: every read
   is a contiguous run.
3. The resulting global sequence of ``N`` samples is padded (``drop_last=False``: cycling from
   its start, fewer than ``world_size`` repeats) or truncated (``drop_last=True``: fewer than
   ``world_size * batch_size`` dropped) to ``world_size * samples_per_rank`` and rank ``r``
   takes the ``r``-th contiguous slice, cut at sample granularity.

Guarantees, for any shard sizes (empty shards, one huge shard, fewer shards than ranks, fewer
samples than ranks x batch size): each sample is assigned to exactly one rank per epoch (plus
the reported repeats, minus the reported drops); every rank gets the same number of samples and
so the same number of batches; equal inputs give equal plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dataflow.errors import ConfigError

DEFAULT_BLOCK_SIZE = 64
DEFAULT_WINDOW = 8


class Range(NamedTuple):
    """Samples ``[start, stop)`` of shard number ``shard`` (an index into the shard list)."""

    shard: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class EpochSize:
    """How many samples and batches each rank gets in one epoch.

    Attributes:
        samples_per_rank: samples each rank reads (identical for every rank).
        batches_per_rank: batches each rank yields (identical for every rank).
        last_batch_size: size of the last batch (``batch_size`` unless it is short).
        repeated: samples read twice in the epoch to pad ranks to equal counts.
        dropped: samples not read in the epoch (``drop_last=True``).
    """

    samples_per_rank: int
    batches_per_rank: int
    last_batch_size: int
    repeated: int
    dropped: int


def _check(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"`{name}` must be an integer >= {minimum}. Found: {value!r}")


def epoch_size(total: int, *, world_size: int, batch_size: int, drop_last: bool) -> EpochSize:
    """Sizes of one epoch of ``total`` samples over ``world_size`` ranks."""
    _check("total", total, 0)
    _check("world_size", world_size, 1)
    _check("batch_size", batch_size, 1)
    if drop_last:
        per_rank = total // (world_size * batch_size) * batch_size
    else:
        per_rank = -(-total // world_size)
    batches = -(-per_rank // batch_size)
    last = per_rank - (batches - 1) * batch_size if batches else 0
    used = per_rank * world_size
    return EpochSize(per_rank, batches, last, max(used - total, 0), max(total - used, 0))


def _blocks(
    sizes: np.ndarray, *, epoch: int, seed: int, shuffle: bool, block_size: int, window: int
) -> np.ndarray:
    """The epoch's global block sequence as an int64 array of shape ``(blocks, 3)``.

    Columns are (shard, start, stop); empty shards contribute no block.
    """
    n_shards = len(sizes)
    rng = np.random.Generator(np.random.PCG64([seed, epoch])) if shuffle else None
    order = rng.permutation(n_shards) if rng is not None else np.arange(n_shards)
    counts = -(-sizes[order] // block_size)
    shard = np.repeat(order, counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    start = (np.arange(len(shard)) - first) * block_size
    stop = np.minimum(start + block_size, sizes[shard])
    blocks = np.stack([shard, start, stop], axis=1).astype(np.int64)
    if rng is not None and len(blocks):
        group = np.repeat(np.arange(n_shards) // window, counts)
        blocks = blocks[np.lexsort((rng.random(len(blocks)), group))]
    return blocks


def _take(blocks: np.ndarray, cum: np.ndarray, a: int, b: int) -> list[Range]:
    """Ranges covering positions ``[a, b)`` of the cyclic sequence of ``blocks``.

    Consecutive blocks that continue each other (same shard, adjacent samples) are merged.
    """
    total = int(cum[-1])
    parts = []
    while a < b:
        base = a // total * total
        lo, hi = a - base, min(b - base, total)
        i0 = int(np.searchsorted(cum, lo, side="right")) - 1
        i1 = int(np.searchsorted(cum, hi, side="left"))
        part = blocks[i0:i1].copy()
        part[0, 1] += lo - cum[i0]
        part[-1, 2] -= cum[i1] - hi
        parts.append(part)
        a = base + hi
    rows = np.concatenate(parts)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:, 0] != rows[:-1, 0]) | (rows[1:, 1] != rows[:-1, 2])
    starts = np.flatnonzero(first)
    last = np.append(starts[1:], len(rows)) - 1
    merged = np.stack([rows[starts, 0], rows[starts, 1], rows[last, 2]], axis=1)
    return list(map(Range._make, merged.tolist()))


@dataclass(frozen=True)
class _Layout:
    blocks: np.ndarray
    cum: np.ndarray
    per_rank: int

    def take(self, rank: int) -> list[Range]:
        if self.per_rank == 0:
            return []
        return _take(self.blocks, self.cum, rank * self.per_rank, (rank + 1) * self.per_rank)


def _layout(
    shard_sizes: Sequence[int], *, world_size: int, epoch: int, seed: int, batch_size: int,
    shuffle: bool, drop_last: bool, block_size: int, window: int,
) -> _Layout:
    """Validate the inputs and lay out the epoch's global block sequence."""
    _check("world_size", world_size, 1)
    _check("epoch", epoch, 0)
    _check("seed", seed, 0)
    _check("batch_size", batch_size, 1)
    _check("block_size", block_size, 1)
    _check("window", window, 1)
    sizes = np.asarray(shard_sizes, dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        bad = int(np.flatnonzero(sizes < 0)[0])
        raise ConfigError(f"`shard_sizes[{bad}]` must be >= 0. Found: {int(sizes[bad])}")
    size = epoch_size(int(sizes.sum()), world_size=world_size, batch_size=batch_size,
                      drop_last=drop_last)
    blocks = _blocks(sizes, epoch=epoch, seed=seed, shuffle=shuffle, block_size=block_size,
                     window=window)
    cum = np.concatenate([[0], np.cumsum(blocks[:, 2] - blocks[:, 1])])
    return _Layout(blocks, cum, size.samples_per_rank)


def global_plan(
    shard_sizes: Sequence[int],
    *,
    world_size: int,
    epoch: int,
    seed: int,
    batch_size: int,
    shuffle: bool = True,
    drop_last: bool = False,
    block_size: int = DEFAULT_BLOCK_SIZE,
    window: int = DEFAULT_WINDOW,
) -> list[list[Range]]:
    """Every rank's plan for one epoch: ``result[rank]`` equals ``plan(..., rank=rank)``."""
    layout = _layout(shard_sizes, world_size=world_size, epoch=epoch, seed=seed,
                     batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                     block_size=block_size, window=window)
    return [layout.take(r) for r in range(world_size)]


def plan(
    shard_sizes: Sequence[int],
    *,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int,
    batch_size: int,
    shuffle: bool = True,
    drop_last: bool = False,
    block_size: int = DEFAULT_BLOCK_SIZE,
    window: int = DEFAULT_WINDOW,
) -> list[Range]:
    """One rank's ordered ranges for one epoch.

    Args:
        shard_sizes: number of samples in each shard, in dataset order.
        world_size: number of ranks.
        rank: this rank, ``0 <= rank < world_size``.
        epoch: epoch number (>= 0); with ``shuffle`` each epoch has its own order.
        seed: non-negative seed shared by all ranks.
        batch_size: samples per batch.
        shuffle: permute shards and blocks; otherwise storage order.
        drop_last: drop the remainder instead of padding with repeats.
        block_size: samples per shuffled block (the unit of locality).
        window: blocks are shuffled among this many consecutive shards.

    Returns:
        Ranges whose lengths add up to ``epoch_size(...).samples_per_rank``.
    """
    _check("world_size", world_size, 1)
    valid = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
    if not valid or not 0 <= rank < world_size:
        raise ConfigError(f"`rank` must be in [0, {world_size}). Found: {rank!r}")
    layout = _layout(shard_sizes, world_size=world_size, epoch=epoch, seed=seed,
                     batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                     block_size=block_size, window=window)
    return layout.take(rank)


def split_batches(ranges: Sequence[Range], batch_size: int) -> list[list[Range]]:
    """Cut a rank's ranges into consecutive batches of ``batch_size`` samples.

    Every batch holds exactly ``batch_size`` samples except possibly the last.
    """
    _check("batch_size", batch_size, 1)
    batches: list[list[Range]] = []
    current: list[Range] = []
    room = batch_size
    for r in ranges:
        start = r.start
        while start < r.stop:
            stop = min(r.stop, start + room)
            current.append(Range(r.shard, start, stop))
            room -= stop - start
            start = stop
            if room == 0:
                batches.append(current)
                current, room = [], batch_size
    if current:
        batches.append(current)
    return batches
