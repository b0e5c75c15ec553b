"""The epoch plan's guarantees, checked over grids of shard sizes, ranks, batches, epochs."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataflow.errors import ConfigError
from dataflow.plan import Range, epoch_size, global_plan, plan, split_batches


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
BATCHES = [1, 3, 8, 32]


def _sample_ids(ranges: list[Range], offsets: np.ndarray) -> np.ndarray:
    if not ranges:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(offsets[r.shard] + r.start, offsets[r.shard] + r.stop)
                           for r in ranges])


def _check_ranges(ranges: list[Range], sizes: list[int]) -> None:
    for r in ranges:
        assert 0 <= r.shard < len(sizes)
        assert 0 <= r.start < r.stop <= sizes[r.shard]


@pytest.mark.parametrize("world_size", range(1, 10))
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_exactly_once_equal_counts(world_size: int, drop_last: bool, shuffle: bool) -> None:
    for sizes in SIZES:
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(sum(sizes))
        for batch_size in BATCHES:
            for epoch in (0, 3):
                kw = dict(world_size=world_size, epoch=epoch, seed=7, batch_size=batch_size,
                          shuffle=shuffle, drop_last=drop_last, block_size=5, window=3)
                ranks = global_plan(sizes, **kw)
                size = epoch_size(total, world_size=world_size, batch_size=batch_size,
                                  drop_last=drop_last)
                assert len(ranks) == world_size
                ids = []
                for rank, ranges in enumerate(ranks):
                    _check_ranges(ranges, sizes)
                    assert sum(r.size for r in ranges) == size.samples_per_rank
                    batches = split_batches(ranges, batch_size)
                    assert len(batches) == size.batches_per_rank
                    lengths = [sum(r.size for r in b) for b in batches]
                    assert all(n == batch_size for n in lengths[:-1])
                    if lengths:
                        assert lengths[-1] == size.last_batch_size
                    assert plan(sizes, rank=rank, **kw) == ranges
                    ids.append(_sample_ids(ranges, offsets))
                all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
                counts = np.bincount(all_ids, minlength=total) if total else np.zeros(0)
                if drop_last:
                    assert counts.max(initial=0) <= 1
                    assert size.dropped == total - len(all_ids)
                    assert size.dropped < world_size * batch_size
                    assert size.repeated == 0
                else:
                    assert (counts >= 1).all()
                    assert int((counts - 1).sum()) == size.repeated
                    assert size.repeated < world_size or total < world_size
                    assert size.dropped == 0


def test_identity_order_without_shuffle() -> None:
    sizes = [4, 0, 9, 2]
    ranks = global_plan(sizes, world_size=3, epoch=5, seed=3, batch_size=2, shuffle=False)
    ids = np.concatenate([_sample_ids(r, np.array([0, 4, 4, 13])) for r in ranks])
    assert ids.tolist() == list(range(15))
    assert ranks[0] == [Range(0, 0, 4), Range(2, 0, 1)]


def test_padding_repeats_from_the_start_of_the_order() -> None:
    ranks = global_plan([3], world_size=5, epoch=0, seed=0, batch_size=4, shuffle=False)
    assert [r[0].start for r in ranks] == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("seed", [0, 1, 99])
def test_deterministic_and_epochs_differ(seed: int) -> None:
    sizes = [300, 17, 250, 0, 90, 400]
    kw = dict(world_size=4, seed=seed, batch_size=16, block_size=8)
    a = global_plan(sizes, epoch=1, **kw)
    assert a == global_plan(sizes, epoch=1, **kw)
    assert a != global_plan(sizes, epoch=2, **kw)
    assert a != global_plan(sizes, epoch=1, **{**kw, "seed": seed + 1})


def test_shuffle_keeps_ranges_within_blocks_and_windows() -> None:
    sizes = [100] * 12
    ranks = global_plan(sizes, world_size=2, epoch=0, seed=5, batch_size=10, block_size=10,
                        window=4)
    ranges = [r for rank in ranks for r in rank]
    assert len(ranges) > 60
    assert all(r.start % 10 == 0 and r.stop % 10 == 0 for rank in ranks for r in rank[1:-1])
    shard_rng = np.random.Generator(np.random.PCG64([5, 0]))
    windows = [set(w.tolist()) for w in np.split(shard_rng.permutation(12), 3)]
    seen = [r.shard for r in ranges]
    window_of = [next(i for i, w in enumerate(windows) if s in w) for s in seen]
    assert window_of == sorted(window_of)
    assert len(set(seen[:30])) == 4


def test_few_ranges_for_large_shards() -> None:
    ranks = global_plan([10**6] * 3, world_size=2, epoch=0, seed=0, batch_size=256,
                        shuffle=False)
    assert [len(r) for r in ranks] == [2, 2]


def test_split_batches_cuts_at_sample_granularity() -> None:
    batches = split_batches([Range(0, 0, 5), Range(3, 10, 12), Range(1, 0, 4)], 4)
    assert batches == [
        [Range(0, 0, 4)],
        [Range(0, 4, 5), Range(3, 10, 12), Range(1, 0, 1)],
        [Range(1, 1, 4)],
    ]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(world_size=0), "world_size"),
        (dict(rank=3), "rank"),
        (dict(rank=-1), "rank"),
        (dict(batch_size=0), "batch_size"),
        (dict(seed=-1), "seed"),
        (dict(epoch=-2), "epoch"),
        (dict(block_size=0), "block_size"),
        (dict(window=0), "window"),
        (dict(shard_sizes=[3, -1]), "shard_sizes[1]"),
    ],
)
def test_invalid_inputs_name_the_field(kwargs: dict, field: str) -> None:
    args = dict(shard_sizes=[3, 4], world_size=3, rank=0, epoch=0, seed=0, batch_size=2)
    args.update(kwargs)
    sizes = args.pop("shard_sizes")
    with pytest.raises(ConfigError, match=re.escape(f"`{field}`") + ".*Found"):
        plan(sizes, **args)
