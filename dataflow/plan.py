"""Epoch plans: which samples each rank reads, in which batches. Pure functions, no I/O.

The plan of an epoch is a deterministic function of (shard sizes, world size, epoch, seed,
batch size, drop_last, :class:`~dataflow.shuffle.Shuffle`, start). Every rank computes its own
part from the same inputs, so ranks agree without talking to each other.

How an epoch is laid out:

1. The global order: a permutation of the ``N`` samples from :func:`dataflow.shuffle.epoch_order`
   (a sample-level shuffle within large windows by default). It does not depend on the world
   size.
2. Consumption is a prefix of that order. ``start`` samples of it are already consumed (0 for
   a fresh epoch); the remaining ``R = N - start`` are cut into global batches of
   ``batch_size`` (``B``) and rank ``r`` of ``W`` takes global batches ``g = j * W + r`` for
   ``j = 0, 1, ...``. After every rank yielded ``k`` batches, the first ``start + k * W * B``
   samples are consumed, whatever ``W``: :func:`consumed` gives the new ``start``, and a job
   of any size resumes from it with :func:`rank_batches`.
3. Ends of the remainder, so every rank gets the same number of batches:

   * ``drop_last=True``: the last ``R % (W * B)`` samples are dropped (fewer than ``W * B``);
     every batch is full.
   * ``drop_last=False``: ``ceil(R / (W * B))`` batches per rank. The last round of ``W``
     batches shares the final ``T`` samples (``0 < T <= W * B``): each rank's last batch has
     ``L = ceil(T / W)`` samples, rank ``r`` taking positions ``[r * L, (r + 1) * L)`` of that
     tail, where positions past the end of the epoch's order cycle to the start of the order
     (position ``p`` is ``p mod N``). So ``W * L - T < W`` samples are read twice (the first
     samples of the epoch), and only the last batch of each rank may be short. The padding
     depends on positions in the epoch's order, not on ``start``: a job resumed on the same
     world size reads exactly the batches the uninterrupted job would have read.

Inside each batch the ranges are sorted by (shard, start) and adjacent samples are merged into
one range: a batch is a set for SGD, and sorted reads are faster.

Guarantees, for any shard sizes (empty shards, one huge shard, fewer samples than ranks x
batch size): each remaining sample is read by exactly one rank (plus the reported repeats,
minus the reported drops); every rank gets the same number of batches; equal inputs give equal
plans; resuming a job of ``W`` ranks on ``W'`` ranks (repeatedly) reads every sample of the
epoch exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

import numpy as np

from dataflow.checks import check_int
from dataflow.errors import ConfigError, InternalError
from dataflow.shuffle import (
    Shuffle,
    as_shuffle,
    compact_epoch_order,
    epoch_order,
    id_dtype,
    shard_sizes_array,
)

__all__ = [
    "Batches",
    "EpochSize",
    "Range",
    "batch_bounds",
    "batch_positions",
    "consumed",
    "epoch_order",
    "epoch_size",
    "rank_batches",
    "rank_positions",
    "ranges_of",
    "sort_within",
]

CHUNK = 1 << 16
"""Samples :func:`ranges_of` converts at a time (whole batches): its temporaries are arrays of
about this many elements (about 100 bytes a sample of the chunk), not of a rank's whole epoch.
Smaller chunks cost time in Python calls, larger ones memory and cache misses."""


SORT_ONE_BY_ONE = 32
"""Samples a batch from which :func:`sort_within` sorts batches of many sizes one by one (a
Python call each, no temporaries), below which a group at a time (one vectorized sort)."""


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
    """How many samples and batches each rank gets in (the remainder of) one epoch.

    Attributes:
        samples_per_rank: samples each rank reads (identical for every rank).
        batches_per_rank: batches each rank yields (identical for every rank).
        last_batch_size: size of each rank's last batch (``batch_size`` unless it is short;
            0 when there is no batch).
        repeated: samples read twice to pad ranks to equal counts (``drop_last=False``).
        dropped: samples not read (``drop_last=True``).
    """

    samples_per_rank: int
    batches_per_rank: int
    last_batch_size: int
    repeated: int
    dropped: int


def _check_start(start: int, total: int) -> None:
    check_int("start", start, 0)
    if start > total:
        raise ConfigError(f"`start` must be <= the epoch's {total} samples. Found: {start}")


def epoch_size(total: int, *, world_size: int, batch_size: int, drop_last: bool,
               start: int = 0) -> EpochSize:
    """Sizes of the rest of an epoch of ``total`` samples after ``start`` were consumed.

    Args:
        total: samples in the dataset (``N``).
        world_size: ranks of the job reading the rest (``W``).
        batch_size: samples per batch (``B``).
        drop_last: drop the tail instead of padding it (see the module).
        start: samples of the global order already consumed, ``0 <= start <= total``.
    """
    check_int("total", total, 0)
    check_int("world_size", world_size, 1)
    check_int("batch_size", batch_size, 1)
    _check_start(start, total)
    rest = total - start
    per_round = world_size * batch_size
    if drop_last:
        batches = rest // per_round
        last = batch_size if batches else 0
        dropped, repeated = rest - batches * per_round, 0
    else:
        batches = -(-rest // per_round)
        tail = rest - (batches - 1) * per_round if batches else 0
        last = -(-tail // world_size)
        dropped, repeated = 0, world_size * last - tail
    samples = (batches - 1) * batch_size + last if batches else 0
    return EpochSize(samples, batches, last, repeated, dropped)


def consumed(start: int, *, world_size: int, batch_size: int, batches_yielded: int, total: int,
             drop_last: bool) -> int:
    """The new ``start`` once every rank of a ``world_size`` job yielded ``batches_yielded``.

    The job read the rest of the epoch from ``start`` with :func:`rank_batches`. The result is
    ``start + batches_yielded * world_size * batch_size``, or ``total`` once the job yielded all
    of its batches (the epoch is over: its padding or dropped tail is done with).

    Raises:
        ConfigError: ``batches_yielded`` exceeds the job's batches per rank.
    """
    size = epoch_size(total, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                      start=start)
    check_int("batches_yielded", batches_yielded, 0)
    if batches_yielded > size.batches_per_rank:
        raise ConfigError(f"`batches_yielded` must be <= {size.batches_per_rank} batches per "
                          f"rank. Found: {batches_yielded}")
    if batches_yielded == size.batches_per_rank:
        return total
    return start + batches_yielded * world_size * batch_size


def _check_rank(rank: int, world_size: int) -> None:
    check_int("rank", rank, 0, check_int("world_size", world_size, 1) - 1)


def rank_positions(size: EpochSize, *, start: int, world_size: int, rank: int,
                   batch_size: int, total: int) -> np.ndarray:
    """Positions in the epoch's order of rank ``rank``'s samples of the rest of an epoch.

    Args:
        size: :func:`epoch_size` of that rest (``total`` samples, ``start`` consumed).

    Returns:
        int64 of shape ``(size.samples_per_rank,)``: batch ``j`` is the ``batch_size``
        positions from ``j * batch_size`` (the last one ``size.last_batch_size``), in order
        within each batch. Padding positions (past the end of the order) are already taken
        modulo ``total``.
    """
    return _take(None, size, start=start, world_size=world_size, rank=rank,
                 batch_size=batch_size, total=total, dtype=np.int64)


def batch_positions(size: EpochSize, *, start: int, world_size: int, rank: int,
                    batch_size: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Where rank ``rank``'s batches of the rest of an epoch lie in its order, without a
    position a sample.

    Returns:
        ``(heads, tail)``: int64 of shape ``(size.batches_per_rank - 1,)``, the first position
        of each full batch (batch ``j`` is the ``batch_size`` positions from ``heads[j]``, in
        order, never past the order's end: column block ``rank`` of the rounds of
        ``world_size * batch_size`` positions from ``start``), and int64 of shape
        ``(size.last_batch_size,)``, the positions of its last batch (the module's rule 3),
        taken modulo ``total``. Both empty when there is no batch.
    """
    if size.batches_per_rank == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    full, last = size.batches_per_rank - 1, size.last_batch_size
    per_round = world_size * batch_size
    heads = np.arange(full, dtype=np.int64) * per_round + (start + rank * batch_size)
    tail = (start + full * per_round + rank * last + np.arange(last, dtype=np.int64)) % total
    return heads, tail


