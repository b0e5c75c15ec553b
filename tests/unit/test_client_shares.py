"""How requests are shared over servers (client/shares.py): in proportion to capacity, by turns
over servers alike; and the scheduler driving it over simulated servers (fake clock)."""

from __future__ import annotations

import heapq
import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from dataflow.client.cursor import Pass
from dataflow.client.passes import PassPlan
from dataflow.client.scheduler import CONTROL, Scheduler
from dataflow.client.shares import (
    EQUAL_WITHIN,
    MIN_SAMPLES,
    SERVICE_MEMORY,
    STALL,
    Shares,
    median,
)
from dataflow.client.stream import Demand
from dataflow.plan import Batches, Range


def _plan(n: int) -> PassPlan:
    """One pass of ``n`` batches of 4 samples."""
    return PassPlan(Pass(0, 0), Batches.of([[Range(0, 4 * i, 4 * i + 4)] for i in range(n)]), 0)


def _shares(readers=(1, 1, 1), credits=4) -> Shares:
    sh = Shares()
    for i, r in enumerate(readers):
        sh.join(i, r, credits, now=0.0)
    return sh


def _pick(sh: Shares, ready=(0, 1, 2), pool=(0, 1, 2), held=None) -> int | None:
    """The next pick of ``sh``: ``pool`` may take it, ``ready`` have credit; ``held``: the
    requests each holds (none by default: every reader idle)."""
    return sh.pick(pool, set(ready), pool, held or dict.fromkeys(pool, 0))


def _answer(sh: Shares, server: int, seconds: float, times: int = MIN_SAMPLES) -> None:
    for _ in range(times):
        sh.answered(server, 0.0, seconds)


def test_servers_alike_take_turns() -> None:
    sh = _shares()
    assert [_pick(sh) for _ in range(9)] == [0, 1, 2] * 3
    # the server that was first on a tie under the old rule gets no more than its turn
    assert [_pick(sh, ready=(0, 1)) for _ in range(4)] == [0, 1, 0, 1]


def test_service_times_within_the_band_count_as_equal() -> None:
    sh = _shares()
    for i, seconds in enumerate((0.010, 0.0099 * EQUAL_WITHIN, 0.014)):
        _answer(sh, i, seconds)
    assert [sh.weight(i, [0, 1, 2]) for i in range(3)] == [1.0, 1.0, 1.0]
    assert [_pick(sh) for _ in range(6)] == [0, 1, 2] * 2
    _answer(sh, 1, 0.0101 * EQUAL_WITHIN, times=SERVICE_MEMORY)  # beyond: cut in proportion
    assert sh.weight(1, [0, 1, 2]) == pytest.approx(1 / (1.01 * EQUAL_WITHIN))


def test_shares_follow_readers_and_speed() -> None:
    sh = _shares(readers=(1, 2, 4))
    got = [_pick(sh) for _ in range(700)]
    assert [got.count(i) for i in range(3)] == [100, 200, 400]
    slow = _shares(readers=(2, 2, 2))
    _answer(slow, 0, 0.01)
    _answer(slow, 1, 0.01)
    _answer(slow, 2, 0.04)
    assert slow.weight(2, [0, 1, 2]) == pytest.approx(0.5)  # 2 readers, a quarter as fast
    got = [_pick(slow) for _ in range(900)]
    assert [got.count(i) for i in range(3)] == [400, 400, 100]
    assert got[:6].count(2) == 0  # the slow server's first turn comes after the fast ones'


def test_out_of_turn_only_a_server_as_fast_with_a_reader_idle_takes_a_request() -> None:
    sh = _shares(readers=(2, 2, 2))
    # server 0's turn, its credits in use: the next in turn with a reader idle takes it
    assert _pick(sh, ready=(1, 2), held={0: 4, 1: 2, 2: 1}) == 2
    assert _pick(sh, ready=(1, 2), held={0: 4, 1: 2, 2: 2}) is None  # readers busy: wait
    for i, seconds in enumerate((0.01, 0.01, 0.04)):
        _answer(sh, i, seconds)
    assert _pick(sh, ready=(2,), held={0: 4, 1: 4, 2: 0}) is None  # slower: its turns only
    assert _pick(sh, ready=(0, 2), held={0: 3, 1: 4, 2: 0}) == 0


def test_a_sample_counts_the_rounds_of_requests_ahead() -> None:
    sh = _shares(readers=(2,))
    sh.answered(0, 1.0, 0.03, held=5)  # three rounds of two readers: 10 ms each
    assert sh.service(0) == pytest.approx(0.01)


