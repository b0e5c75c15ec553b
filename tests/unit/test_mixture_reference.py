"""The mixture plan against a plain reference plan written for these tests.

:func:`dataflow.mixture.mixture_batches` makes no array of a slot each: a full batch is
consecutive slots, so it takes each source's samples of a batch as a range of the source's
stream, gathers their ids a chunk at a time from each pass (int32), sorts the parts in
place and counts copies only where a part names a sample twice. The reference walks the
rank's slots one by one (:func:`dataflow.plan.rank_positions`, :meth:`Weights.taken`) and
builds every part with Python lists, so any value that differs fails here, over grids of
sources (tiny upsampled ones whose passes repeat within a batch, one-sample ones, empty
shards), weights, world sizes, every rank, resumes, both tails and the shuffle modes.
"""

from __future__ import annotations

import bisect
import tracemalloc
from collections import Counter

import numpy as np
import pytest

from dataflow.mixture import (
    MixtureBatches,
    Weights,
    _source_ids,
    mixture_batches,
    mixture_size,
    source_seed,
)
from dataflow.plan import CHUNK, batch_bounds, rank_positions
from dataflow.shuffle import Shuffle, epoch_order, id_dtype

SOURCES = [
    [[40, 0, 17], [9], [3, 3, 3]],
    [[200], [1], [0, 55, 2]],
    [[5, 0, 12, 3], [130, 0, 250]],
]
WEIGHTS = {3: [[0.7, 0.2, 0.1], [1, 1, 1], [5, 3, 1]], 2: [[1, 3], [0.9, 0.1]]}
SHUFFLES = [Shuffle(shuffle_window=16), Shuffle("block", block_size=4, window=2),
            Shuffle("none")]


def _ranges(ids: list[int], sizes: list[int]) -> list[tuple[int, int, int]]:
    """Sorted distinct ids as ``(shard, start, stop)`` ranges, adjacent samples merged."""
    ends = np.cumsum(sizes).tolist()
    rows: list[list[int]] = []
    for i in ids:
        shard = bisect.bisect_right(ends, i)
        at = i - (ends[shard] - sizes[shard])
        if rows and rows[-1][0] == shard and rows[-1][2] == at:
            rows[-1][2] += 1
        else:
            rows.append([shard, at, at + 1])
    return [tuple(r) for r in rows]


def _reference(sources: list[list[int]], weights: Weights, *, samples_per_epoch: int,
               world_size: int, rank: int, epoch: int, seed: int, batch_size: int,
               drop_last: bool, start: int, shuffle: Shuffle) -> dict:
    """The plan of the module's docstring, slot by slot."""
    size = mixture_size(samples_per_epoch, world_size=world_size, batch_size=batch_size,
                        drop_last=drop_last, start=start)
    positions = rank_positions(size, start=start, world_size=world_size, rank=rank,
                               batch_size=batch_size, total=samples_per_epoch)
    bounds = batch_bounds(len(positions), batch_size).tolist()
    orders: dict[tuple[int, int], list[int]] = {}
    counts = []
    parts: list[list] = [[] for _ in sources]
    index: list[list[int]] = [[] for _ in sources]
    copies: list[dict] = [{} for _ in sources]
    passes: list[list[tuple[int, int]]] = [[] for _ in sources]
    for j in range(len(bounds) - 1):
        read: list[list[tuple[int, int]]] = [[] for _ in sources]
        for p in positions[bounds[j] : bounds[j + 1]].tolist():
            slot = epoch * samples_per_epoch + p
            k = int(weights.pattern[slot % weights.period])
            q, at = divmod(weights.taken(slot)[k], sum(sources[k]))
            if (k, q) not in orders:
                orders[k, q] = epoch_order(sources[k], epoch=q, seed=source_seed(seed, k),
                                           shuffle=shuffle).tolist()
            read[k].append((orders[k, q][at], q))
        counts.append([len(r) for r in read])
        for k, r in enumerate(read):
            if not r:
                continue
            named = Counter(i for i, _ in r)
            ids = sorted(named)
            if max(named.values()) > 1:
                copies[k][len(parts[k])] = [named[i] for i in ids]
            parts[k].append(_ranges(ids, sources[k]))
            index[k].append(j)
            passes[k].append((min(q for _, q in r), max(q for _, q in r)))
    runs = []
    for k in range(len(sources)):
        key = [a if a == b else -1 - i for i, (a, b) in enumerate(passes[k])]
        runs.append([next((j for j in range(i + 1, len(key)) if key[j] != key[i]), len(key))
                     for i in range(len(key))])
    return dict(counts=counts, parts=parts, index=index, copies=copies, runs=runs)


