"""Weighted mixtures of datasets: which source each sample of a mixture comes from, and which
samples of each source each rank reads. Pure functions, no I/O.

A mixture of ``K`` sources (each a dataset of its own shards) with weights is read as one
stream of *slots*: slot ``s`` (``s = 0, 1, ...`` from the start of training, across epochs)
is a sample of source :meth:`Weights.source_of` ``(s)``, and it is that source's
``Weights.position(s)``-th sample: each source's samples are consumed as one endless stream of
passes over it, pass ``q`` a permutation of all its samples (:func:`dataflow.shuffle.
epoch_order` of the source's shards, epoch ``q``, the source's own seed). So every pass over a
source reads each of its samples exactly once: a source weighed above its share of the data
(upsampled) repeats whole passes, one below it (downsampled) reads a seeded subset per mixture
epoch (the next part of its current pass, so the next epochs read the rest of that pass).

Proportions. Weights are exact fractions (:class:`Weights`): source ``k`` takes ``a_k`` of
every ``P = sum(a)`` consecutive slots. Slots are assigned by earliest deadline first over the
quota windows of each source (a source's ``j``-th slot lies in ``[floor(j P / a_k),
ceil((j + 1) P / a_k))``), so after any ``n`` slots from the start, source ``k`` had
``floor(n a_k / P)`` or ``ceil(n a_k / P)`` of them; the assignment repeats every ``P`` slots,
so *every* window of ``P`` consecutive slots holds exactly ``a_k`` of source ``k``, and any
window of ``n`` consecutive slots within 2 of ``n a_k / P``. A batch of ``B`` slots holds
``B a_k / P`` samples of source ``k`` when that is an integer; otherwise every window of
``P / gcd(P, B)`` consecutive batches is exact.

Epochs. A mixture epoch is ``samples_per_epoch`` (``S``) slots: epoch ``e`` is slots
``[e S, (e + 1) S)``. It is cut into batches and ranks exactly as a single dataset's epoch of
``S`` samples in storage order is (:mod:`dataflow.plan`): consumption is a prefix of the
epoch's slots, rank ``r`` of ``W`` takes global batches ``r, r + W, ...``, a resume is the
consumed slot count of an epoch and works on any world size, and every rank gets the same
number of batches. The tail: with ``drop_last=False`` fewer than ``W`` slots of the epoch's
start are read again (their samples twice), with ``drop_last=True`` fewer than ``W x B``
slots are not read (their samples are missing from their source's pass). Every other sample
of every source's pass is read exactly once.

Inside a batch each source's samples form one *part*, in source order, as a single dataset's
batch is: ranges sorted by (shard, start), adjacent samples merged. A part may name a sample
twice (a source of fewer samples than its share of a batch, or a part that spans the end of one
pass and the start of the next): its ranges name each sample once and :attr:`Part.copies` says
how many times each one is in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Real

import numpy as np

from dataflow.checks import check_int
from dataflow.errors import ConfigError, InternalError
from dataflow.plan import (
    CHUNK,
    Batches,
    EpochSize,
    batch_positions,
    epoch_size,
    ranges_of,
    sort_within,
)
from dataflow.shuffle import Shuffle, as_shuffle, compact_epoch_order, id_dtype, shard_sizes_array
from dataflow.transform import SEED_MAX, global_batch_index
from dataflow.wire.fields import INT64_MAX

__all__ = [
    "MAX_PERIOD",
    "MixtureBatches",
    "Weights",
    "last_epoch",
    "mixture_batches",
    "mixture_size",
    "source_seed",
]

MAX_PERIOD = 1 << 16
"""The most slots the assignment of sources to slots may take to repeat (the sum of the
weights as integers in lowest terms): it is planned once, in ~0.1 s at this size."""


def _fraction(k: int, w: object) -> Fraction:
    """Weight ``w`` of source ``k`` as an exact fraction (a float: the nearest one whose
    denominator is at most :data:`MAX_PERIOD`, so 0.7 is 7/10)."""
    if isinstance(w, bool) or not isinstance(w, Real | Fraction) or not math.isfinite(w):
        raise ConfigError(f"`weights[{k}]` must be a finite number > 0. Found: {w!r}")
    exact = w if isinstance(w, int | Fraction) else Fraction(float(w)).limit_denominator(
        MAX_PERIOD)
    if exact <= 0:
        raise ConfigError(f"`weights[{k}]` must be > 0. Found: {w!r}")
    return Fraction(exact)


def _pattern(counts: tuple[int, ...]) -> np.ndarray:
    """The source of each slot of one period: earliest deadline first over the quota windows
    (see the module). int64 of shape ``(sum(counts),)``.

    Raises:
        InternalError: no source could take a slot (impossible: the windows are feasible).
    """
    period = sum(counts)
    taken = [0] * len(counts)
    out = np.empty(period, dtype=np.int64)
    for t in range(period):
        best, due = -1, period
        for k, a in enumerate(counts):
            j = taken[k]
            if j == a or j * period // a > t:  # its period's share is done, or it is ahead
                continue
            deadline = -(-(j + 1) * period // a) - 1
            if deadline < due or best < 0:
                best, due = k, deadline
        if best < 0 or due < t:
            raise InternalError(f"no source can take slot {t} of the mixture {counts}")
        out[t] = best
        taken[best] += 1
    return out


@dataclass(frozen=True)
class Weights:
    """The sources' shares as integers in lowest terms: source ``k`` takes ``counts[k]`` of
    every :attr:`period` consecutive slots (see the module). Build with :meth:`of`.

    Attributes:
        counts: one positive integer per source, their greatest common divisor 1.
        pattern: int64 of shape ``(period,)``: the source of each slot of a period.
        nth: int64 of shape ``(period,)``: each slot's index among its source's slots of the
            period.
        before: int64 of shape ``(period + 1, sources)``: slots of each source in the
            period's first ``t`` slots.
    """

    counts: tuple[int, ...]
    pattern: np.ndarray = field(init=False, repr=False, compare=False)
    nth: np.ndarray = field(init=False, repr=False, compare=False)
    before: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = tuple(check_int(f"weights[{k}]", a, 1) for k, a in enumerate(self.counts))
        if not counts:
            raise ConfigError("`weights` must name at least one source. Found: ()")
        if math.gcd(*counts) != 1 or sum(counts) > MAX_PERIOD:
            raise ConfigError(f"`counts` must be in lowest terms and sum to at most "
                              f"{MAX_PERIOD}. Found: {counts}")
        object.__setattr__(self, "counts", counts)
        pattern = _pattern(counts)
        onehot = pattern[:, None] == np.arange(len(counts))[None, :]
        before = np.zeros((len(pattern) + 1, len(counts)), dtype=np.int64)
        np.cumsum(onehot, axis=0, out=before[1:])
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "nth", before[np.arange(len(pattern)), pattern])
        object.__setattr__(self, "before", before)

    @classmethod
    def of(cls, weights: Sequence[object]) -> Weights:
        """The weights of the sources, any positive numbers (normalized; a float is taken as
        the nearest fraction of denominator at most :data:`MAX_PERIOD`: 0.7 is 7/10).

        Raises:
            ConfigError: a weight is not a finite number > 0, there are none, or their
                period (the sum of the weights as integers in lowest terms) is over
                :data:`MAX_PERIOD`, naming it.
        """
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
            raise ConfigError(f"`weights` must be a list of numbers. Found: {weights!r}")
        if not weights:
            raise ConfigError("`weights` must name at least one source. Found: []")
        fractions = [_fraction(k, w) for k, w in enumerate(weights)]
        scale = math.lcm(*(f.denominator for f in fractions))
        ints = [int(f * scale) for f in fractions]
        common = math.gcd(*ints)
        counts = tuple(n // common for n in ints)
        if sum(counts) > MAX_PERIOD:
            raise ConfigError(f"`weights` {list(weights)!r} are {list(counts)} in lowest "
                              f"terms: their assignment repeats every {sum(counts)} samples, "
                              f"more than {MAX_PERIOD}; round them (e.g. to integers summing "
                              f"to at most {MAX_PERIOD})")
        return cls(counts)

    @property
    def period(self) -> int:
        """Slots after which the assignment repeats: ``sum(counts)``."""
        return len(self.pattern)

    @property
    def shares(self) -> tuple[Fraction, ...]:
        """Each source's share of the slots (they sum to 1)."""
        return tuple(Fraction(a, self.period) for a in self.counts)

    def source_of(self, slots: np.ndarray) -> np.ndarray:
        """The source of each slot (int64 array of any shape, slots >= 0)."""
        return self.pattern[slots % self.period]

    def position(self, slots: np.ndarray) -> np.ndarray:
        """Each slot's position in its source's stream: how many slots of that source come
        before it (int64, same shape)."""
        turn, at = np.divmod(slots, self.period)
        return turn * np.asarray(self.counts, dtype=np.int64)[self.pattern[at]] + self.nth[at]

    def taken(self, slot: int) -> tuple[int, ...]:
        """Samples of each source among slots ``[0, slot)``."""
        turn, at = divmod(check_int("slot", slot, 0), self.period)
        return tuple(turn * a + int(b) for a, b in zip(self.counts, self.before[at],
                                                        strict=True))