def _take(order: np.ndarray | None, size: EpochSize, *, start: int, world_size: int,
          rank: int, batch_size: int, total: int,
          dtype: type[np.signedinteger]) -> np.ndarray:
    """``order[rank_positions(...)]`` (the positions themselves where ``order`` is None, the
    identity), made without the positions: ``dtype`` (one that holds ``total``) of shape
    ``(size.samples_per_rank,)``.

    Rank ``rank``'s full batches are column block ``rank`` of the order's rounds of
    ``world_size * batch_size`` samples from ``start`` (they never pass the order's end), a
    strided view copied once; its last batch is the few positions of the module's rule 3.
    """
    ids = np.empty(size.samples_per_rank, dtype=dtype)
    heads, tail = batch_positions(size, start=start, world_size=world_size, rank=rank,
                                  batch_size=batch_size, total=total)
    full = len(heads)
    body = ids[: full * batch_size].reshape(full, batch_size)
    if order is None:
        np.add(heads[:, None], np.arange(batch_size, dtype=np.int64), out=body)
    elif full:
        per_round, first = world_size * batch_size, int(heads[0])
        rounds = order[start : start + full * per_round].reshape(full, per_round)
        body[...] = rounds[:, first - start : first - start + batch_size]
    ids[full * batch_size :] = tail if order is None else order[tail]
    return ids