def _as_lists(plan: MixtureBatches) -> dict:
    return dict(
        counts=plan.counts.tolist(),
        parts=[[list(map(tuple, b)) for b in p] for p in plan.parts],
        index=[i.tolist() for i in plan.index],
        copies=[{i: c.tolist() for i, c in d.items()} for d in plan.copies],
        runs=[r.tolist() for r in plan.runs])


@pytest.mark.parametrize("shuffle", SHUFFLES, ids=lambda s: s.mode)
@pytest.mark.parametrize("s", range(len(SOURCES)))
def test_mixture_batches_is_the_reference_plan(s: int, shuffle: Shuffle) -> None:
    sources = SOURCES[s]
    for raw in WEIGHTS[len(sources)]:
        weights = Weights.of(raw)
        for batch_size, per_epoch in ((1, 13), (4, 61), (7, 150)):
            for world_size in (1, 3):
                for drop_last in (False, True):
                    for start in sorted({0, per_epoch // 2 + 1}):
                        for epoch in (0, 2):
                            for rank in range(world_size):
                                kw = dict(samples_per_epoch=per_epoch, world_size=world_size,
                                          rank=rank, epoch=epoch, seed=7,
                                          batch_size=batch_size, drop_last=drop_last,
                                          start=start, shuffle=shuffle)
                                want = _reference(sources, weights, **kw)
                                plan = mixture_batches(sources, weights, **kw)
                                got = _as_lists(plan)
                                for name in got:
                                    assert got[name] == want[name], (name, raw, kw)
                                assert plan.stride == world_size


def _stream(sizes: list[int], positions: list[int], seed: int, how: Shuffle) -> list[int]:
    total = sum(sizes)
    return [int(epoch_order(sizes, epoch=p // total, seed=seed, shuffle=how)[p % total])
            for p in positions]


@pytest.mark.parametrize("chunk", [1, 3, CHUNK])
@pytest.mark.parametrize("how", SHUFFLES, ids=lambda s: s.mode)
def test_source_ids_are_the_stream_s_ids_at_the_positions(chunk: int, how: Shuffle) -> None:
    """Ranges within one pass, across several, one-sample and empty ranges, gaps of whole
    passes between them, and positions after them in earlier, the same and later passes."""
    rng = np.random.default_rng(4)
    for sizes in ([7], [3, 0, 4], [1], [40, 25]):
        total = sum(sizes)
        for trial in range(12):
            lengths = rng.integers(0, 2 * total + 2, size=int(rng.integers(0, 6)))
            gaps = rng.integers(0, 3 * total, size=len(lengths))
            lo = np.cumsum(gaps + np.concatenate([[0], lengths[:-1]])).astype(np.int64)
            lo += int(rng.integers(0, 5 * total))
            hi = lo + lengths
            tail = rng.integers(0, 12 * total, size=int(rng.integers(0, 5))).astype(np.int64)
            got = _source_ids(np.asarray(sizes, dtype=np.int64), lo, hi, tail, seed=trial,
                              shuffle=how, chunk=chunk)
            positions = [p for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
                         for p in range(a, b)] + tail.tolist()
            assert got.dtype == id_dtype(total)
            assert got.tolist() == _stream(sizes, positions, trial, how), (sizes, trial)


@pytest.mark.parametrize("world_size", [1, 8])
@pytest.mark.parametrize("shuffle", ["sample", "none"])
def test_a_rank_s_mixture_plan_holds_little_beside_its_result(world_size: int,
                                                              shuffle: str) -> None:
    """Beside its result, planning holds at most 5 bytes a sample of the rank's largest
    share of one source (its ids in int32 and a mark each), 8 bytes a sample of the largest
    source (one pass's order in int32 and its making) and a chunk's temporaries: numpy
    reports its allocations to tracemalloc. It was about 75 bytes a slot of the rank, most
    of them in arrays of a slot each."""
    sources = [[1 << 11] * 700, [1 << 10] * 400, [100] * 200]  # 1.43M, 410k, 20k samples
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already tracing: its peak is not this test's")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        plan = mixture_batches(sources, Weights.of([0.7, 0.2, 0.1]),
                               samples_per_epoch=2_000_000, world_size=world_size,
                               rank=world_size - 1, epoch=1, seed=2, batch_size=256,
                               shuffle=shuffle)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    result = plan.counts.nbytes + sum(
        p.table.nbytes + p.bounds.nbytes + i.nbytes + r.nbytes
        for p, i, r in zip(plan.parts, plan.index, plan.runs, strict=True)) + sum(
        c.nbytes for d in plan.copies for c in d.values())
    share = int(plan.counts.sum(axis=0).max())
    assert peak - result <= 5 * share + 8 * max(map(sum, sources)) + 128 * CHUNK, (peak,
                                                                                     result)
