"""The epoch plan's steps against simple reference formulations written for these tests.

The plan's functions avoid full-length temporaries (in-place shuffles, a strided gather, an
in-place sort, ranges converted a chunk of batches at a time, int32 ids below 2^31 samples);
these references do each step the plain way (copies, Python loops) so any value that differs
fails here, over grids of shapes: ids with runs, shard boundaries and empty shards, short last
batches, one-sample batches, uneven batches, no batch at all, and groups of batches cut small.
"""

from __future__ import annotations

import bisect
import tracemalloc

import numpy as np
import pytest

from dataflow.errors import InternalError
from dataflow.plan import (
    CHUNK,
    SORT_ONE_BY_ONE,
    _take,
    batch_bounds,
    epoch_size,
    ranges_of,
    rank_batches,
    rank_positions,
    sort_within,
)
from dataflow.shuffle import Shuffle, compact_epoch_order, epoch_order, id_dtype

SIZES = [[], [0], [0, 0], [1], [5], [1, 1], [0, 7, 0, 3], [2, 0, 1], [10, 9, 8, 7, 6, 5, 4],
         [1, 300, 2], [64, 64, 64], [0, 130, 0, 0, 17, 61, 2]]
SHUFFLES = [Shuffle("none"), Shuffle("sample"), Shuffle("sample", shuffle_window=1),
            Shuffle("sample", shuffle_window=7), Shuffle("sample", shuffle_window=64),
            Shuffle("block", block_size=1, window=1), Shuffle("block", block_size=4, window=2),
            Shuffle("block", block_size=64, window=8)]


