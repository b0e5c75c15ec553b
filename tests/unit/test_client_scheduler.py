"""The client's request scheduler: credits, window, choice of server, liveness (fake clock)."""

from __future__ import annotations

import pytest

from dataflow.client.scheduler import Scheduler, Slot
from dataflow.errors import InternalError, ProtocolError, ServerUnavailable
from dataflow.plan import Batches, Range

EPS = ("tcp://a:1", "tcp://b:2")


def _batches(n: int) -> Batches:
    return Batches.of([[Range(0, 4 * i, 4 * i + 4)] for i in range(n)])


def _sched(credits=(2, 2), timeout: float = 10.0) -> Scheduler:
    s = Scheduler(EPS[: len(credits)], timeout=timeout, heartbeat_s=1.0)
    for i, c in enumerate(credits):
        s.grant(i, c, now=0.0)
    return s


def test_requests_in_plan_order_spread_over_least_loaded_servers() -> None:
    s = _sched()
    s.start_epoch(1, _batches(10), first=0)
    got = s.assignments(taken=0, now=0.0)
    assert [a.index for a in got] == [0, 1, 2, 3]
    assert [a.server for a in got] == [0, 1, 0, 1]
    assert got[2].ranges.tolist() == [[0, 8, 12]]
    assert len({a.req_id for a in got}) == 4


def test_credits_bound_outstanding_per_server() -> None:
    s = _sched(credits=(1, 3))
    s.start_epoch(1, _batches(10), first=0)
    got = s.assignments(taken=0, now=0.0)
    assert [a.server for a in got] == [0, 1, 1, 1]
    assert s.outstanding(0) == 1 and s.outstanding(1) == 3
    assert s.assignments(taken=4, now=0.0) == []  # every credit in use
    assert s.on_reply(0, got[0].req_id, now=0.1) == Slot(1, 0)
    (nxt,) = s.assignments(taken=4, now=0.1)
    assert nxt.server == 0 and nxt.index == 4


def test_window_counts_batches_not_taken_by_the_consumer() -> None:
    s = _sched()
    s.start_epoch(1, _batches(10), first=0)
    first = s.assignments(taken=0, now=0.0)
    for a in first:
        s.on_reply(a.server, a.req_id, now=0.0)
    assert s.window == 4
    assert s.assignments(taken=0, now=0.0) == [] and s.window_full(0)
    more = s.assignments(taken=3, now=0.0)
    assert [a.index for a in more] == [4, 5, 6] and s.window_full(3)
    assert not s.window_full(7)


def test_epoch_resumes_at_first_and_ends() -> None:
    s = _sched()
    s.start_epoch(1, _batches(3)[1:], first=1)
    got = s.assignments(taken=0, now=0.0)
    assert [a.index for a in got] == [1, 2]
    assert not s.window_full(0)


def test_abandoned_epoch_keeps_credits_until_answered_and_is_stale() -> None:
    s = _sched(credits=(1,))
    s.start_epoch(1, _batches(5), first=0)
    (old,) = s.assignments(taken=0, now=0.0)
    s.start_epoch(2, _batches(5), first=0)
    assert s.assignments(taken=0, now=0.0) == []  # the server still holds the old request
    assert s.on_reply(0, old.req_id, now=0.1) is None
    (new,) = s.assignments(taken=0, now=0.1)
    assert new.index == 0 and s.on_reply(0, new.req_id, now=0.2) == Slot(2, 0)


def test_generations_only_grow() -> None:
    s = _sched()
    s.start_epoch(3, _batches(2), first=0)
    with pytest.raises(InternalError):
        s.start_epoch(3, _batches(2), first=0)


def test_unknown_reply_is_a_protocol_error() -> None:
    s = _sched()
    s.start_epoch(1, _batches(2), first=0)
    with pytest.raises(ProtocolError, match="tcp://a:1.*unknown request 99"):
        s.on_reply(0, 99, now=0.0)


def test_zero_credits_are_refused() -> None:
    with pytest.raises(ProtocolError, match="tcp://a:1"):
        _sched(credits=(0,))


def test_liveness_counts_time_without_progress() -> None:
    s = _sched(credits=(2,), timeout=5.0)
    s.check(100.0)  # nothing outstanding: never unavailable
    s.start_epoch(1, _batches(4), first=0)
    a, b = s.assignments(taken=0, now=10.0)
    s.check(15.0)
    assert s.next_deadline(14.0) == pytest.approx(0.0)  # a heartbeat is overdue
    s.on_reply(0, a.req_id, now=14.0)  # progress restarts the clock
    s.check(19.0)
    with pytest.raises(ServerUnavailable, match="tcp://a:1.*1 request"):
        s.check(19.5)
    s.on_reply(0, b.req_id, now=19.5)
    s.check(1000.0)


def test_heartbeats_are_due_every_interval() -> None:
    s = _sched()
    assert s.heartbeats_due(0.5) == []
    assert s.heartbeats_due(1.0) == [0, 1]
    assert s.heartbeats_due(1.5) == []
    assert s.next_deadline(1.5) == pytest.approx(0.5)
    assert s.heartbeats_due(2.0) == [0, 1]
