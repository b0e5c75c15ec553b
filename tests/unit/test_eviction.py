"""The eviction policies of the decoded-sample cache: plan-aware eviction against an exhaustive
search for the most hits on small streams, and LRU when nothing is announced."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest

from dataflow.bench.experiments.cache import lru_hits
from dataflow.errors import ConfigError
from dataflow.server.eviction import PlanAware, Recency
from dataflow.server.samplecache import SampleCache, sample_bytes


def _run(policy: Recency[int], stream: list[int], capacity: int,
         windows: list[dict[str, list[int]]] | None = None) -> int:
    """Hits of a cache of ``capacity`` keys evicting as ``policy`` says over ``stream``; before
    access ``i`` the sessions announce ``windows[i]``. The new key may be the victim."""
    held: set[int] = set()
    hits = 0
    for i, key in enumerate(stream):
        if windows is not None:
            for session, keys in windows[i].items():
                policy.announce(session, keys)  # type: ignore[attr-defined]
        if key in held:
            hits += 1
            policy.used(key)
            continue
        held.add(key)
        policy.used(key)
        while len(held) > capacity:
            victim = policy.victim()
            policy.forget(victim)
            held.remove(victim)
    return hits


def _most_hits(stream: tuple[int, ...], capacity: int) -> int:
    """The most hits any eviction choice reaches over ``stream`` (exhaustive search)."""

    @functools.cache
    def best(i: int, held: frozenset[int]) -> int:
        if i == len(stream):
            return 0
        key = stream[i]
        if key in held:
            return 1 + best(i + 1, held)
        grown = held | {key}
        if len(grown) <= capacity:
            return best(i + 1, grown)
        return max(best(i + 1, grown - {victim}) for victim in grown)

    return best(0, frozenset())


def _streams(n: int, length: int, keys: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(keys) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("capacity", [1, 2, 3])
@pytest.mark.parametrize("keys", [3, 4, 5])
def test_announcing_the_whole_future_reaches_the_most_hits_possible(capacity: int,
                                                                    keys: int) -> None:
    for stream in _streams(25, 11, keys, seed=capacity * 10 + keys):
        future = [{"s": stream[i + 1:]} for i in range(len(stream))]
        got = _run(PlanAware(1, len(stream)), stream, capacity, future)
        assert got == _most_hits(tuple(stream), capacity), stream


@pytest.mark.parametrize("jobs", [2, 3, 4])
@pytest.mark.parametrize("capacity", [2, 4])
def test_interleaved_jobs_announcing_their_own_windows_beat_lru(jobs: int,
                                                                capacity: int) -> None:
    """Jobs read their own permutations of 8 keys, twice, one key each in turn, each announcing
    its next ``window`` keys at its read: each window counts from its own job's place, so the
    choice is near Belady's, not exactly it: over the grid it is never below LRU (nor above the
    optimum, checked where the search is small)."""
    rng = random.Random(jobs * 7 + capacity)
    for window in (2, 4, 16):
        ours = lru = best = 0
        for _ in range(10):
            orders = [rng.sample(range(8), 8) + rng.sample(range(8), 8) for _ in range(jobs)]
            stream, windows = [], []
            for at in range(16):
                for j in range(jobs):
                    stream.append(orders[j][at])
                    windows.append({j: orders[j][at + 1:at + 1 + window]})
            ours += _run(PlanAware(jobs, window), stream, capacity, windows)
            lru += lru_hits(np.asarray(stream), capacity)
            if jobs == 2:  # the exhaustive search is small enough
                best += _most_hits(tuple(stream), capacity)
        assert lru <= ours, (window, lru, ours)
        assert jobs > 2 or ours <= best


@pytest.mark.parametrize("capacity", [1, 2, 4])
def test_without_announcements_it_is_lru(capacity: int) -> None:
    for stream in _streams(20, 40, 7, seed=capacity):
        assert _run(PlanAware(4, 8), stream, capacity) == lru_hits(np.asarray(stream), capacity)
        assert _run(Recency(), stream, capacity) == lru_hits(np.asarray(stream), capacity)


def test_ties_and_keys_no_window_names_go_least_recently_used_first() -> None:
    p: PlanAware[str] = PlanAware(2, 8)
    for key in "abcd":
        p.used(key)
    p.announce("s", ["c", "a"])
    assert p.victim() == "b"  # named by no window, least recent of those
    p.forget("b")
    assert p.victim() == "d"
    p.forget("d")
    assert p.victim() == "a"  # next used after c
    p.announce("t", ["a"])
    assert p.next_use("a") == 0 and p.victim() == "a"  # a tie: a was used before c
    p.announce("s", ["a", "c"])  # c now at 1 in s, a at 0: c furthest
    assert p.victim() == "c"
    p.announce("s", ["a"])
    assert p.next_use("c") is None and p.victim() == "c"


def test_windows_are_bounded() -> None:
    p: PlanAware[int] = PlanAware(2, 3)
    with pytest.raises(ValueError, match="at most 3 rows"):
        p.announce("s", [1, 2, 3, 4])
    p.announce("s", [1])
    p.announce("t", [2])
    p.announce("u", [3])  # the least recently announced window (s) is dropped
    assert p.next_use(1) is None and p.next_use(2) == 0 and p.next_use(3) == 0
    p.announce("t", [])
    assert p.next_use(2) is None
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="Found"):
            PlanAware(bad, 3)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        p.victim()


def test_lazy_heaps_stay_bounded_under_many_announcements() -> None:
    p: PlanAware[int] = PlanAware(4, 16)
    rng = random.Random(0)
    for i in range(2000):
        p.used(i % 50)
        p.announce(i % 4, [rng.randrange(60) for _ in range(16)])
    assert len(p._free) + len(p._planned) <= 4 * len(p) + 64 + 1


def _sample(value: int) -> tuple:
    return (("x", np.full((1, 8), value, dtype=np.int64), None),)


@pytest.mark.parametrize("capacity", [2, 3])
def test_sample_cache_with_plan_aware_eviction_keeps_the_bound_and_may_refuse_the_new_one(
        capacity: int) -> None:
    size = sample_bytes(_sample(0))
    policy: PlanAware[tuple[int, int]] = PlanAware(1, 10)
    cache = SampleCache(capacity * size, policy=policy)
    stream = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    hits = 0
    for i, row in enumerate(stream):
        policy.announce("s", [(0, r) for r in stream[i + 1:]])
        found = cache.get((0, row))
        if found is None:
            cache.put((0, row), _sample(row))
        else:
            hits += 1
            assert int(found[0][1][0, 0]) == row
        assert cache.counts().bytes <= cache.bound
    assert hits == _most_hits(tuple(stream), capacity)
    assert cache.counts().hits == hits


def test_every_order_of_a_small_stream() -> None:
    """All streams of length 6 over 3 keys, capacity 2: whole-future announcements are
    optimal."""
    for stream in itertools.product(range(3), repeat=6):
        future = [{"s": list(stream[i + 1:])} for i in range(6)]
        assert _run(PlanAware(1, 6), list(stream), 2, future) == _most_hits(stream, 2)


def test_a_forgotten_session_s_window_no_longer_counts() -> None:
    p: PlanAware[str] = PlanAware(4, 8)
    for key in "ab":
        p.used(key)
    p.announce("s", ["a"])
    p.announce("t", ["a", "b"])
    assert p.victim() == "b"
    p.forget_session("t")
    assert p.next_use("b") is None and p.next_use("a") == 0 and p.victim() == "b"
    p.forget_session("s")
    p.forget_session("never announced")
    assert p.next_use("a") is None and p.victim() == "a"
