"""The epoch plan's guarantees, checked over grids of shard sizes, ranks, batches, resumes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataflow.errors import ConfigError
from dataflow.plan import (
    Batches,
    EpochSize,
    Range,
    consumed,
    epoch_order,
    epoch_size,
    rank_batches,
)
from dataflow.shuffle import Shuffle


def _size_vectors() -> list[list[int]]:
    rng = np.random.default_rng(1234)
    vectors = [
        [],
        [0],
        [0, 0, 0],
        [1],
        [5],
        [1000],
        [0, 7, 0, 3],
        [1, 1],
        [2, 0, 1],
        [10, 9, 8, 7, 6, 5, 4, 3, 2, 1],
        [1, 500, 2],
    ]
    for _ in range(6):
        n = int(rng.integers(1, 14))
        vectors.append(rng.integers(0, 120, size=n).tolist())
    return vectors


SIZES = _size_vectors()
RESUME_SIZES = [[], [0, 7, 0, 3], [5], [1, 500, 2], [0, 40, 0, 0, 13, 61, 2], [97, 0, 64]]
BATCHES = [1, 3, 8, 32]
MODES = ["sample", "block", "none"]


def _ids(batches: list[list[Range]], offsets: np.ndarray) -> np.ndarray:
    parts = [np.arange(offsets[r.shard] + r.start, offsets[r.shard] + r.stop)
             for batch in batches for r in batch]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _all_ranks(sizes: list[int], **kw) -> list[Batches]:
    """Every rank's batches: what each rank of a ``kw["world_size"]`` job computes alone."""
    return [rank_batches(sizes, rank=rank, **kw) for rank in range(kw["world_size"])]