def last_epoch(samples_per_epoch: int) -> int:
    """The last mixture epoch of ``samples_per_epoch`` slots whose slots an int64 numbers
    (slot ``epoch * samples_per_epoch + i``)."""
    return INT64_MAX // check_int("samples_per_epoch", samples_per_epoch, 1) - 1


def source_seed(seed: int, source: int) -> int:
    """The seed of source ``source``'s passes and batch tags in a mixture seeded ``seed``: its
    own, so sources of equal shard sizes are not shuffled alike. In ``[0, 2**63)``."""
    words = [check_int("seed", seed, 0, SEED_MAX), check_int("source", source, 0)]
    lo, hi = np.random.SeedSequence([w for v in words for w in (v & 0xFFFFFFFF, v >> 32)]
                                    + [0x6D6978]).generate_state(2, np.uint32).tolist()
    return (lo | hi << 32) & SEED_MAX


def mixture_size(samples_per_epoch: int, *, world_size: int, batch_size: int,
                 drop_last: bool, start: int = 0) -> EpochSize:
    """Sizes of the rest of a mixture epoch of ``samples_per_epoch`` slots after ``start``
    (:func:`dataflow.plan.epoch_size` of that many samples)."""
    return epoch_size(samples_per_epoch, world_size=world_size, batch_size=batch_size,
                      drop_last=drop_last, start=start)


