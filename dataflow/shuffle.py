"""The global sample order of an epoch. Pure functions, no I/O.

An epoch's order is a permutation of the dataset's ``N`` samples, given as flat sample ids
(sample ``i`` of shard ``s`` has id ``offsets[s] + i``, ``offsets`` the running sum of the shard
sizes). It is a deterministic function of (shard sizes, seed, epoch, shuffle mode and its knobs)
and never depends on the world size, so a job of any size walks the same order.

How an order is drawn is one frozen value, :class:`Shuffle`: the mode and its knobs (a
DataLoader's ``shuffle``, ``shuffle_window``, ``block_size`` and ``window`` arguments, the
same names in its resume state), validated when it is made.

Modes (:attr:`Shuffle.mode`, the ``shuffle`` argument), measured on class-sorted shards with
``python -m dataflow.bench.experiments.shuffle`` (batch 256; figures in bench/RESULTS.md):

``"sample"`` (the default, also ``True``)
    Shards are permuted, then the concatenated sequence is cut into consecutive windows of
    ``shuffle_window`` samples (the first window starts at a random offset, so boundaries move
    between epochs) and the samples of each window are permuted. The default window, 2^40
    samples, holds any dataset: the epoch is one window, a uniform random permutation of
    every sample, what ``torch.utils.data.RandomSampler`` draws, at any size: 92.4 distinct
    classes per batch on 100 classes x 400 samples (RandomSampler: 92.9), 226.0 on
    1.28M samples of 1,000 classes in 1,024 shards and on 4.1M in 4,096 shards (a full
    shuffle: 225.9, 226.0), and as many pairs of samples sharing a batch share one again the
    next epoch (about ``batch / N``).

    A smaller window bounds the working set: a batch's samples lie in at most two
    consecutive windows, each spanning about ``shuffle_window / samples per shard + 1``
    shards and ``shuffle_window`` samples' bytes (give a remote dataset's block cache that
    much, see docs/using.md). Mixing then depends on the data's layout: on class-sorted shards
    a batch draws from the classes of a window's shards. With 1,000 classes, a window of
    half the data gives 88% of a full shuffle's distinct classes per batch on 1,024 shards of
    about one class each and 96% on 4,096 shards of a quarter class each; a quarter 78% and
    92%; a sixteenth 41% and 70% (and 1.25x the full shuffle's pairs co-batched again); the
    2^18 window that was the default before, 75% and 70%. Where each shard holds many
    classes, a window mixes classes like a full shuffle; the pairs co-batched again depend
    on the window alone.

    A batch of the default draws its samples from nearly as many shards as it has samples
    when there are more shards than that (227 shards per batch of 256 on 1,024 shards): the
    cost is on the servers, whose readers gather each shard's samples of a batch in one pass
    straight into the batch (:func:`dataflow.readers.read_ranges`); the cost grows with the
    shards a batch reads (docs/using.md, "Shuffling").
``"block"``
    The cheaper locality-first shuffle: shards permuted, each cut into blocks of
    ``block_size`` consecutive samples, and blocks permuted within windows of ``window``
    consecutive shards. Reads are contiguous runs of a block, but mixing is poor: with
    (64, 8) about 5 distinct classes per batch and about 20% of co-batched pairs co-batched
    again the next epoch.
``"none"`` (also ``False``)
    Storage order: shard by shard, sample by sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.checks import check_int
from dataflow.errors import ConfigError

DEFAULT_BLOCK_SIZE = 64
DEFAULT_WINDOW = 8
DEFAULT_SHUFFLE_WINDOW = 1 << 40
"""The ``"sample"`` shuffle's default window: larger than any dataset (about 1.1e12 samples),
so by default an epoch is one window, a uniform random permutation of the whole dataset."""
MODES = ("sample", "block", "none")


def shuffle_mode(shuffle: str | bool) -> str:
    """The mode name for a ``shuffle`` argument: True is ``"sample"``, False is ``"none"``."""
    if shuffle is True:
        return "sample"
    if shuffle is False:
        return "none"
    if shuffle not in MODES:
        raise ConfigError(f"`shuffle` must be a bool or one of {MODES}. Found: {shuffle!r}")
    return shuffle


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's order is drawn (see the module), validated on construction.

    Attributes:
        mode: ``"sample"`` (the default), ``"block"`` or ``"none"``; True is ``"sample"``,
            False is ``"none"``.
        shuffle_window: samples per window of the ``"sample"`` shuffle (>= 1); the default
            holds any dataset (a full shuffle), a smaller one bounds the working set.
        block_size: samples per block of the ``"block"`` shuffle (>= 1).
        window: consecutive shards whose blocks the ``"block"`` shuffle mixes (>= 1).

    Raises:
        ConfigError: the mode or a knob is invalid, naming it (``shuffle`` for the mode).
    """

    mode: str = "sample"
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW
    block_size: int = DEFAULT_BLOCK_SIZE
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", shuffle_mode(self.mode))
        for name in ("shuffle_window", "block_size", "window"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))

    def fields(self) -> dict[str, str | int]:
        """The knobs by the names a DataLoader takes them and its state keeps them (the mode
        is ``shuffle``): plain Python scalars."""
        return {"shuffle": self.mode, "shuffle_window": self.shuffle_window,
                "block_size": self.block_size, "window": self.window}


def as_shuffle(shuffle: Shuffle | str | bool) -> Shuffle:
    """``shuffle`` as a :class:`Shuffle`: a mode (a name or a bool) gets the default knobs."""
    return shuffle if isinstance(shuffle, Shuffle) else Shuffle(shuffle_mode(shuffle))