def test_a_few_slow_replies_move_nothing_and_many_do() -> None:
    sh = _shares()
    for i in range(3):
        _answer(sh, i, 1.5, times=2)  # each reader's first request opens the shards
        _answer(sh, i, 0.0015, times=MIN_SAMPLES)
    assert sh.service(2) == pytest.approx(0.0015)
    sh.answered(2, 0.0, 0.15)  # 100x: a hiccup
    assert [sh.weight(i, [0, 1, 2]) for i in range(3)] == [1.0, 1.0, 1.0]
    _answer(sh, 2, 0.006, times=SERVICE_MEMORY // 2)  # 4x slower from now on
    assert sh.weight(2, [0, 1, 2]) == pytest.approx(0.25)


def test_turns_missed_are_kept_up_to_the_credits() -> None:
    sh = _shares(credits=2)
    for _ in range(10):  # server 2 cannot take its turns (its credits in use)
        _pick(sh, ready=(0, 1))
    got = [_pick(sh) for _ in range(9)]
    assert got == [2, 2, 2] + [0, 1, 2] * 2  # its two turns kept, then its own


def test_a_server_that_joins_later_starts_at_the_current_turn() -> None:
    sh = _shares(readers=(1, 1))
    for _ in range(50):
        _pick(sh, ready=(0, 1), pool=(0, 1))
    sh.join(2, 1, 4, now=5.0)
    got = [_pick(sh) for _ in range(9)]
    assert sorted(got.count(i) for i in range(3)) == [3, 3, 3]


def test_a_silent_server_holding_requests_is_stalled_after_its_service_times() -> None:
    sh = _shares()
    _answer(sh, 0, 0.01)
    assert sh.stalled_at(0, None, [0, 1]) == math.inf  # holds nothing
    assert sh.stalled_at(0, 2.0, [0, 1]) == pytest.approx(2.0 + STALL * 0.01)
    sh.answered(0, 2.5, 0.01)
    assert sh.stalled_at(0, 2.0, [0, 1]) == pytest.approx(2.5 + STALL * 0.01)
    # without an estimate of its own, the fastest server's; without any, never
    assert sh.stalled_at(1, 1.0, [0, 1]) == pytest.approx(1.0 + STALL * 0.01)
    assert sh.stalled_at(1, 1.0, [1, 2]) == math.inf


# -- the scheduler over simulated servers ----------------------------------------------------


@dataclass
class Cluster:
    """Simulated servers: each has ``readers`` readers answering its requests in order, one
    request taking ``service`` seconds (times a random factor up to ``jitter`` either way);
    a server in ``stops`` answers nothing sent from then on."""

    readers: tuple[int, ...]
    service: tuple[float, ...]
    credits: int = 4
    step: float = 0.0  # the consumer's seconds per batch
    jitter: float = 1.0
    stops: dict[int, float] = field(default_factory=dict)
    request_timeout: float = math.inf
    seed: int = 0

    def run(self, n: int, dt: float = 0.001) -> list[tuple[float, int, int]]:
        """Read ``n`` batches; returns every request sent: ``(time, server, batch)``."""
        rng = random.Random(self.seed)
        eps = [f"tcp://s{i}:1" for i in range(len(self.readers))]
        s = Scheduler(eps, timeout=100.0, heartbeat_s=1.0, silent_s=3.0, grace=5.0,
                      request_timeout=self.request_timeout)
        for i, r in enumerate(self.readers):
            s.link(i, CONTROL, up=True, now=0.0)
            s.hellos_due(0.0)
            s.grant(i, self.credits, now=0.0, readers=r)
        assert s.follow(Demand(1, (_plan(n),)))
        free = [[0.0] * r for r in self.readers]  # when each reader is free
        due: list[tuple[float, int, int]] = []  # (reply time, server, req_id)
        sent: list[tuple[float, int, int]] = []
        received: set[int] = set()
        taken, next_take, tick = 0, 0.0, 0
        while taken < n:
            tick += 1
            now = tick * dt
            assert now < 600, (taken, n)
            for i in s.heartbeats_due(now):
                s.heard(i, now)  # the frontends answer: liveness never suspects anyone
            assert s.check(now) == []
            while due and due[0][0] <= now:
                _, server, req = heapq.heappop(due)
                slot = s.on_reply(server, req, now)
                if slot is not None:
                    assert not received & set(slot.indexes)
                    received.update(slot.indexes)
            assert not any(late.failed for late in s.late(now))
            while taken in received and now >= next_take:
                taken += 1
                next_take = now + self.step
            for a in s.assignments(taken, now):
                sent.append((now, a.server, a.index))
                assert s.outstanding(a.server) <= self.credits
                if now >= self.stops.get(a.server, math.inf):
                    continue
                readers = free[a.server]
                r = min(range(len(readers)), key=readers.__getitem__)
                took = self.service[a.server] * math.exp(rng.uniform(-1, 1)
                                                         * math.log(self.jitter))
                readers[r] = max(now, readers[r]) + took
                heapq.heappush(due, (readers[r], a.server, a.req_id))
        assert received == set(range(n))
        return sent


def _counts(sent: list[tuple[float, int, int]], servers: int) -> list[int]:
    return [sum(1 for _, i, _ in sent if i == server) for server in range(servers)]


def _within(counts: list[int], expected: list[float], tolerance: float = 0.15) -> bool:
    total = sum(counts)
    want = [total * e / sum(expected) for e in expected]
    return all(abs(c - w) <= tolerance * w for c, w in zip(counts, want, strict=True))


@pytest.mark.parametrize("step", [0.0, 0.02], ids=["servers-bound", "consumer-bound"])
@pytest.mark.parametrize("jitter", [1.0, 1.8])
def test_equal_servers_get_equal_shares(step: float, jitter: float) -> None:
    sent = Cluster((2, 2, 2), (0.01, 0.01, 0.01), step=step, jitter=jitter).run(600)
    counts = _counts(sent, 3)
    assert _within(counts, [1, 1, 1]), counts
    if jitter == 1.0:
        assert max(counts) - min(counts) <= 1  # by turns


@pytest.mark.parametrize("step", [0.0, 0.02], ids=["servers-bound", "consumer-bound"])
def test_shares_follow_the_readers(step: float) -> None:
    sent = Cluster((1, 2, 4), (0.01, 0.01, 0.01), step=step, jitter=1.3).run(700)
    counts = _counts(sent, 3)
    assert _within(counts, [1, 2, 4]), counts


@pytest.mark.parametrize("step", [0.0, 0.02], ids=["servers-bound", "consumer-bound"])
def test_a_server_four_times_slower_gets_a_quarter_share(step: float) -> None:
    sent = Cluster((2, 2, 2), (0.01, 0.01, 0.04), step=step, jitter=1.3).run(900)
    counts = _counts(sent, 3)
    assert _within(counts, [4, 4, 1]), counts


def test_a_server_that_stops_answering_gets_no_new_request() -> None:
    stop = 1.0
    cluster = Cluster((2, 2, 2), (0.01, 0.01, 0.01), step=0.05, stops={2: stop},
                      request_timeout=1.0)
    sent = cluster.run(150)
    unanswered = [t for t, i, _ in sent if i == 2 and t >= stop]
    # its turns until it has been silent for STALL service times since the first request it
    # left unanswered, then none: fewer than its credits (those would stop it too); its
    # batches are asked of the others after the request timeout
    assert 0 < len(unanswered) < cluster.credits
    assert unanswered[-1] <= unanswered[0] + STALL * 0.01
    later = _counts([x for x in sent if x[0] > unanswered[-1]], 3)
    assert later[2] == 0 and _within(later[:2], [1, 1]), later


def test_the_shares_are_deterministic() -> None:
    cluster = Cluster((1, 2, 4), (0.01, 0.02, 0.01), step=0.003, jitter=1.5, seed=3)
    assert cluster.run(300) == cluster.run(300)


def test_the_median_is_statistics_median_of_any_count_and_order() -> None:
    rng = random.Random(3)
    for n in range(1, 2 * SERVICE_MEMORY + 2):
        values = [rng.choice((rng.uniform(-5, 5), 0.25, -1.0)) for _ in range(n)]
        assert median(values) == statistics.median(values), values


def test_a_pick_from_one_server_takes_its_turn_as_a_pick_from_more_would() -> None:
    """Server 0 alone may take a request (the others hold it, or have no credit): its turn
    is counted as when it is picked over the others, and every later pick agrees."""
    rng = random.Random(5)
    alone, among = _shares(readers=(1, 2, 1)), _shares(readers=(1, 2, 1))
    for _ in range(10):  # server 0 runs ahead of the others' turns
        assert _pick(alone, ready=(0,), pool=(0,)) == _pick(among, ready=(0,)) == 0
    assert _pick(alone, ready=(), pool=(0,)) is None
    for _ in range(300):
        ready = tuple(i for i in range(3) if rng.random() < 0.7)
        assert _pick(alone, ready=ready) == _pick(among, ready=ready)
        if rng.random() < 0.2:
            only = rng.randrange(3)
            assert (_pick(alone, ready=(only,), pool=(only,))
                    == _pick(among, ready=(only,)) == only)