@dataclass(frozen=True)
class Part:
    """Source ``source``'s samples of one mixture batch, as a request reads them.

    Attributes:
        source: the source's number.
        rows: int64 of shape ``(ranges, 3)``: ``(shard, start, stop)`` of the source's shards,
            sorted, each sample once.
        copies: None (each sample once), or int64 of shape ``(samples,)``: how many times
            each sample the rows name, in order, is in the batch (>= 1).
    """

    source: int
    rows: np.ndarray
    copies: np.ndarray | None = None

    @property
    def samples(self) -> int:
        """Samples of this part in the batch, copies counted."""
        if self.copies is not None:
            return int(self.copies.sum())
        return int((self.rows[:, 2] - self.rows[:, 1]).sum())


@dataclass(frozen=True)
class MixtureBatches:
    """One rank's batches of (the rest of) one mixture epoch.

    Attributes:
        counts: int64 of shape ``(batches, sources)``: samples of each source in each batch
            (copies counted).
        parts: per source, its non-empty parts as :class:`~dataflow.plan.Batches`, in batch
            order: part ``i`` of source ``k`` belongs to batch ``index[k][i]``.
        index: per source, int64 of shape ``(parts,)``: the batch of each of its parts.
        copies: per source, ``{part: copies}`` for its parts that name a sample twice or more
            (:attr:`Part.copies`).
        runs: per source, int64 of shape ``(parts,)``: one past the last of its parts that
            may be read together with part ``i`` in one request without naming a sample
            twice: the parts of one pass over the source (a part that spans two passes goes
            alone).
        first: the global batch index of batch 0 (:func:`dataflow.transform.
            global_batch_index`); batch ``j`` is global batch ``first + j * stride``.
        stride: the world size.
    """

    counts: np.ndarray
    parts: tuple[Batches, ...]
    index: tuple[np.ndarray, ...]
    copies: tuple[dict[int, np.ndarray], ...]
    runs: tuple[np.ndarray, ...]
    first: int
    stride: int

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def sources(self) -> int:
        return self.counts.shape[1]

    def part_of(self, source: int, batch: int) -> int:
        """The number of source ``source``'s part of batch ``batch`` among its parts (-1: the
        batch has none of that source)."""
        where = int(np.searchsorted(self.index[source], batch))
        found = where < len(self.index[source]) and self.index[source][where] == batch
        return where if found else -1

    def batch(self, j: int) -> list[Part]:
        """Batch ``j``'s parts, in source order (sources with samples in it only)."""
        out = []
        for k in range(self.sources):
            i = self.part_of(k, j)
            if i >= 0:
                out.append(Part(k, self.parts[k].rows(i), self.copies[k].get(i)))
        return out

    def global_index(self, j: int) -> int:
        """The global batch index of batch ``j`` in its epoch."""
        return self.first + j * self.stride


def _taken(weights: Weights, slots: np.ndarray) -> np.ndarray:
    """Samples of each source among slots ``[0, s)`` for each ``s`` of ``slots`` (int64 of
    shape ``(n,)``): int64 of shape ``(n, sources)``."""
    turn, at = np.divmod(slots, weights.period)
    return turn[:, None] * np.asarray(weights.counts, dtype=np.int64) + weights.before[at]