def _reference_order(sizes: list[int], *, epoch: int, seed: int, how: Shuffle) -> np.ndarray:
    """The epoch's order as dataflow.shuffle documents it, drawn on copies of the ids."""
    offsets = np.cumsum(sizes, dtype=np.int64) - np.asarray(sizes, dtype=np.int64)
    total = int(sum(sizes))
    if how.mode == "none":
        return np.arange(total, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    shards = rng.permutation(len(sizes)).tolist()
    if how.mode == "block":
        blocks = [(offsets[s] + a, min(how.block_size, sizes[s] - a), j // how.window)
                  for j, s in enumerate(shards) for a in range(0, sizes[s], how.block_size)]
        keys = rng.random(len(blocks))
        perm = np.lexsort((keys, [group for _, _, group in blocks])).tolist()
        runs = [np.arange(blocks[k][0], blocks[k][0] + blocks[k][1]) for k in perm]
        return np.concatenate(runs).astype(np.int64) if runs else np.zeros(0, np.int64)
    ids = np.array([offsets[s] + i for s in shards for i in range(sizes[s])], dtype=np.int64)
    n, w = total, how.shuffle_window
    head = int(rng.integers(1, w + 1)) if n > w else n
    full = (n - head) // w
    return np.concatenate([rng.permutation(ids[:head].copy()),
                           rng.permuted(ids[head : head + full * w].reshape(full, w).copy(),
                                        axis=1).reshape(-1),
                           rng.permutation(ids[head + full * w :].copy())])


def _reference_positions(total: int, *, start: int, world_size: int, rank: int,
                         batch_size: int, drop_last: bool) -> list[list[int]]:
    """Rank ``rank``'s batches of positions in the order, by the rules of dataflow.plan."""
    rest, per_round = total - start, world_size * batch_size
    batches = rest // per_round if drop_last else -(-rest // per_round)
    out = []
    for j in range(batches):
        first = start + j * per_round
        if drop_last or j < batches - 1:
            out.append([first + rank * batch_size + b for b in range(batch_size)])
        else:
            last = -(-(rest - j * per_round) // world_size)
            out.append([(first + rank * last + b) % total for b in range(last)])
    return out


def _reference_ranges(batches: list[list[int]], sizes: list[int]) -> list[list[tuple]]:
    """Each batch's ids, sorted, as (shard, start, stop) ranges of consecutive samples."""
    ends = np.cumsum(sizes).tolist()
    out = []
    for batch in batches:
        rows: list[list[int]] = []
        for x in sorted(batch):
            shard = bisect.bisect_right(ends, x)
            local = x - (ends[shard - 1] if shard else 0)
            if rows and rows[-1][0] == shard and rows[-1][2] == local:
                rows[-1][2] += 1
            else:
                rows.append([shard, local, local + 1])
        out.append([tuple(r) for r in rows])
    return out


@pytest.mark.parametrize("how", SHUFFLES, ids=repr)
def test_the_epoch_order_is_the_reference_order_in_either_type(how: Shuffle) -> None:
    for sizes in SIZES:
        for epoch, seed in ((0, 0), (3, 11)):
            want = _reference_order(sizes, epoch=epoch, seed=seed, how=how)
            wide = epoch_order(sizes, epoch=epoch, seed=seed, shuffle=how)
            narrow = compact_epoch_order(sizes, epoch=epoch, seed=seed, shuffle=how)
            assert wide.dtype == np.int64 and narrow.dtype == np.int32
            assert wide.tolist() == want.tolist() == narrow.tolist(), (sizes, epoch, seed)


def test_ids_are_int32_below_2_31_samples() -> None:
    assert id_dtype(0) is np.int32 and id_dtype((1 << 31) - 1) is np.int32
    assert id_dtype(1 << 31) is np.int64


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_positions_and_the_gather_are_the_reference_layout(drop_last: bool) -> None:
    for total in (0, 1, 5, 17, 64, 100):
        for world_size in (1, 2, 3, 8):
            for batch_size in (1, 3, 8):
                order = np.random.default_rng(total).permutation(total)
                for start in sorted({0, total // 3, total}):
                    size = epoch_size(total, world_size=world_size, batch_size=batch_size,
                                      drop_last=drop_last, start=start)
                    for rank in range(world_size):
                        kw = dict(start=start, world_size=world_size, rank=rank,
                                  batch_size=batch_size)
                        want = [p for b in _reference_positions(total, drop_last=drop_last, **kw)
                                for p in b]
                        got = rank_positions(size, total=total, **kw)
                        assert got.dtype == np.int64 and got.tolist() == want
                        for dtype in (np.int32, np.int64):
                            taken = _take(order.astype(dtype), size, total=total, dtype=dtype,
                                          **kw)
                            assert taken.dtype == dtype
                            assert taken.tolist() == order[want].tolist()


@pytest.mark.parametrize("chunk", [1, 5, CHUNK])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sort_within_sorts_each_batch_in_place(dtype: type, chunk: int) -> None:
    """Even batches, uneven ones averaging SORT_ONE_BY_ONE samples or more (sorted one by
    one), and many small uneven ones with empty ones among them (a group at a time)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 256, 1000):
        ids = rng.permutation(n).astype(dtype)
        uneven = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, size=5)]))
        small = np.sort(np.concatenate([[0, n], rng.integers(0, n + 1, size=n // 3 + 2)]))
        assert n < SORT_ONE_BY_ONE * (len(small) - 1)
        for bounds in (batch_bounds(n, 1), batch_bounds(n, 3), batch_bounds(n, 256), uneven,
                       small):
            got = ids.copy()
            assert sort_within(got, bounds, chunk=chunk) is None
            want = [sorted(ids[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:],
                                                              strict=True)]
            assert got.tolist() == [x for batch in want for x in batch]
    with pytest.raises(InternalError, match="`ids`.*C-contiguous.*Found"):
        sort_within(np.arange(8)[::2], batch_bounds(4, 2))


def _sorted_batches(ids: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    out = ids.copy()
    sort_within(out, bounds)
    return out


def _cases() -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """(shard sizes, ids, bounds) with runs across and within shards, one-sample batches,
    short last batches, uneven batches (a mixture's), and subsets of the samples."""
    rng = np.random.default_rng(8)
    cases = []
    for sizes in SIZES + [[40] * 30, [1000, 0, 3000]]:
        total = int(sum(sizes))
        for how in (Shuffle("none"), Shuffle("sample"), Shuffle("block", block_size=4)):
            order = epoch_order(sizes, epoch=1, seed=2, shuffle=how)
            subset = order[np.sort(rng.choice(total, size=total // 2, replace=False))]
            for ids in (order, subset):
                for batch_size in (1, 3, 256):
                    bounds = batch_bounds(len(ids), batch_size)
                    cases.append((sizes, _sorted_batches(ids, bounds), bounds))
                cuts = rng.integers(1, len(ids), size=min(len(ids), 4)) if len(ids) > 1 else []
                uneven = np.unique(np.concatenate([[0, len(ids)], cuts])).astype(np.int64)
                cases.append((sizes, _sorted_batches(ids, uneven), uneven))
    return cases


CASES = _cases()


@pytest.mark.parametrize("chunk", [1, 2, 5, 300, CHUNK])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_ranges_of_is_the_reference_over_a_grid(chunk: int, dtype: type) -> None:
    for sizes, ids, bounds in CASES:
        got = ranges_of(ids.astype(dtype), bounds, np.cumsum(sizes, dtype=np.int64),
                        chunk=chunk)
        batches = [ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        assert [list(map(tuple, b)) for b in got] == _reference_ranges(batches, sizes)
        assert got.table.dtype == np.int64 and got.table.flags.c_contiguous
        assert got.bounds.dtype == np.int64 and got.table.shape == (got.bounds[-1], 3)


def test_ranges_of_wants_bounds_over_all_its_ids() -> None:
    with pytest.raises(InternalError, match="`bounds`.*Found: 1 to 4"):
        ranges_of(np.arange(4), np.array([1, 4]), np.array([4]))
    with pytest.raises(InternalError, match="`bounds`.*Found: 0 to 3"):
        ranges_of(np.arange(4), np.array([0, 3]), np.array([4]))


@pytest.mark.parametrize("how", [SHUFFLES[0], SHUFFLES[1], SHUFFLES[3], SHUFFLES[6]], ids=repr)
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_batches_is_the_reference_plan(how: Shuffle, drop_last: bool) -> None:
    for sizes in SIZES:
        total = int(sum(sizes))
        order = _reference_order(sizes, epoch=2, seed=5, how=how)
        for world_size in (1, 3):
            for batch_size in (1, 4):
                for start in sorted({0, total // 2}):
                    for rank in range(world_size):
                        kw = dict(start=start, world_size=world_size, rank=rank,
                                  batch_size=batch_size)
                        positions = _reference_positions(total, drop_last=drop_last, **kw)
                        want = _reference_ranges([order[b].tolist() for b in positions], sizes)
                        got = rank_batches(sizes, epoch=2, seed=5, drop_last=drop_last,
                                           shuffle=how, **kw)
                        assert [list(map(tuple, b)) for b in got] == want, (sizes, kw)


@pytest.mark.parametrize("world_size", [1, 8])
@pytest.mark.parametrize("shuffle", ["sample", "none"])
def test_a_rank_s_plan_holds_little_beside_its_table(world_size: int, shuffle: str) -> None:
    """Beside its result, planning holds at most 5 bytes a sample of the epoch (its order
    in int32, or the rank's ids and a mark a sample) and the temporaries of a chunk of
    batches (about 100 bytes a sample of it): numpy reports its allocations to tracemalloc.
    It was 12-81 bytes a sample of the epoch, growing with it."""
    sizes = [1 << 11] * (1 << 10)  # 2M samples
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already tracing: its peak is not this test's")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        plan = rank_batches(sizes, world_size=world_size, rank=world_size - 1, epoch=1, seed=2,
                            batch_size=256, shuffle=shuffle)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    result = plan.table.nbytes + plan.bounds.nbytes
    assert peak - result <= 5 * sum(sizes) + 128 * CHUNK, (peak, result)