def batch_bounds(samples: int, batch_size: int) -> np.ndarray:
    """Where each batch of ``samples`` positions cut into batches of ``batch_size`` (the last
    one shorter) starts: int64 of shape ``(batches + 1,)``, from 0 to ``samples``."""
    return np.append(np.arange(0, samples, batch_size, dtype=np.int64), samples)


def ranges_of(ids: np.ndarray, bounds: np.ndarray, ends: np.ndarray, *,
              chunk: int = CHUNK) -> Batches:
    """Batches of sample ids as ranges: batch ``i`` is ``ids[bounds[i]:bounds[i + 1]]``
    (non-empty; ``bounds`` runs from 0 to ``len(ids)``), sorted within the batch, each sample
    once; ``ends`` the shards' cumulative sizes. Adjacent samples of one shard merge into one
    ``(shard, start, stop)`` range.

    A range never crosses a batch, so whole batches of about ``chunk`` samples are converted
    at a time, in two passes: one marks where ranges start (a bool a sample), the other fills
    the table, made once its rows are counted. Beside ``ids`` and the result it holds that
    mark and temporaries of about ``chunk`` elements.

    Raises:
        InternalError: ``bounds`` does not run from 0 to ``len(ids)``.
    """
    if len(bounds) < 2:
        return Batches(np.zeros((0, 3), dtype=np.int64), np.zeros(1, dtype=np.int64))
    if bounds[0] != 0 or bounds[-1] != len(ids):
        raise InternalError(f"`bounds` must run from 0 to the {len(ids)} ids. Found: "
                            f"{int(bounds[0])} to {int(bounds[-1])}")
    groups = _groups(bounds, chunk)
    head = np.empty(len(ids), dtype=bool)
    for i, j in groups:
        lo, hi = int(bounds[i]), int(bounds[j])
        _mark_heads(ids[lo:hi], bounds[i:j] - lo, ends, out=head[lo:hi])
    table = np.empty((np.count_nonzero(head), 3), dtype=np.int64)
    firsts = np.empty(len(bounds), dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    row = 0
    for i, j in groups:
        lo, hi = int(bounds[i]), int(bounds[j])
        at = np.flatnonzero(head[lo:hi])
        table[row : row + len(at)] = _rows(ids[lo:hi], at, ends, starts)
        firsts[i:j] = row + np.searchsorted(at, bounds[i:j] - lo)
        row += len(at)
    firsts[-1] = row
    return Batches(table, firsts)


def _groups(bounds: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """Consecutive batches ``[i, j)`` of ``bounds`` taken together: about ``chunk`` samples,
    one batch at least."""
    batches = len(bounds) - 1
    per = max(1, chunk // max(1, int(np.diff(bounds).max())))
    return [(i, min(i + per, batches)) for i in range(0, batches, per)]


def _mark_heads(ids: np.ndarray, firsts: np.ndarray, ends: np.ndarray, *,
                out: np.ndarray) -> None:
    """Mark in ``out`` (bool, shaped like ``ids``) where ranges start in whole batches of
    ``ids`` (``firsts`` their first positions): at each batch's first sample and wherever an
    id is not the id before it + 1 of the same shard. Id ``x + 1`` after ``x`` starts another
    shard exactly when it is one of the ``ends`` (the first id after a shard), so only those
    few samples are looked up among the shards."""
    np.not_equal(ids[1:], ids[:-1] + 1, out=out[1:])
    follows = np.flatnonzero(~out[1:]) + 1
    out[follows] = ends[np.searchsorted(ends, ids[follows])] == ids[follows]
    out[firsts] = True


def _rows(ids: np.ndarray, at: np.ndarray, ends: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The ``(shard, start, stop)`` rows of whole batches of ``ids`` whose ranges start at
    positions ``at``: int64 of shape ``(len(at), 3)``; ``starts`` the shards' first ids."""
    lasts = np.append(at[1:], len(ids)) - 1
    shard = np.searchsorted(ends, ids[at], side="right")
    base = starts[shard]
    return np.stack([shard, ids[at] - base, ids[lasts] + 1 - base], axis=1)


def sort_within(ids: np.ndarray, bounds: np.ndarray, *, chunk: int = CHUNK) -> None:
    """Sort ``ids`` within each batch ``ids[bounds[i]:bounds[i + 1]]`` (``bounds`` from 0 to
    ``len(ids)``, non-decreasing), in place: a rank's ids are its plan's largest array but the
    table.

    Batches of one size (the last one may be shorter) are sorted as the rows of one view;
    batches of many sizes (a mixture's parts) one by one where they average
    :data:`SORT_ONE_BY_ONE` samples or more, else a group of about ``chunk`` samples at a
    time (its temporaries are about 24 bytes a sample of the group).

    Raises:
        InternalError: ``ids`` is not C-contiguous (a reshape of it would sort a copy).
    """
    if not ids.flags.c_contiguous:
        raise InternalError("`ids` must be C-contiguous to be sorted in place. Found: strides "
                            f"{ids.strides}")
    sizes = np.diff(bounds)
    if len(sizes) == 0:
        return
    if sizes[0] and (sizes[:-1] == sizes[0]).all():  # full batches, then maybe a short one
        cut = int(bounds[-2])
        ids[:cut].reshape(-1, int(sizes[0])).sort(axis=-1)
        ids[cut:].sort()
        return
    if len(ids) >= SORT_ONE_BY_ONE * len(sizes):
        edges = bounds.tolist()
        for i in np.flatnonzero(sizes > 1).tolist():
            ids[edges[i] : edges[i + 1]].sort()
        return
    for i, j in _groups(bounds, chunk):
        lo, hi = int(bounds[i]), int(bounds[j])
        group = ids[lo:hi]
        batch = np.repeat(np.arange(j - i), sizes[i:j])
        group[...] = group[np.lexsort((group, batch))]


def _epoch_ids(sizes: np.ndarray, size: EpochSize, *, epoch: int, seed: int, shuffle: Shuffle,
               start: int, world_size: int, rank: int, batch_size: int) -> np.ndarray:
    """Rank ``rank``'s sample ids of the rest of the epoch, in its batches' order:
    :func:`~dataflow.shuffle.id_dtype` (int32 below 2^31 samples) of shape
    ``(size.samples_per_rank,)``. The epoch's order lives only in here (it is let go before
    the rank's table is made), and the ``"none"`` shuffle's, the identity, not at all.
    """
    total = int(sizes.sum())
    order = None if shuffle.mode == "none" else compact_epoch_order(
        sizes, epoch=epoch, seed=seed, shuffle=shuffle)
    return _take(order, size, start=start, world_size=world_size, rank=rank,
                 batch_size=batch_size, total=total, dtype=id_dtype(total))


class Batches(Sequence[list[Range]]):
    """One rank's batches, stored as arrays; each batch becomes ``Range`` objects on access.

    Building Python objects for every range up front costs seconds on 10M samples; this keeps
    the plan at a few bytes per sample and converts one batch (~``batch_size`` ranges) at a
    time. Immutable; slicing gives another :class:`Batches` sharing the arrays.

    Attributes:
        table: int64 array of shape ``(ranges, 3)``, columns (shard, start, stop).
        bounds: int64 array of shape ``(batches + 1,)``: batch ``i`` is
            ``table[bounds[i]:bounds[i + 1]]``.
    """

    def __init__(self, table: np.ndarray, bounds: np.ndarray) -> None:
        self.table = table
        self.bounds = bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, index: int) -> list[Range]: ...

    @overload
    def __getitem__(self, index: slice) -> Batches: ...

    def __getitem__(self, index: int | slice) -> list[Range] | Batches:
        if isinstance(index, slice):
            first, stop, step = index.indices(len(self))
            if step != 1:
                raise ConfigError(f"Batches slices must be contiguous. Found step {step}")
            return Batches(self.table, self.bounds[first : max(stop, first) + 1])
        i = range(len(self))[index]
        rows = self.table[self.bounds[i] : self.bounds[i + 1]].tolist()
        return list(map(Range._make, rows))

    def rows(self, index: int) -> np.ndarray:
        """Batch ``index`` as an int64 array of shape ``(ranges, 3)`` (a view, no copy)."""
        i = range(len(self))[index]
        return self.table[self.bounds[i] : self.bounds[i + 1]]

    @classmethod
    def of(cls, batches: Sequence[Sequence[tuple[int, int, int]]]) -> Batches:
        """Batches from lists of ``(shard, start, stop)`` triples."""
        rows = [r for b in batches for r in b]
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        bounds = np.cumsum([0, *(len(b) for b in batches)], dtype=np.int64)
        return cls(table, bounds)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batches):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches, {int(self.bounds[-1] - self.bounds[0])} ranges)"


def rank_batches(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int,
    batch_size: int,
    drop_last: bool = False,
    start: int = 0,
    shuffle: Shuffle | str | bool = "sample",
) -> Batches:
    """Rank ``rank``'s batches of the rest of an epoch after ``start`` consumed samples.

    Args:
        shard_sizes: number of samples in each shard, in dataset order.
        world_size: ranks of the job reading the rest of the epoch.
        rank: this rank, ``0 <= rank < world_size``.
        epoch: epoch number (>= 0).
        seed: non-negative seed shared by all ranks.
        batch_size: samples per batch.
        drop_last: drop the tail instead of padding it (see the module).
        start: samples of the epoch's global order already consumed (0 for a fresh epoch;
            else the value of :func:`consumed`).
        shuffle: how the epoch's order is drawn: a :class:`~dataflow.shuffle.Shuffle`, or
            its mode alone (``"sample"``, the default, ``"block"``, ``"none"`` or a bool) with
            the default knobs.

    Returns:
        ``epoch_size(..., start=start).batches_per_rank`` batches (a sequence computed with
        numpy, ~1 s for 10M samples on one rank; see :class:`Batches`), each a list of ranges
        sorted by (shard, start) with adjacent samples merged; all batches hold ``batch_size``
        samples except possibly the last (``last_batch_size``). Beside this result (24 bytes
        a range) planning holds at most about 5 bytes a sample of the epoch (its order in
        int32, or the rank's ids and a mark a sample) and a chunk's temporaries (:data:`CHUNK`).
    """
    _check_rank(rank, world_size)
    sizes = shard_sizes_array(shard_sizes)
    check_int("epoch", epoch, 0)
    check_int("seed", seed, 0)
    how = as_shuffle(shuffle)
    size = epoch_size(int(sizes.sum()), world_size=world_size, batch_size=batch_size,
                      drop_last=drop_last, start=start)
    ids = _epoch_ids(sizes, size, epoch=epoch, seed=seed, shuffle=how, start=start,
                     world_size=world_size, rank=rank, batch_size=batch_size)
    bounds = batch_bounds(len(ids), batch_size)
    sort_within(ids, bounds)
    return ranges_of(ids, bounds, np.cumsum(sizes))
