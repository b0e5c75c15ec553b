"""The mixture plan's guarantees, over grids of weights, source sizes, world sizes and resume
points: exactly once per pass over each source, exact proportions per window, equal batches
per rank, resume on any world size."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from dataflow.errors import ConfigError
from dataflow.mixture import (
    MAX_PERIOD,
    MixtureBatches,
    Weights,
    last_epoch,
    mixture_batches,
    mixture_size,
    source_seed,
)
from dataflow.plan import consumed
from dataflow.shuffle import Shuffle, epoch_order

WEIGHTS = [[1], [1, 1], [0.7, 0.2, 0.1], [3, 1], [5, 3, 1, 1], [0.5, 0.25, 0.125, 0.125],
           [1, 2, 3, 4, 5, 6, 7]]
SOURCES = [
    [[40, 0, 17], [9], [3, 3, 3]],  # a tiny source, upsampled: whole passes repeat
    [[200], [1], [0, 55, 2]],  # a one-sample source: a batch names it several times
]
SHUFFLE = Shuffle(shuffle_window=16, block_size=4, window=2)


def _ids_of(part_rows: np.ndarray, copies: np.ndarray | None,
            offsets: np.ndarray) -> np.ndarray:
    ids = np.concatenate([np.arange(offsets[s] + a, offsets[s] + b)
                          for s, a, b in part_rows.tolist()])
    return ids if copies is None else np.repeat(ids, copies)


def _served(plans: list[MixtureBatches], sources: list[list[int]]) -> list[list[int]]:
    """Every sample id each source served over ``plans`` (copies counted)."""
    out: list[list[int]] = [[] for _ in sources]
    offsets = [np.concatenate([[0], np.cumsum(s)]) for s in sources]
    for plan in plans:
        for j in range(len(plan)):
            for part in plan.batch(j):
                out[part.source] += _ids_of(part.rows, part.copies,
                                            offsets[part.source]).tolist()
    return out


def _expected(sources: list[list[int]], weights: Weights, slots: np.ndarray, seed: int,
              shuffle: Shuffle) -> list[list[int]]:
    """The ids that reading ``slots`` serves: each source's stream of passes at the slots'
    positions."""
    src, pos = weights.source_of(slots), weights.position(slots)
    out = []
    for k, sizes in enumerate(sources):
        total = sum(sizes)
        mine = pos[src == k]
        ids = [int(epoch_order(sizes, epoch=int(p // total), seed=source_seed(seed, k),
                               shuffle=shuffle)[p % total]) for p in mine.tolist()]
        out.append(ids)
    return out


def _job(sources, weights, *, world, epoch, start=0, **kw) -> list[MixtureBatches]:
    return [mixture_batches(sources, weights, world_size=world, rank=r, epoch=epoch,
                            start=start, **kw) for r in range(world)]


# -- weights ---------------------------------------------------------------------------------


def test_weights_are_exact_fractions_in_lowest_terms() -> None:
    assert Weights.of([0.7, 0.2, 0.1]).counts == (7, 2, 1)
    assert Weights.of([70, 20, 10]).counts == (7, 2, 1)
    assert Weights.of([Fraction(1, 3), Fraction(2, 3)]).counts == (1, 2)
    assert Weights.of([1 / 3, 2 / 3]).counts == (1, 2)
    assert Weights.of([np.float32(0.5), np.int64(2)]).counts == (1, 4)
    assert Weights.of([0.7, 0.2, 0.1]).shares == (Fraction(7, 10), Fraction(1, 5),
                                                  Fraction(1, 10))
    assert Weights.of([5]).period == 1


@pytest.mark.parametrize("weights, field", [
    ([], "weights"), ("ab", "weights"), ([1, 0], r"weights\[1\]"), ([-1, 2], r"weights\[0\]"),
    ([1, float("nan")], r"weights\[1\]"), ([True, 1], r"weights\[0\]"),
    ([1, "2"], r"weights\[1\]"), ([1, MAX_PERIOD], "weights"),
])
def test_invalid_weights_name_the_field(weights, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Weights.of(weights)


def _random_weights(n: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(1, 60, size=int(rng.integers(2, 7))).tolist() for _ in range(n)]


@pytest.mark.parametrize("raw", WEIGHTS + _random_weights(12))
def test_every_prefix_within_quota_and_every_period_window_exact(raw) -> None:
    w = Weights.of(raw)
    period, counts = w.period, np.asarray(w.counts)
    slots = np.arange(3 * period + 5)
    src = w.source_of(slots)
    onehot = src[:, None] == np.arange(len(counts))[None, :]
    taken = np.vstack([np.zeros(len(counts), dtype=np.int64), np.cumsum(onehot, axis=0)])
    n = np.arange(len(slots) + 1)[:, None]
    assert (taken >= (n * counts) // period).all() and (taken <= -(-(n * counts) // period)).all()
    assert all(tuple(taken[t]) == w.taken(t) for t in range(0, len(slots) + 1, 7))
    for width in (period, 2 * period):
        windows = taken[width:] - taken[:-width]
        assert (windows == width * counts // period).all()
    for width in (1, 3, max(1, period // 2)):
        windows = taken[width:] - taken[:-width]
        assert (np.abs(windows - width * counts / period) < 2).all()
    # positions number each source's slots 0, 1, 2, ... in slot order
    pos = w.position(slots)
    for k in range(len(counts)):
        assert pos[src == k].tolist() == list(range(int(taken[-1, k])))


def test_a_large_period_is_planned() -> None:
    w = Weights.of([12345, 50000, 3191])
    assert w.period == MAX_PERIOD
    assert w.taken(MAX_PERIOD) == (12345, 50000, 3191)


# -- plans -----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("raw", WEIGHTS[1:5])
def test_exactly_once_per_pass_of_each_source_equal_counts(world: int, drop_last: bool,
                                                           raw) -> None:
    weights = Weights.of(raw + [1] * (3 - len(raw)) if len(raw) < 3 else raw[:3])
    for sources in SOURCES:
        for batch_size, per_epoch in ((1, 11), (4, 50), (7, 23)):
            kw = dict(samples_per_epoch=per_epoch, seed=5, batch_size=batch_size,
                      drop_last=drop_last, shuffle=SHUFFLE)
            plans, slots = [], []
            for epoch in range(3):
                job = _job(sources, weights, world=world, epoch=epoch, **kw)
                size = mixture_size(per_epoch, world_size=world, batch_size=batch_size,
                                    drop_last=drop_last)
                for plan in job:
                    assert len(plan) == size.batches_per_rank
                    lengths = plan.counts.sum(axis=1).tolist()
                    assert all(n == batch_size for n in lengths[:-1])
                    assert not lengths or lengths[-1] == size.last_batch_size
                    for j in range(len(plan)):
                        parts = plan.batch(j)
                        assert [p.source for p in parts] == sorted({p.source for p in parts})
                        assert [p.samples for p in parts] == [
                            int(plan.counts[j, p.source]) for p in parts]
                        for p in parts:  # sorted, disjoint: what a server accepts
                            keys = [(s, a) for s, a, _ in p.rows.tolist()]
                            assert keys == sorted(keys)
                            assert all(a < b for _, a, b in p.rows.tolist())
                            for (s1, _, b1), (s2, a2, _) in zip(p.rows.tolist(),
                                                                p.rows[1:].tolist(),
                                                                strict=False):
                                assert s1 < s2 or b1 < a2
                plans += job
                read = np.arange(epoch * per_epoch, (epoch + 1) * per_epoch)
                if drop_last:
                    read = read[: per_epoch - size.dropped]
                else:
                    read = np.concatenate([read, epoch * per_epoch
                                           + np.arange(size.repeated)])
                slots.append(read)
            got = _served(plans, sources)
            want = _expected(sources, weights, np.concatenate(slots), 5, SHUFFLE)
            for k in range(len(sources)):
                assert sorted(got[k]) == sorted(want[k]), (sources, k, batch_size, world)


@pytest.mark.parametrize("raw", [[7, 2, 1], [3, 1], [1, 1, 1]])
@pytest.mark.parametrize("batch_size", [4, 10, 32])
def test_proportions_exact_over_every_window_of_batches(raw, batch_size: int) -> None:
    weights = Weights.of(raw)
    period, counts = weights.period, np.asarray(weights.counts)
    every = period // math.gcd(period, batch_size)  # batches per exact window
    sources = [[500, 300], [120], [77, 0, 9]][: len(raw)]
    for world in (1, 3):
        for epoch in (0, 1):
            job = _job(sources, weights, world=world, epoch=epoch, samples_per_epoch=997,
                       seed=2, batch_size=batch_size, drop_last=True)
            by_global = sorted((plan.global_index(j), plan.counts[j].tolist())
                               for plan in job for j in range(len(plan)))
            assert [g for g, _ in by_global] == list(range(len(by_global)))
            table = np.asarray([c for _, c in by_global])
            for a in range(len(table) - every + 1):
                window = table[a : a + every].sum(axis=0)
                assert (window * period == every * batch_size * counts).all()
            assert (np.abs(table - batch_size * counts / period) < 2).all()
            if every == 1:
                assert (table * period == batch_size * counts).all()


def _run(sources, weights, world: int, epoch: int, start: int, k: int | None, **kw):
    """``world`` ranks read ``k`` batches each (all if None) from ``start``; returns what they
    served and the new start."""
    job = _job(sources, weights, world=world, epoch=epoch, start=start, **kw)
    n = len(job[0])
    k = n if k is None else k
    head = [_cut(plan, k) for plan in job]
    new = consumed(start, world_size=world, batch_size=kw["batch_size"], batches_yielded=k,
                   total=kw["samples_per_epoch"], drop_last=kw["drop_last"])
    return head, new


def _cut(plan: MixtureBatches, k: int) -> list[list[tuple[int, list, list | None]]]:
    return [[(p.source, p.rows.tolist(), None if p.copies is None else p.copies.tolist())
             for p in plan.batch(j)] for j in range(min(k, len(plan)))]


def _multiset(batches) -> Counter:
    out: Counter = Counter()
    for batch in batches:
        for source, rows, copies in batch:
            ids = [(shard, i) for shard, a, b in rows for i in range(a, b)]
            for n, sample in enumerate(ids):
                out[(source, sample)] += 1 if copies is None else copies[n]
    return out


@pytest.mark.parametrize("worlds", [(2, 3, 1), (4, 1, 5), (3, 3, 3), (1, 6, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_chains_read_what_the_uninterrupted_run_reads(worlds, drop_last) -> None:
    sources = SOURCES[0]
    weights = Weights.of([0.7, 0.2, 0.1])
    kw = dict(samples_per_epoch=61, seed=9, batch_size=3, drop_last=drop_last, shuffle=SHUFFLE)
    for epoch in (0, 2):
        head1, start = _run(sources, weights, worlds[0], epoch, 0, 2, **kw)
        head2, start = _run(sources, weights, worlds[1], epoch, start, 1, **kw)
        tail, end = _run(sources, weights, worlds[2], epoch, start, None, **kw)
        assert end == 61
        chained = _multiset([b for rank in head1 + head2 + tail for b in rank])
        last = mixture_size(61, world_size=worlds[2], batch_size=3, drop_last=drop_last,
                            start=start)
        slots = np.arange(epoch * 61, epoch * 61 + 61)
        slots = (slots[: 61 - last.dropped] if drop_last else
                 np.concatenate([slots, epoch * 61 + np.arange(last.repeated)]))
        want: Counter = Counter()
        for k, ids in enumerate(_expected(sources, weights, slots, 9, SHUFFLE)):
            offsets = np.concatenate([[0], np.cumsum(sources[k])])
            for i in ids:
                shard = int(np.searchsorted(offsets, i, side="right") - 1)
                want[(k, (shard, i - int(offsets[shard])))] += 1
        assert chained == want


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_resume_on_the_same_world_size_reads_the_uninterrupted_batches(world: int) -> None:
    sources, weights = SOURCES[1], Weights.of([5, 3, 1])
    for drop_last in (False, True):
        kw = dict(samples_per_epoch=83, seed=1, batch_size=4, drop_last=drop_last,
                  shuffle="sample")
        whole = _job(sources, weights, world=world, epoch=1, **kw)
        n = len(whole[0])
        for k in sorted({0, 1, n // 2, n - 1, n}):
            start = consumed(0, world_size=world, batch_size=4, batches_yielded=k, total=83,
                             drop_last=drop_last)
            resumed = _job(sources, weights, world=world, epoch=1, start=start, **kw)
            for rank in range(world):
                assert _cut(resumed[rank], n) == _cut(whole[rank], n)[k:]
                assert [resumed[rank].global_index(j) for j in range(len(resumed[rank]))] == [
                    whole[rank].global_index(j) for j in range(k, n)]


def test_small_sources_repeat_whole_passes_and_big_ones_are_subsampled() -> None:
    """A source of 6 samples at half the slots of 120-slot epochs reads 10 whole passes per
    epoch; one of 1,000 at the other half reads the next 60 of its pass each epoch."""
    sources = [[6], [600, 400]]
    weights = Weights.of([1, 1])
    plans = [mixture_batches(sources, weights, samples_per_epoch=120, world_size=1, rank=0,
                             epoch=e, seed=3, batch_size=8) for e in range(3)]
    small, big = _served(plans, sources)
    assert Counter(small) == {i: 30 for i in range(6)}
    assert len(big) == len(set(big)) == 180  # the first 180 of pass 0:
    order = epoch_order([600, 400], epoch=0, seed=source_seed(3, 1))
    assert sorted(big) == sorted(order[:180].tolist())


def test_a_part_names_each_sample_once_and_counts_its_copies() -> None:
    plan = mixture_batches([[1], [50]], Weights.of([1, 1]), samples_per_epoch=40,
                           world_size=1, rank=0, epoch=0, seed=0, batch_size=8)
    first = plan.batch(0)
    assert first[0].rows.tolist() == [[0, 0, 1]]
    assert first[0].copies is not None and first[0].copies.tolist() == [4]
    assert first[0].samples == 4 and plan.counts[0].tolist() == [4, 4]
    assert first[1].copies is None and first[1].samples == 4


def test_deterministic_and_sources_shuffled_apart() -> None:
    kw = dict(samples_per_epoch=64, world_size=2, rank=1, epoch=3, seed=8, batch_size=8)
    a = mixture_batches([[100], [100]], Weights.of([1, 1]), **kw)
    b = mixture_batches([[100], [100]], Weights.of([1, 1]), **kw)
    assert _cut(a, 99) == _cut(b, 99)
    assert a.parts[0] != a.parts[1]  # equal sizes, own seeds: other orders
    assert source_seed(8, 0) != source_seed(8, 1) != source_seed(9, 1)
    assert 0 <= source_seed(2**63 - 1, 5) < 2**63


@pytest.mark.parametrize("kwargs, field", [
    (dict(samples_per_epoch=0), "samples_per_epoch"), (dict(rank=2), "rank"),
    (dict(world_size=0), "world_size"), (dict(epoch=-1), "epoch"), (dict(batch_size=0),
                                                                     "batch_size"),
    (dict(start=11), "start"), (dict(seed=-1), "seed"),
    (dict(epoch=2**62), r"`epoch` must be an integer in \[0, 922337203685477579\]"),
])
def test_invalid_inputs_name_the_field(kwargs: dict, field: str) -> None:
    kw = dict(samples_per_epoch=10, world_size=2, rank=0, epoch=0, seed=0, batch_size=2)
    kw.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        mixture_batches([[5], [5]], Weights.of([1, 1]), **kw)


def test_the_last_epoch_is_planned() -> None:
    """Slot numbers are int64: the last epoch whose slots they hold is planned, exactly."""
    kw = dict(samples_per_epoch=10, world_size=2, rank=1, seed=0, batch_size=2)
    last = last_epoch(10)
    assert (last + 1) * 10 - 1 <= 2**63 - 1 < (last + 2) * 10 - 1
    assert len(mixture_batches([[5], [5]], Weights.of([1, 1]), epoch=last, **kw)) == 3


def test_a_source_without_samples_or_weight_is_refused() -> None:
    kw = dict(samples_per_epoch=10, world_size=1, rank=0, epoch=0, seed=0, batch_size=2)
    with pytest.raises(ConfigError, match=r"sources\[1\]"):
        mixture_batches([[5], [0, 0]], Weights.of([1, 1]), **kw)
    with pytest.raises(ConfigError, match="one entry per weight"):
        mixture_batches([[5]], Weights.of([1, 1]), **kw)


@pytest.mark.parametrize("sources", SOURCES + [[[3], [2, 2]]])
def test_parts_one_request_may_carry_name_each_sample_once(sources) -> None:
    """A run of parts (a request of several) stays within one pass over its source: a
    server refuses a request that names a sample twice."""
    weights = Weights.of([5, 3, 1][: len(sources)])
    for world in (1, 2):
        plan = mixture_batches(sources, weights, samples_per_epoch=150, world_size=world,
                               rank=world - 1, epoch=1, seed=4, batch_size=6, drop_last=True,
                               shuffle=SHUFFLE)
        for k, runs in enumerate(plan.runs):
            parts = plan.parts[k]
            assert len(runs) == len(parts) and (runs > np.arange(len(parts))).all()
            assert (np.diff(runs) >= 0).all() and (runs <= len(parts)).all()
            for i in range(len(parts)):
                named = [(s, x) for j in range(i, int(runs[i]))
                         for s, a, b in parts.rows(j).tolist() for x in range(a, b)]
                assert len(named) == len(set(named)), (k, i)
            if sum(sources[k]) < 20:  # many passes per epoch: runs are cut
                assert runs[0] < len(parts)