def shard_sizes_array(shard_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Shard sizes as an int64 array of shape ``(shards,)``, checked to be >= 0."""
    sizes = np.asarray(shard_sizes, dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        bad = int(np.flatnonzero(sizes < 0)[0])
        raise ConfigError(f"`shard_sizes[{bad}]` must be >= 0. Found: {int(sizes[bad])}")
    return sizes


def id_dtype(total: int) -> type[np.signedinteger]:
    """The narrower of int32 and int64 that holds the sample ids of ``total`` samples and
    each id + 1: int32 below 2^31 samples (half the bytes of int64)."""
    return np.int32 if total < 1 << 31 else np.int64


def _runs(starts: np.ndarray, lengths: np.ndarray, dtype: type[np.signedinteger]) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each pair, of shape ``(sum(n),)``, in
    ``dtype`` (one that holds every ``s + n``).

    Made in the result alone (an epoch's order is its plan's largest array, 80 MB of int64
    for 10M samples): ones, each run's first element set to its step from the element before
    it (between minus and plus the largest ``s + n``), then summed in place.
    """
    starts, lengths = starts[lengths > 0], lengths[lengths > 0]
    out = np.ones(int(lengths.sum()), dtype=dtype)
    if len(out):
        before = np.concatenate([[0], starts[:-1] + lengths[:-1] - 1])
        out[np.cumsum(lengths) - lengths] = starts - before
        np.cumsum(out, dtype=dtype, out=out)
    return out


def _shard_ids(sizes: np.ndarray, offsets: np.ndarray, order: np.ndarray,
               dtype: type[np.signedinteger]) -> np.ndarray:
    """Sample ids of the shards in ``order``, each shard in storage order, in ``dtype``."""
    return _runs(offsets[order], sizes[order], dtype)


def _sample_shuffle(ids: np.ndarray, rng: np.random.Generator, window: int) -> np.ndarray:
    """Permute ``ids`` within consecutive windows of ``window``, the first one shorter, in
    place (``ids`` is returned): no copy of the epoch's order.

    The draws are those of ``rng.permutation`` of each end and ``rng.permuted`` of the windows
    between them (numpy's ``permutation`` shuffles a copy the same way), so the order is the
    same as theirs.
    """
    n = len(ids)
    head = int(rng.integers(1, window + 1)) if n > window else n
    full = (n - head) // window
    rng.shuffle(ids[:head])
    body = ids[head : head + full * window].reshape(full, window)
    rng.permuted(body, axis=1, out=body)
    rng.shuffle(ids[head + full * window :])
    return ids


def _block_shuffle(sizes: np.ndarray, offsets: np.ndarray, order: np.ndarray,
                   rng: np.random.Generator, block_size: int, window: int,
                   dtype: type[np.signedinteger]) -> np.ndarray:
    """Blocks of ``block_size`` permuted within windows of ``window`` shards of ``order``
    (sample ids in ``dtype``)."""
    counts = -(-sizes[order] // block_size)
    shard = np.repeat(order, counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    start = (np.arange(len(shard)) - first) * block_size
    stop = np.minimum(start + block_size, sizes[shard])
    group = np.repeat(np.arange(len(order)) // window, counts)
    perm = np.lexsort((rng.random(len(shard)), group))
    return _runs(offsets[shard[perm]] + start[perm], (stop - start)[perm], dtype)


def epoch_order(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: Shuffle | str | bool = "sample",
) -> np.ndarray:
    """The epoch's global order of samples.

    Args:
        shard_sizes: samples in each shard, in dataset order.
        epoch: epoch number (>= 0); each epoch has its own order.
        seed: non-negative seed shared by all ranks.
        shuffle: how: a :class:`Shuffle`, or its mode alone (``"sample"``, the default,
            ``"block"``, ``"none"`` or a bool) with the default knobs.

    Returns:
        int64 array of shape ``(N,)``: a permutation of the flat sample ids ``0..N-1``.
    """
    return _order(shard_sizes, epoch=epoch, seed=seed, shuffle=shuffle, compact=False)


def compact_epoch_order(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: Shuffle | str | bool = "sample",
) -> np.ndarray:
    """:func:`epoch_order` in :func:`id_dtype` of its ``N`` samples (int32 below 2^31): the
    same ids in half the bytes, for a rank's plan, which reads the order once (the
    largest array it makes but its table). A shuffle's draws do not depend on the type."""
    return _order(shard_sizes, epoch=epoch, seed=seed, shuffle=shuffle, compact=True)


def _order(shard_sizes: Sequence[int] | np.ndarray, *, epoch: int, seed: int,
           shuffle: Shuffle | str | bool, compact: bool) -> np.ndarray:
    """The epoch's order in int64, or in :func:`id_dtype` where ``compact``."""
    check_int("epoch", epoch, 0)
    check_int("seed", seed, 0)
    how = as_shuffle(shuffle)
    sizes = shard_sizes_array(shard_sizes)
    offsets = np.cumsum(sizes) - sizes
    dtype = id_dtype(int(sizes.sum())) if compact else np.int64
    if how.mode == "none":
        return np.arange(int(sizes.sum()), dtype=dtype)
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    order = rng.permutation(len(sizes))
    if how.mode == "block":
        return _block_shuffle(sizes, offsets, order, rng, how.block_size, how.window, dtype)
    return _sample_shuffle(_shard_ids(sizes, offsets, order, dtype), rng, how.shuffle_window)