def _offsets(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _check_batch(batch: list[Range], sizes: list[int]) -> None:
    """Ranges are valid, sorted by (shard, start), disjoint, and adjacent samples merged."""
    for r in batch:
        assert 0 <= r.shard < len(sizes)
        assert 0 <= r.start < r.stop <= sizes[r.shard]
    for a, b in zip(batch, batch[1:], strict=False):
        assert (a.shard, a.stop) < (b.shard, b.start)


@pytest.mark.parametrize("world_size", range(1, 10))
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", MODES)
def test_exactly_once_equal_counts(world_size: int, drop_last: bool, shuffle: str) -> None:
    for sizes in SIZES:
        offsets = _offsets(sizes)
        total = int(sum(sizes))
        for batch_size in BATCHES:
            for epoch in (0, 3):
                kw = dict(world_size=world_size, epoch=epoch, seed=7, batch_size=batch_size,
                          shuffle=Shuffle(shuffle, shuffle_window=50, block_size=5, window=3),
                          drop_last=drop_last)
                ranks = _all_ranks(sizes, **kw)
                size = epoch_size(total, world_size=world_size, batch_size=batch_size,
                                  drop_last=drop_last)
                assert len(ranks) == world_size
                ids = []
                for batches in ranks:
                    assert len(batches) == size.batches_per_rank
                    lengths = [sum(r.size for r in b) for b in batches]
                    assert sum(lengths) == size.samples_per_rank
                    assert all(n == batch_size for n in lengths[:-1])
                    if lengths:
                        assert lengths[-1] == size.last_batch_size
                    for batch in batches:
                        _check_batch(batch, sizes)
                    ids.append(_ids(list(batches), offsets))
                all_ids = np.concatenate(ids)
                counts = np.bincount(all_ids, minlength=total)
                if drop_last:
                    assert counts.max(initial=0) <= 1
                    assert size.dropped == total - len(all_ids)
                    assert size.dropped < world_size * batch_size
                    assert size.repeated == 0
                else:
                    assert (counts >= 1).all()
                    assert int((counts - 1).sum()) == size.repeated
                    assert size.repeated < world_size
                    assert size.dropped == 0


def _run(sizes: list[int], world_size: int, start: int, k: int | None, drop_last: bool,
         batch_size: int) -> tuple[np.ndarray, int, EpochSize]:
    """A job of ``world_size`` ranks from ``start`` yields ``k`` batches each (all if None).

    Returns the sample ids it read, the new start, and its epoch size.
    """
    kw = dict(world_size=world_size, epoch=2, seed=11, batch_size=batch_size,
              drop_last=drop_last, shuffle=Shuffle(shuffle_window=40))
    total = int(sum(sizes))
    size = epoch_size(total, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                      start=start)
    ranks = _all_ranks(sizes, start=start, **kw)
    assert [len(b) for b in ranks] == [size.batches_per_rank] * world_size
    k = size.batches_per_rank if k is None else k
    ids = _ids([b for batches in ranks for b in batches[:k]], _offsets(sizes))
    new_start = consumed(start, world_size=world_size, batch_size=batch_size,
                         batches_yielded=k, total=total, drop_last=drop_last)
    if k < size.batches_per_rank:
        order = epoch_order(sizes, epoch=2, seed=11, shuffle=Shuffle(shuffle_window=40))
        assert sorted(ids.tolist()) == sorted(order[start:new_start].tolist())
    return ids, new_start, size


def _check_union(ids: np.ndarray, total: int, last: EpochSize, drop_last: bool) -> None:
    counts = np.bincount(ids, minlength=total)
    if drop_last:
        assert counts.max(initial=0) <= 1
        assert total - int(counts.sum()) == last.dropped
    else:
        assert (counts >= 1).all()
        assert int((counts - 1).sum()) == last.repeated


@pytest.mark.parametrize("world_size", range(1, 10))
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_exactly_once(world_size: int, drop_last: bool) -> None:
    for sizes in RESUME_SIZES:
        total = int(sum(sizes))
        for batch_size in (1, 3, 8):
            full = epoch_size(total, world_size=world_size, batch_size=batch_size,
                              drop_last=drop_last).batches_per_rank
            for k in sorted({0, min(1, full), full // 2, max(full - 1, 0), full}):
                first, start, size = _run(sizes, world_size, 0, k, drop_last, batch_size)
                for new_world in range(1, 10):
                    second, end, new_size = _run(sizes, new_world, start, None, drop_last,
                                                 batch_size)
                    assert end == total
                    last = new_size if k < size.batches_per_rank else size
                    _check_union(np.concatenate([first, second]), total, last, drop_last)


@pytest.mark.parametrize("worlds", [(2, 3, 5), (4, 3, 1), (4, 6, 2), (5, 1, 9), (7, 7, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_repeated_resumes_compose(worlds: tuple[int, int, int], drop_last: bool) -> None:
    sizes, batch_size = [0, 40, 0, 0, 13, 61, 2, 300], 4
    total = int(sum(sizes))
    a, b, c = worlds
    for k1 in (0, 1, 3):
        for k2 in (0, 2, 5):
            first, start, size1 = _run(sizes, a, 0, k1, drop_last, batch_size)
            k2 = min(k2, epoch_size(total, world_size=b, batch_size=batch_size,
                                    drop_last=drop_last, start=start).batches_per_rank)
            second, start, size2 = _run(sizes, b, start, k2, drop_last, batch_size)
            third, end, size3 = _run(sizes, c, start, None, drop_last, batch_size)
            assert end == total
            _check_union(np.concatenate([first, second, third]), total, size3, drop_last)


def test_epoch_size_padding_and_drops() -> None:
    assert epoch_size(10, world_size=4, batch_size=2, drop_last=False) == EpochSize(3, 2, 1, 2, 0)
    assert epoch_size(10, world_size=4, batch_size=2, drop_last=True) == EpochSize(2, 1, 2, 0, 2)
    assert epoch_size(10, world_size=2, batch_size=3, drop_last=False, start=4) == EpochSize(
        3, 1, 3, 0, 0)
    assert epoch_size(10, world_size=3, batch_size=3, drop_last=True, start=10) == EpochSize(
        0, 0, 0, 0, 0)
    assert epoch_size(2, world_size=5, batch_size=4, drop_last=False) == EpochSize(1, 1, 1, 3, 0)


def test_consumption_is_a_prefix_of_the_global_order() -> None:
    sizes = [30, 0, 17, 44]
    order = epoch_order(sizes, epoch=1, seed=3)
    ranks = _all_ranks(sizes, world_size=3, epoch=1, seed=3, batch_size=4)
    for g in range(6):
        batch = ranks[g % 3][g // 3]
        assert _ids([batch], _offsets(sizes)).tolist() == sorted(order[4 * g : 4 * g + 4])
    start = consumed(0, world_size=3, batch_size=4, batches_yielded=2, total=91,
                     drop_last=False)
    assert start == 24
    assert consumed(start, world_size=2, batch_size=4, batches_yielded=9, total=91,
                    drop_last=False) == 91


def test_padding_repeats_the_start_of_the_epoch() -> None:
    ranks = _all_ranks([3], world_size=5, epoch=0, seed=0, batch_size=4, shuffle=False)
    assert [b[0][0].start for b in ranks] == [0, 1, 2, 0, 1]
    ranks = _all_ranks([9], world_size=2, epoch=0, seed=0, batch_size=4, shuffle=False,
                        start=4)
    assert [list(b) for b in ranks] == [[[Range(0, 4, 7)]], [[Range(0, 0, 1), Range(0, 7, 9)]]]


@pytest.mark.parametrize("world_size", range(1, 8))
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resume_on_the_same_world_size_reads_the_uninterrupted_batches(
        world_size: int, drop_last: bool) -> None:
    """Byte-identical to the uninterrupted job, the padded or dropped tail included."""
    for sizes in RESUME_SIZES:
        total = int(sum(sizes))
        for batch_size in (1, 3, 8):
            kw = dict(world_size=world_size, epoch=1, seed=4, batch_size=batch_size,
                      drop_last=drop_last, shuffle=Shuffle(shuffle_window=30))
            whole = _all_ranks(sizes, **kw)
            n = len(whole[0])
            for k in sorted({0, min(1, n), n // 2, max(n - 1, 0), n}):
                start = consumed(0, world_size=world_size, batch_size=batch_size,
                                 batches_yielded=k, total=total, drop_last=drop_last)
                resumed = _all_ranks(sizes, start=start, **kw)
                for rank in range(world_size):
                    assert list(resumed[rank]) == list(whole[rank][k:]), (sizes, k, rank)


def test_identity_order_without_shuffle() -> None:
    sizes = [4, 0, 9, 2]
    ranks = _all_ranks(sizes, world_size=2, epoch=5, seed=3, batch_size=3, shuffle=False)
    assert list(ranks[0]) == [[Range(0, 0, 3)], [Range(2, 2, 5)], [Range(2, 8, 9),
                                                                   Range(3, 0, 1)]]
    assert list(ranks[1]) == [[Range(0, 3, 4), Range(2, 0, 2)], [Range(2, 5, 8)],
                              [Range(0, 0, 1), Range(3, 1, 2)]]


@pytest.mark.parametrize("seed", [0, 1, 99])
@pytest.mark.parametrize("shuffle", ["sample", "block"])
def test_deterministic_and_epochs_differ(seed: int, shuffle: str) -> None:
    sizes = [300, 17, 250, 0, 90, 400]
    kw = dict(world_size=4, seed=seed, batch_size=16, shuffle=Shuffle(shuffle, block_size=8))
    a = _all_ranks(sizes, epoch=1, **kw)
    assert a == _all_ranks(sizes, epoch=1, **kw)
    assert a != _all_ranks(sizes, epoch=2, **kw)
    assert a != _all_ranks(sizes, epoch=1, **{**kw, "seed": seed + 1})


def test_order_does_not_depend_on_world_size() -> None:
    sizes = [300, 17, 250, 0, 90, 400]
    offsets = _offsets(sizes)
    by_world = []
    for world_size in (1, 2, 3, 8):
        ranks = _all_ranks(sizes, world_size=world_size, epoch=4, seed=2, batch_size=8,
                            drop_last=True)
        rounds = zip(*(list(r) for r in ranks), strict=False)
        by_world.append([_ids([b], offsets).tolist() for rnd in rounds for b in rnd])
    shortest = min(len(b) for b in by_world)
    assert all(b[:shortest] == by_world[0][:shortest] for b in by_world)


def test_batches_sequence() -> None:
    batches = rank_batches([40, 3, 25], world_size=2, rank=1, epoch=0, seed=5, batch_size=4)
    assert isinstance(batches, Batches)
    assert len(batches) == 9
    rest = batches[3:]
    assert isinstance(rest, Batches) and len(rest) == 6
    assert list(rest) == list(batches)[3:]
    assert rest[-1] == batches[8]
    assert batches[9:] == Batches(batches.table, batches.bounds[9:])
    assert len(batches[9:]) == 0
    with pytest.raises(IndexError):
        batches[9]
    with pytest.raises(ConfigError, match="contiguous"):
        batches[::2]


def test_few_ranges_for_large_shards() -> None:
    ranks = _all_ranks([10**5] * 3, world_size=2, epoch=0, seed=0, batch_size=256,
                        shuffle=False)
    lengths = [len(batch) for batches in ranks for batch in batches]
    assert len(lengths) == 1172
    assert sum(lengths) == len(lengths) + 2  # the batches that cross a shard boundary


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(world_size=0), "world_size"),
        (dict(rank=3), "rank"),
        (dict(rank=-1), "rank"),
        (dict(batch_size=0), "batch_size"),
        (dict(seed=-1), "seed"),
        (dict(epoch=-2), "epoch"),
        (dict(shuffle="blocks"), "shuffle"),
        (dict(start=-1), "start"),
        (dict(start=8), "start"),
        (dict(shard_sizes=[3, -1]), "shard_sizes[1]"),
    ],
)
def test_invalid_inputs_name_the_field(kwargs: dict, field: str) -> None:
    args = dict(shard_sizes=[3, 4], world_size=3, rank=0, epoch=0, seed=0, batch_size=2)
    args.update(kwargs)
    sizes = args.pop("shard_sizes")
    with pytest.raises(ConfigError, match=re.escape(f"`{field}`") + ".*Found"):
        rank_batches(sizes, **args)


def test_consumed_rejects_more_batches_than_the_job_has() -> None:
    with pytest.raises(ConfigError, match="`batches_yielded`.*Found: 4"):
        consumed(0, world_size=2, batch_size=4, batches_yielded=4, total=20, drop_last=True)