def _source_ids(sizes: np.ndarray, lo: np.ndarray, hi: np.ndarray, tail: np.ndarray, *,
                seed: int, shuffle: Shuffle, chunk: int = CHUNK) -> np.ndarray:
    """The sample ids at positions of a source's endless stream of passes (pass ``q``: its
    epoch ``q`` order under ``seed``): the ranges ``[lo[j], hi[j])`` (int64 of shape
    ``(batches,)``, increasing and disjoint, some empty), then the positions ``tail``.

    Returns:
        :func:`~dataflow.shuffle.id_dtype` of the source's samples (int32 below 2^31) of shape
        ``(sum(hi - lo) + len(tail),)``. Each pass it reads is drawn once, in that type, and
        the ranges' ids gathered from it ``chunk`` at a time, never a position a sample of
        the whole.
    """
    total = int(sizes.sum())
    off = np.concatenate([[0], np.cumsum(hi - lo)])
    body = int(off[-1])
    ids = np.empty(body + len(tail), dtype=id_dtype(total))
    tail_passes = tail // total
    in_tail = set(tail_passes.tolist())
    passes = set(in_tail)
    cuts: dict[int, tuple[int, int]] = {}
    if body:
        first = int(lo[np.flatnonzero(hi > lo)[0]]) // total
        bound = np.arange(first, (int(hi[-1]) - 1) // total + 2, dtype=np.int64) * total
        below = _count_below(bound, lo, hi, off)
        for q, a, b in zip(range(first, first + len(bound) - 1), below[:-1].tolist(),
                           below[1:].tolist(), strict=True):
            if a < b:
                cuts[q] = a, b
        passes.update(cuts)
    shift = lo - off[:-1]  # a range's positions minus their indices among the ranges' ids
    for q in sorted(passes):
        order = None if shuffle.mode == "none" else compact_epoch_order(
            sizes, epoch=q, seed=seed, shuffle=shuffle)
        a, b = cuts.get(q, (0, 0))
        for u in range(a, b, chunk):
            at = np.arange(u, min(u + chunk, b), dtype=np.int64)
            at += shift[np.searchsorted(off, at, side="right") - 1] - q * total
            ids[u : u + len(at)] = at if order is None else order[at]
        if q in in_tail:
            mine = np.flatnonzero(tail_passes == q)
            at = tail[mine] - q * total
            ids[body + mine] = at if order is None else order[at]
    return ids


def _count_below(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Positions below each of ``x`` in the ranges ``[lo[j], hi[j])`` (increasing, disjoint;
    ``off`` the running sum of their lengths from 0): int64 shaped like ``x``."""
    j = np.searchsorted(hi, x, side="right")  # ranges wholly below x
    part = np.minimum(j, len(lo) - 1)
    inside = np.clip(x - lo[part], 0, hi[part] - lo[part])
    return off[j] + np.where(j < len(lo), inside, 0)


def _once(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                        dict[int, np.ndarray]]:
    """Parts ``ids[bounds[i]:bounds[i + 1]]``, each sorted, with each sample once.

    Returns:
        ``(ids, bounds, copies)``: the parts' ids, each sample once (``ids`` itself when no
        part names a sample twice), their bounds, and ``{part: copies}`` for the parts that
        named a sample twice or more (:attr:`Part.copies`, int64).
    """
    again = np.zeros(len(ids), dtype=bool)
    np.equal(ids[1:], ids[:-1], out=again[1:])
    again[bounds[:-1]] = False
    repeats = np.flatnonzero(again)
    if len(repeats) == 0:
        return ids, bounds, {}
    np.logical_not(again, out=again)
    once = ids[again]
    del again
    cut = np.searchsorted(repeats, bounds)  # repeats before each bound
    owner = repeats - np.arange(1, len(repeats) + 1, dtype=np.int64)  # each one's sample
    bounds = bounds - cut
    copies = {}
    for i in np.unique(np.searchsorted(bounds, owner, side="right") - 1).tolist():
        a, b = int(bounds[i]), int(bounds[i + 1])
        copies[i] = 1 + np.bincount(owner[cut[i] : cut[i + 1]] - a, minlength=b - a)
    return once, bounds, copies


def _runs(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """:attr:`MixtureBatches.runs` of one source: ``first`` and ``last`` give the first and
    the last pass over the source that each of its parts reads (int64 of shape
    ``(parts,)``)."""
    if len(first) == 0:
        return np.zeros(0, dtype=np.int64)
    key = np.where(first == last, first, -1 - np.arange(len(first)))
    bounds = np.append(np.flatnonzero(np.diff(key, prepend=key[0] - 1)), len(key))
    return bounds[np.searchsorted(bounds, np.arange(len(key)), side="right")]


def mixture_batches(
    sources: Sequence[Sequence[int] | np.ndarray],
    weights: Weights,
    *,
    samples_per_epoch: int,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int,
    batch_size: int,
    drop_last: bool = False,
    start: int = 0,
    shuffle: Shuffle | str | bool = "sample",
) -> MixtureBatches:
    """Rank ``rank``'s batches of the rest of mixture epoch ``epoch`` after ``start`` slots.

    Args:
        sources: each source's shard sizes (every source holds at least one sample).
        weights: the sources' shares (one per source).
        samples_per_epoch: slots (samples) per mixture epoch, >= 1.
        world_size: ranks of the job reading the rest of the epoch.
        rank: this rank, ``0 <= rank < world_size``.
        epoch: the mixture epoch (>= 0).
        seed: non-negative seed shared by all ranks (each source's passes use
            :func:`source_seed`).
        batch_size: samples per batch.
        drop_last: drop the epoch's tail instead of padding it (see the module).
        start: slots of the epoch already consumed (:func:`dataflow.plan.consumed` of the
            epoch's ``samples_per_epoch``).
        shuffle: how each source's passes are ordered (:class:`~dataflow.shuffle.Shuffle`).

    Returns:
        The rank's batches. Each full batch is ``batch_size`` consecutive slots, so a source's
        samples in it are consecutive positions of its stream: planning makes no array of a
        slot each; for one source at a time it holds that source's ids in the rank's batches
        (int32 below 2^31 samples) and a mark each, one pass over the source (its order, in
        that type, and its making) and a chunk's temporaries (:data:`~dataflow.plan.CHUNK`)
        beside the result.

    Raises:
        ConfigError: an input is invalid, naming it.
    """
    if len(sources) != len(weights.counts):
        raise ConfigError(f"`sources` must have one entry per weight ({len(weights.counts)}). "
                          f"Found: {len(sources)}")
    check_int("rank", rank, 0, check_int("world_size", world_size, 1) - 1)
    check_int("epoch", epoch, 0, last_epoch(samples_per_epoch))
    how = as_shuffle(shuffle)
    sizes = [shard_sizes_array(s) for s in sources]
    for k, s in enumerate(sizes):
        if s.sum() == 0:
            raise ConfigError(f"`sources[{k}]` must hold at least one sample. Found: none")
    size = mixture_size(samples_per_epoch, world_size=world_size, batch_size=batch_size,
                        drop_last=drop_last, start=start)
    heads, tail = batch_positions(size, start=start, world_size=world_size, rank=rank,
                                  batch_size=batch_size, total=samples_per_epoch)
    heads += epoch * samples_per_epoch
    lo, hi = _taken(weights, heads), _taken(weights, heads + batch_size)
    tail += epoch * samples_per_epoch
    tail_source, tail_stream = weights.source_of(tail), weights.position(tail)
    counts = np.empty((size.batches_per_rank, len(sizes)), dtype=np.int64)
    np.subtract(hi, lo, out=counts[: len(heads)])
    counts[len(heads) :] = np.bincount(tail_source, minlength=len(sizes))
    parts, index, copies, runs = [], [], [], []
    for k, shard_sizes in enumerate(sizes):
        total = int(shard_sizes.sum())
        stream = tail_stream[tail_source == k]
        ids = _source_ids(shard_sizes, lo[:, k], hi[:, k], stream, seed=source_seed(seed, k),
                          shuffle=how)
        where = np.flatnonzero(counts[:, k])
        bounds = np.concatenate([[0], np.cumsum(counts[where, k])])
        sort_within(ids, bounds)
        ids, bounds, twice = _once(ids, bounds)
        parts.append(ranges_of(ids, bounds, np.cumsum(shard_sizes)))
        del ids
        index.append(where)
        copies.append(twice)
        first_pass, last_pass = lo[:, k] // total, (hi[:, k] - 1) // total
        if len(stream):
            first_pass = np.append(first_pass, stream.min() // total)
            last_pass = np.append(last_pass, stream.max() // total)
        runs.append(_runs(first_pass[where], last_pass[where]))
    first = global_batch_index(start=start, batch_size=batch_size, world_size=world_size,
                               rank=rank, index=0)
    return MixtureBatches(counts, tuple(parts), tuple(index), tuple(copies), tuple(runs), first,
                          world_size)
