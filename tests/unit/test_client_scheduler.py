"""The client's request scheduler: credits, depth, choice of server, liveness and failover
(fake clock)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dataflow import wire
from dataflow.client.cursor import Pass
from dataflow.client.passes import PassPlan
from dataflow.client.scheduler import CONTROL, Loss, Reply, Scheduler, State
from dataflow.client.slots import Slot
from dataflow.client.stream import Demand
from dataflow.errors import InternalError, ProtocolError, ServerUnavailable
from dataflow.plan import Batches, Range
from dataflow.wire import BatchTag

EPS = ("tcp://a:1", "tcp://b:2")


def _batches(n: int) -> Batches:
    return Batches.of([[Range(0, 4 * i, 4 * i + 4)] for i in range(n)])


def _plan(batches: Batches, *, seed: int = 0, epoch: int = 0) -> PassPlan:
    return PassPlan(Pass(epoch, 0), batches, seed)


def _start(s: Scheduler, gen: int, batches: Batches, first: int = 0, *, seed: int = 0,
           epoch: int = 0) -> None:
    """The consumer wants generation ``gen``: one pass of ``batches`` from batch ``first``."""
    assert s.follow(Demand(gen, (_plan(batches, seed=seed, epoch=epoch),), first))


def _key(reply: Reply | None) -> tuple[int, int, int, bool] | None:
    """What an accepted reply's request is for: ``(gen, index, samples, retry)``."""
    if reply is None:
        return None
    slot = reply.slot
    assert reply.indexes == tuple(slot.indexes)
    return (slot.gen, slot.index, slot.samples, slot.retry)


def _sched(credits=(2, 2), timeout: float = 10.0, grace: float = 5.0,
           group: int = 1) -> Scheduler:
    s = Scheduler(EPS[: len(credits)], timeout=timeout, heartbeat_s=1.0, silent_s=3.0,
                  grace=grace, group=group)
    for i, c in enumerate(credits):
        s.link(i, CONTROL, up=True, now=0.0)
        assert s.hellos_due(0.0) == [i]
        s.grant(i, c, now=0.0, readers=c, group=group)
    return s


def test_requests_in_plan_order_spread_over_least_loaded_servers() -> None:
    s = _sched()
    _start(s, 1, _batches(10))
    got = s.assignments(taken=0, now=0.0)
    assert [a.index for a in got] == [0, 1, 2, 3]
    assert [a.server for a in got] == [0, 1, 0, 1]
    assert got[2].ranges.tolist() == [[0, 8, 12]]
    assert len({a.req_id for a in got}) == 4


def test_credits_bound_outstanding_per_server() -> None:
    s = _sched(credits=(1, 3))
    _start(s, 1, _batches(10))
    got = s.assignments(taken=0, now=0.0)
    assert [a.server for a in got] == [1, 1, 0, 1]  # shared by readers: 1 and 3
    assert s.outstanding(0) == 1 and s.outstanding(1) == 3
    assert s.assignments(taken=4, now=0.0) == []  # every credit in use
    assert _key(s.on_reply(0, got[2].req_id, now=0.1)) == (1, 2, 4, False)
    (nxt,) = s.assignments(taken=4, now=0.1)
    assert nxt.server == 0 and nxt.index == 4


def test_depth_counts_batches_not_taken_by_the_consumer() -> None:
    s = _sched()
    _start(s, 1, _batches(10))
    first = s.assignments(taken=0, now=0.0)
    for a in first:
        s.on_reply(a.server, a.req_id, now=0.0)
    assert s.depth == 4
    assert s.assignments(taken=0, now=0.0) == [] and s.full(0)
    more = s.assignments(taken=3, now=0.0)
    assert [a.index for a in more] == [4, 5, 6] and s.full(3)
    assert not s.full(7)


def test_epoch_resumes_at_first_and_ends() -> None:
    s = _sched()
    _start(s, 1, _batches(3)[1:], 1)
    got = s.assignments(taken=0, now=0.0)
    assert [a.index for a in got] == [1, 2]
    assert not s.full(0)


def test_abandoned_epoch_keeps_credits_until_answered_and_is_stale() -> None:
    s = _sched(credits=(1,))
    _start(s, 1, _batches(5))
    (old,) = s.assignments(taken=0, now=0.0)
    _start(s, 2, _batches(5))
    assert s.assignments(taken=0, now=0.0) == []  # the server still holds the old request
    assert s.on_reply(0, old.req_id, now=0.1) is None
    (new,) = s.assignments(taken=0, now=0.1)
    assert new.index == 0 and _key(s.on_reply(0, new.req_id, now=0.2)) == (2, 0, 4, False)


def test_generations_only_grow() -> None:
    s = _sched()
    _start(s, 3, _batches(2))
    assert not s.follow(Demand(3, (_plan(_batches(2)),)))  # the same generation: no new start
    with pytest.raises(InternalError, match="generation 2 after 3"):
        s.follow(Demand(2, (_plan(_batches(2)),)))


def test_unknown_reply_is_a_protocol_error() -> None:
    s = _sched()
    _start(s, 1, _batches(2))
    with pytest.raises(ProtocolError, match="tcp://a:1.*unknown request 99"):
        s.on_reply(0, 99, now=0.0)


def test_zero_credits_are_refused() -> None:
    with pytest.raises(ProtocolError, match="tcp://a:1"):
        _sched(credits=(0,))


def test_heartbeats_are_due_every_interval() -> None:
    s = _sched()
    assert s.heartbeats_due(0.5) == []
    assert s.heartbeats_due(1.0) == [0, 1]
    assert s.heartbeats_due(1.5) == []
    assert s.next_deadline(1.5) == pytest.approx(0.5)
    assert s.heartbeats_due(2.0) == [0, 1]


def _running(s: Scheduler, n: int = 10, now: float = 0.0):
    _start(s, 1, _batches(n))
    return s.assignments(taken=0, now=now)


def _serve_all(s: Scheduler, now: float) -> list[int]:
    """Answer every outstanding request: the batch indexes accepted, in answer order."""
    got = []
    for server in range(len(EPS)):
        for a in list(s._servers[server].outstanding):  # noqa: SLF001
            slot = s.on_reply(server, a, now)
            if slot is not None:
                got.extend(slot.indexes)
    return got


def test_disconnected_server_is_suspect_and_its_batches_go_to_the_others_at_once() -> None:
    s = _sched()
    first = _running(s)
    assert [a.server for a in first] == [0, 1, 0, 1]
    s.link(1, CONTROL, up=False, now=1.0)
    assert s.check(1.0) == [] and s.state(1) is State.SUSPECT
    # batches 1 and 3 (held by server 1) are re-requested before batch 4, from server 0 only
    for a in first:
        if a.server == 0:
            s.on_reply(0, a.req_id, now=1.1)
    again = s.assignments(taken=0, now=1.1)
    assert [(a.index, a.server, a.retry) for a in again] == [(1, 0, True), (3, 0, True)]
    # server 0 answers first: accepted; server 1's late replies are discarded
    assert [s.on_reply(0, a.req_id, now=1.2).slot.index for a in again] == [1, 3]
    assert [s.on_reply(1, a.req_id, now=1.3) for a in first if a.server == 1] == [None, None]


def test_each_batch_is_accepted_once_whoever_answers_first() -> None:
    s = _sched()
    first = _running(s)
    s.link(1, CONTROL, up=False, now=1.0)
    s.check(1.0)
    again = s.assignments(taken=0, now=1.0)  # server 0 has credit for nothing: 0, 2 held
    assert again == []
    # the suspect server answers after all (a short cut): accepted, nothing re-requested
    assert _key(s.on_reply(1, first[1].req_id, now=1.5)) == (1, 1, 4, False)
    s.on_reply(0, first[0].req_id, now=1.5)
    (nxt,) = s.assignments(taken=0, now=1.5)
    assert (nxt.index, nxt.retry) == (3, True)
    assert _key(s.on_reply(1, first[3].req_id, now=1.6)) == (1, 3, 4, False)
    assert s.on_reply(0, nxt.req_id, now=1.7) is None  # the duplicate


def test_suspect_server_back_within_grace_keeps_its_session() -> None:
    s = _sched(credits=(2,), grace=5.0)
    a, b = _running(s)
    s.link(0, CONTROL, up=False, now=1.0)
    s.check(1.0)
    assert s.state(0) is State.SUSPECT and s.assignments(taken=0, now=1.0) == []
    s.link(0, CONTROL, up=True, now=3.0)
    s.check(3.0)
    assert s.state(0) is State.SUSPECT  # connected, but not heard from since
    s.heard(0, now=3.5)
    assert s.check(3.5) == [] and s.state(0) is State.UP
    # its connection broke, so replies in flight may be gone: both batches asked again
    again = s.assignments(taken=0, now=3.5)
    assert [(x.index, x.retry) for x in again] == [(0, True), (1, True)]
    assert s.on_reply(0, a.req_id, now=3.6) is None  # a late reply of a forgotten request
    assert [s.on_reply(0, x.req_id, now=3.7).slot.index for x in again] == [0, 1]
    assert s.on_reply(0, b.req_id, now=3.8) is None


def test_silent_server_is_suspect_until_it_answers_and_keeps_its_requests() -> None:
    s = _sched(credits=(2,))
    a, _ = _running(s)
    assert s.heartbeats_due(1.0) == [0]
    s.heartbeats_due(2.0)
    s.check(4.0)
    assert s.state(0) is State.UP  # the HEARTBEAT of 1.0 is unanswered for 3.0 s only
    s.check(4.1)
    assert s.state(0) is State.SUSPECT
    s.heard(0, now=4.5)  # an answer: the connection never broke, its requests still count
    s.check(4.5)
    assert s.state(0) is State.UP and s.outstanding(0) == 2
    assert _key(s.on_reply(0, a.req_id, now=4.6)) == (1, 0, 4, False)


def test_a_slow_reply_is_not_a_dead_server_while_heartbeats_are_answered() -> None:
    s = _sched(credits=(1,), timeout=5.0)
    (a,) = _running(s)
    for t in range(1, 200):  # 200 s for one reply, far beyond `timeout`
        s.heartbeats_due(float(t))
        s.heard(0, now=t + 0.1)
        assert s.check(t + 0.2) == [] and s.state(0) is State.UP
    assert _key(s.on_reply(0, a.req_id, now=200.0)) == (1, 0, 4, False)


def test_suspect_longer_than_grace_is_lost_and_joins_again_when_reconnected() -> None:
    s = _sched(grace=5.0)
    first = _running(s)
    s.link(1, CONTROL, up=False, now=1.0)
    s.check(1.0)
    assert s.check(6.0) == [] and s.check(6.1) == [Loss(1, joining=False)]
    assert s.state(1) is State.DOWN and s.outstanding(1) == 0
    assert s.hellos_due(7.0) == []  # its control connection is still down
    s.link(1, CONTROL, up=True, now=8.0)
    assert s.hellos_due(8.0) == [1] and s.state(1) is State.JOINING
    assert s.hellos_due(8.1) == []
    s.grant(1, 3, now=8.5, readers=3)
    assert s.state(1) is State.UP and s.depth == 4  # the depth is the first join's
    assert s.on_reply(1, first[1].req_id, now=8.6) is None  # forgotten when lost
    for a in first:
        if a.server == 0:
            s.on_reply(0, a.req_id, now=8.6)
    got = s.assignments(taken=2, now=8.7)
    assert [(a.index, a.retry) for a in got] == [(1, True), (3, True), (4, False), (5, False)]
    assert {a.server for a in got} == {0, 1}


def test_session_lost_means_lost_at_once_and_a_hello_at_once() -> None:
    s = _sched()
    first = _running(s)
    s.lost(0, now=1.0)
    assert s.state(0) is State.DOWN and s.hellos_due(1.0) == [0]
    for a in first:
        if a.server == 1:
            s.on_reply(1, a.req_id, now=1.1)
    got = s.assignments(taken=0, now=1.1)
    assert [(a.index, a.server) for a in got] == [(0, 1), (2, 1)]


def test_stopping_server_is_asked_to_join_only_after_it_reconnects() -> None:
    s = _sched()
    _running(s)
    s.lost(0, now=1.0, hello=False)
    assert s.hellos_due(100.0) == []
    s.link(0, CONTROL, up=False, now=101.0)
    s.link(0, CONTROL, up=True, now=102.0)
    assert s.hellos_due(102.0) == [0]


def test_join_that_times_out_or_fails_is_retried_later_with_a_backoff() -> None:
    s = _sched(timeout=10.0)
    _running(s)
    s.lost(0, now=1.0)
    assert s.hellos_due(1.0) == [0]
    assert s.check(11.0) == [] and s.check(11.1) == [Loss(0, joining=True)]
    assert s.state(0) is State.DOWN
    assert s.describe(0) == "down (HELLO sent, no answer yet for 10.0 s)"
    assert s.hellos_due(12.0) == [] and s.hellos_due(12.1) == [0]  # 1 s later
    assert s.describe(0) == ("joining (HELLO sent, no answer yet; last try: HELLO sent, no "
                             "answer yet for 10.0 s)")
    s.join_failed(0, now=13.0, retry=True, why="busy: full")
    assert s.describe(0) == "down (busy: full)"
    assert s.hellos_due(14.9) == [] and s.hellos_due(15.0) == [0]  # then 2 s, 4 s, ...
    for failures in range(3, 12):
        s.join_failed(0, now=100.0 * failures, retry=True)
        wait = min(2.0 ** (failures - 1), 30.0)
        assert s.hellos_due(100.0 * failures + wait - 0.01) == []
        assert s.hellos_due(100.0 * failures + wait) == [0]
    s.link(0, CONTROL, up=False, now=2000.0)
    s.join_failed(0, now=2000.0, retry=True)
    s.link(0, CONTROL, up=True, now=2001.0)  # its connection came up anew: asked at once
    assert s.hellos_due(2001.0) == [0]
    s.grant(0, 2, now=2002.0, readers=2)
    s.lost(0, now=2003.0)
    s.hellos_due(2003.0)
    s.join_failed(0, now=2004.0, retry=True)  # a join was granted: the backoff starts over
    assert s.hellos_due(2005.0) == [0]
    s.join_failed(0, now=2006.0, retry=False)  # e.g. another dataset: stays out
    assert s.hellos_due(1e9) == []


def test_every_server_starts_not_connected_and_is_asked_once_connected() -> None:
    s = Scheduler(EPS, timeout=10.0, heartbeat_s=1.0, silent_s=3.0, grace=5.0, now=100.0)
    assert [s.state(i) for i in range(2)] == [State.DOWN, State.DOWN]
    assert s.describe(0) == "down (not connected)" and s.hellos_due(100.0) == []
    s.link(1, CONTROL, up=True, now=100.5)
    assert s.hellos_due(100.5) == [1] and s.describe(1) == "joining (HELLO sent, no answer yet)"
    assert s.hellos_due(100.6) == []  # one HELLO per join


def test_the_loader_starts_with_the_first_server_and_the_others_join_later() -> None:
    s = Scheduler(EPS, timeout=10.0, heartbeat_s=1.0, silent_s=3.0, grace=5.0, now=0.0)
    s.link(0, CONTROL, up=True, now=0.1)
    s.hellos_due(0.1)
    assert s.grant(0, 2, now=0.2, readers=2)  # the first server: nothing waits for the other
    _start(s, 1, _batches(10))
    assert [a.server for a in s.assignments(taken=0, now=0.3)] == [0, 0]
    for t in (5.0, 10.1, 60.0):  # the other is not up: no error, however long
        assert s.check(t) == []
    s.link(1, CONTROL, up=True, now=61.0)
    s.hellos_due(61.0)
    assert s.grant(1, 2, now=61.5, readers=2)
    assert s.depth == 4  # its credits count at once
    assert [a.server for a in s.assignments(taken=0, now=61.6)] == [1, 1]


@pytest.mark.parametrize("joined", [False, True])
def test_no_server_joined_within_timeout_names_every_endpoint_and_its_state(
        joined: bool) -> None:
    s = Scheduler(EPS, timeout=10.0, heartbeat_s=1.0, silent_s=3.0, grace=5.0, now=0.0)
    s.link(1, CONTROL, up=True, now=0.1)
    s.hellos_due(0.1)
    s.check(10.0)
    assert s.next_deadline(9.0) == pytest.approx(1.0)
    if joined:
        s.grant(1, 2, now=9.9, readers=2)
        assert s.check(30.0) == []
        return
    s.join_failed(1, now=2.0, retry=True, why="busy: full")
    with pytest.raises(ServerUnavailable, match=r"^tcp://a:1, tcp://b:2: no server admitted "
                                                r"this client within 10.0 s .*HELLO.*; "
                                                r"tcp://a:1: down \(not connected\); "
                                                r"tcp://b:2: down \(busy: full\)$"):
        s.check(10.1)


def test_undeliverable_reply_is_requested_again() -> None:
    s = _sched(credits=(2,))
    a, b = _running(s)
    s.again(s.on_reply(0, a.req_id, now=1.0), now=1.0)
    (again,) = s.assignments(taken=0, now=1.0)
    assert (again.index, again.retry) == (0, True)
    assert _key(s.on_reply(0, again.req_id, now=1.1)) == (1, 0, 4, True)


def test_unavailable_only_after_timeout_with_no_usable_server_and_work_left() -> None:
    s = _sched(timeout=5.0, grace=100.0)
    s.check(0.0)
    s.link(0, CONTROL, up=False, now=1.0)
    s.link(1, CONTROL, up=False, now=1.0)
    s.check(1.0)
    s.check(50.0)  # no epoch: nothing waits
    _running(s, now=50.0)
    s.check(50.0)
    assert s.next_deadline(50.0) == pytest.approx(0.0)  # heartbeats are overdue
    s.check(55.0)
    with pytest.raises(ServerUnavailable, match=r"tcp://a:1, tcp://b:2: no server usable for "
                                                r"5.1 s \(timeout 5.0 s; states: tcp://a:1: "
                                                r"suspect; tcp://b:2: suspect\)") as info:
        s.check(55.1)
    assert info.value.endpoint == "tcp://a:1, tcp://b:2"


def test_unavailable_clock_restarts_when_a_server_is_usable() -> None:
    s = _sched(credits=(1,), timeout=5.0, grace=100.0)
    _running(s)
    s.link(0, CONTROL, up=False, now=1.0)
    s.check(1.0)
    s.check(5.0)
    s.link(0, CONTROL, up=True, now=5.5)
    s.heard(0, now=5.6)
    s.check(5.6)
    s.link(0, CONTROL, up=False, now=6.0)
    s.check(6.0)
    s.check(10.9)  # 4.9 s since it was last usable


def test_consumer_not_taking_is_not_a_stall() -> None:
    s = _sched(credits=(1,), timeout=5.0, grace=100.0)
    (a,) = _running(s, n=3)
    s.on_reply(0, a.req_id, now=0.5)
    s.link(0, CONTROL, up=False, now=1.0)
    s.check(1.0)
    s.check(60.0)  # as deep as allowed (1 batch received, not taken): no server is needed now


@pytest.mark.parametrize("group", [1, 4])
def test_exactly_once_over_random_failures(group: int) -> None:
    rng = __import__("random").Random(7)
    for trial in range(30):
        s = _sched(credits=(2, 3), grace=2.0, group=group)
        n = 40
        _start(s, 1, _batches(n))
        got: list[int] = []
        now = 0.0
        while len(got) < n:
            now += 0.25
            s.assignments(taken=len(got), now=now)
            for server in range(2):
                for req in list(s._servers[server].outstanding):  # noqa: SLF001
                    if rng.random() < 0.5 and s.state(server) is not State.DOWN:
                        slot = s.on_reply(server, req, now)
                        if slot is not None:
                            got.extend(slot.indexes)
                if rng.random() < 0.05:
                    s.link(server, CONTROL, up=False, now=now)
                elif rng.random() < 0.3:
                    s.link(server, CONTROL, up=True, now=now)
                    s.heard(server, now)
            for server in s.hellos_due(now):
                s.grant(server, 2, now, readers=2, group=group)
            s.check(now)
        assert sorted(got) == list(range(n)), trial


def test_batch_size_plus_skipped_must_be_the_request() -> None:
    s = _sched(credits=(1,))
    (a,) = _running(s)
    slot = s.on_reply(0, a.req_id, now=0.1).slot
    slot.check_size("tcp://a:1", _reply(1, 4, 0))
    slot.check_size("tcp://a:1", _reply(1, 1, 3))  # short under --on-error skip
    with pytest.raises(ProtocolError, match=r"tcp://a:1: BATCH 1 has 3 samples and 0 skipped; "
                                            r"the request asked for 4"):
        slot.check_size("tcp://a:1", _reply(1, 3, 0))
    with pytest.raises(ProtocolError, match="asked for 4"):
        slot.check_size("tcp://a:1", _reply(1, 4, 1))
    with pytest.raises(ProtocolError, match="carries 2 batches; the request asked for 1"):
        slot.check_size("tcp://a:1", _reply(1, 4, 0, parts=(2, 2)))


def test_which_planned_samples_each_batch_of_a_reply_lacks() -> None:
    """``left_out`` runs of the request's samples, cut into each batch's own positions; a
    short batch the server said nothing about is not known (None)."""
    rows = np.array([[0, 0, 3], [1, 5, 6], [0, 7, 9], [2, 0, 4]], dtype=np.int64)
    parts = (wire.Part(2, wire.BatchTag()), wire.Part(1, wire.BatchTag()),
             wire.Part(1, wire.BatchTag()))  # batches of 4, 2 and 4 samples
    slot = Slot(0, 1, 1, 0, rows, wire.NO_TAG, False, 0.0, parts=parts)
    assert slot.left_out(_reply(1, 10, 0, parts=(4, 2, 4))) == [(), (), ()]
    said = replace(_reply(1, 7, 3, parts=(2, 2, 3)), left_out=(1, 3, 9, 10))
    assert slot.left_out(said) == [(1, 2), (), (3,)]
    assert slot.left_out(_reply(1, 7, 3, parts=(2, 2, 3))) == [None, (), None]
    alone = Slot(0, 1, 1, 0, rows[:2], wire.NO_TAG, False, 0.0)
    assert alone.left_out(replace(_reply(1, 3, 1), left_out=(3, 4))) == [(3,)]
    assert alone.left_out(_reply(1, 3, 1)) == [None]


def _reply(req_id: int, size: int, skipped: int, parts: tuple[int, ...] = ()) -> wire.BatchMsg:
    """A BATCH header of ``size`` samples of one int64 field."""
    return wire.BatchMsg(req_id, size, (wire.ArraySpec("x", "int64", (size,)),),
                         skipped=skipped, parts=parts)


def _rows(batches: Batches) -> list[list[list[int]]]:
    return [batches.rows(i).tolist() for i in range(len(batches))]


def test_an_appended_pass_is_requested_after_the_current_one_with_its_own_rows_and_tags(
        ) -> None:
    s = _sched(credits=(2, 2))
    current_pass = _plan(_batches(3), seed=7)
    assert s.follow(Demand(1, (current_pass,)))
    current = s.assignments(taken=0, now=0)
    assert [a.index for a in current] == [0, 1, 2]  # nothing after
    nxt = Batches.of([[Range(1, 10 * i, 10 * i + 2)] for i in range(4)])
    with pytest.raises(InternalError, match="generation 1"):
        s.follow(Demand(1, ()))  # a demand of the same generation never drops a wanted batch
    assert not s.follow(Demand(1, (current_pass, _plan(nxt, seed=7, epoch=1))))
    got = s.assignments(taken=0, now=0)
    assert [a.index for a in got] == [3]  # the depth (4) counts batches not taken
    for a in current + got:
        assert s.on_reply(a.server, a.req_id, now=1) is not None
    got += s.assignments(taken=3, now=1)
    assert [a.index for a in got] == [3, 4, 5, 6]
    assert [a.ranges.tolist() for a in got] == _rows(nxt)
    assert [a.tag for a in got] == [BatchTag(7, 1, i) for i in range(4)]
    assert s.assignments(taken=7, now=0) == [] and not s.full(7)


def test_a_demand_that_advances_drops_the_pass_taken_and_open_batches_are_asked_again(
        ) -> None:
    s = _sched(credits=(1, 1))
    a, b = _plan(_batches(2)), _plan(_batches(2), epoch=1)
    _start(s, 1, _batches(2))
    first = s.assignments(taken=0, now=0)
    assert [(x.server, x.index) for x in first] == [(0, 0), (1, 1)]
    assert not s.follow(Demand(1, (a, b)))  # read ahead: the same generation
    s.on_reply(0, first[0].req_id, now=1)
    s.lost(1, now=1)  # batch 1 of the first pass is open: asked again of server 0
    again = s.assignments(taken=1, now=1)
    assert [(x.server, x.index, x.retry) for x in again] == [(0, 1, True)]
    assert again[0].ranges.tolist() == [[0, 4, 8]] and again[0].tag == BatchTag(0, 0, 1)
    with pytest.raises(InternalError, match="batch 1 not received"):
        s.follow(Demand(1, (b,), first=2))  # no consumer begins b before batch 1 arrived
    s.on_reply(0, again[0].req_id, now=2)
    c = _plan(_batches(3), epoch=2)
    assert not s.follow(Demand(1, (b, c), first=2))  # b begun, the first pass dropped
    nxt = s.assignments(taken=2, now=2)
    assert [(x.index, x.tag) for x in nxt] == [(2, BatchTag(0, 1, 0))]


def test_the_depth_grows_when_a_server_joins_mid_epoch_and_never_shrinks() -> None:
    s = _sched(credits=(2,))
    current = _plan(_batches(8))
    assert s.follow(Demand(1, (current,)))
    assert len(s.assignments(taken=0, now=0.5)) == 2 and s.full(0)
    new = s.add("tcp://new:1", now=1)
    s.link(new, CONTROL, up=True, now=1)
    s.hellos_due(1)
    assert s.grant(new, 3, now=1, readers=3) and s.depth == 5
    assert [(a.server, a.index) for a in s.assignments(taken=0, now=1.1)] == [
        (new, 2), (new, 3), (new, 4)]
    assert not s.follow(Demand(1, (current, _plan(_batches(4))))) and s.depth == 5
    s.retire(new, now=2)
    s.lost(0, now=2)
    s.hellos_due(2)
    s.grant(0, 1, now=3, readers=1)  # joined again with fewer credits: the depth is the first's
    assert s.depth == 5


def test_a_pass_read_ahead_is_not_waited_for_until_the_consumer_begins_it() -> None:
    s = _sched(credits=(2,), timeout=5.0, grace=1000.0)
    a, b = _plan(_batches(2)), _plan(_batches(3), epoch=1)
    assert s.follow(Demand(1, (a,)))
    assert not s.follow(Demand(1, (a, b)))
    got = s.assignments(taken=0, now=0.0)
    assert [x.index for x in got] == [0, 1]
    for x in got:
        s.on_reply(0, x.req_id, now=0.0)
    assert [x.index for x in s.assignments(taken=2, now=0.0)] == [2, 3]  # read ahead
    s.link(0, CONTROL, up=False, now=1.0)
    for t in (1.0, 10.0, 100.0):  # the consumer finished its pass: nothing it needs waits
        s.check(t)
    with pytest.raises(InternalError, match="batch 2 not received"):
        s.follow(Demand(1, (b,), first=3))  # beyond the pass's start
    s.check(200.0)
    assert not s.follow(Demand(1, (b,), first=2))  # the consumer began the pass read ahead
    s.check(200.0)
    with pytest.raises(ServerUnavailable, match="no server usable for 5.1 s"):
        s.check(205.1)


def _late_sched(credits=(2, 2), request_timeout: float = 5.0, group: int = 1) -> Scheduler:
    s = Scheduler([f"tcp://s{i}:1" for i in range(len(credits))], timeout=100.0,
                  heartbeat_s=1.0, silent_s=3.0, grace=5.0, request_timeout=request_timeout,
                  group=group)
    for i, c in enumerate(credits):
        s.link(i, CONTROL, up=True, now=0.0)
        s.hellos_due(0.0)
        s.grant(i, c, now=0.0, readers=c, group=group)
    return s


def _alive(s: Scheduler, now: float) -> None:
    """Heartbeats answered: liveness never suspects anyone."""
    for i in s.heartbeats_due(now):
        s.heard(i, now)
    assert s.check(now) == []


def test_a_late_batch_is_asked_of_another_server_and_the_first_reply_wins() -> None:
    s = _late_sched()
    _start(s, 1, _batches(6), seed=9, epoch=2)
    first = s.assignments(taken=0, now=0.0)
    assert [(a.index, a.server) for a in first] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    for a in first[1:]:  # every batch but 0 is answered at once
        s.on_reply(a.server, a.req_id, now=0.1)
    _alive(s, 4.0)
    assert s.late(5.0) == [] and s.next_deadline(4.0) == pytest.approx(1.0)
    (late,) = s.late(5.01)
    assert (late.index, late.tag, late.failed, late.again) == (0, BatchTag(9, 2, 0), False,
                                                              False)
    assert [i for i, _ in late.asked] == [0] and late.asked[0][1] == pytest.approx(5.01)
    again = s.assignments(taken=3, now=5.01)
    assert [(a.index, a.server, a.retry) for a in again][0] == (0, 1, True)  # not server 0
    _alive(s, 5.5)
    assert s.state(0) is State.UP  # a late request says nothing of its server's liveness
    assert _key(s.on_reply(1, again[0].req_id, now=6.0)) == (1, 0, 4, True)
    assert s.on_reply(0, first[0].req_id, now=7.0) is None  # the late reply: discarded
    assert 0 not in [r.index for r in s.late(100.0)]  # done with: never late again


def test_a_late_batch_fails_when_no_other_server_can_take_it() -> None:
    s = _late_sched(credits=(2,))
    _start(s, 1, _batches(4), seed=9)
    a, b = s.assignments(taken=0, now=0.0)
    s.on_reply(0, b.req_id, now=1.0)
    _alive(s, 5.0)
    (late,) = s.late(5.01)
    assert (late.index, late.failed, late.again) == (0, True, False)
    assert s.on_reply(0, a.req_id, now=9.0) is None  # failed: its reply comes too late
    assert s.state(0) is State.UP


def test_a_late_batch_asked_again_fails_when_that_request_is_late_too() -> None:
    s = _late_sched()
    _start(s, 1, _batches(4))
    first = s.assignments(taken=0, now=0.0)
    for a in first[1:]:
        s.on_reply(a.server, a.req_id, now=0.1)
    assert not s.late(5.01)[0].failed
    (again, *_) = s.assignments(taken=3, now=6.0)  # sent 1 s after it was decided
    assert again.index == 0 and again.server == 1
    assert s.late(10.5) == []  # that request is 4.5 s old
    _alive(s, 10.5)
    assert s.next_deadline(10.5) == pytest.approx(0.5)
    (late,) = s.late(11.01)
    assert (late.index, late.failed, late.again) == (0, True, True)
    assert sorted(i for i, _ in late.asked) == [0, 1]


def test_a_late_batch_waiting_for_credit_fails_after_the_timeout() -> None:
    s = _late_sched(credits=(1, 1))
    _start(s, 1, _batches(4))
    a, b = s.assignments(taken=0, now=0.0)  # both servers hold one batch each, never answered
    late = s.late(5.01)
    assert [(x.index, x.failed) for x in late] == [(0, False), (1, False)]
    assert s.assignments(taken=0, now=5.01) == []  # no credit anywhere
    assert s.late(10.0) == []
    assert [(x.index, x.failed) for x in s.late(10.02)] == [(0, True), (1, True)]


def test_a_late_batch_waiting_for_the_credit_of_a_server_that_answers_is_not_failed() -> None:
    """Server 0 never answers; server 1 (one credit) goes on answering: the batches asked
    again queue behind one another for its credit, the last one sent 5.5 s after they were
    found late, and none fails while server 1 answers; once it stops, the one it holds fails
    ``request_timeout`` after it was sent."""
    s = _late_sched(credits=(3, 1))
    _start(s, 1, _batches(8))
    first = s.assignments(taken=0, now=0.0)
    hung = sorted(a.index for a in first if a.server == 0)
    (busy,) = [a for a in first if a.server == 1]
    assert len(hung) == 3
    s.on_reply(1, busy.req_id, now=0.5)
    (busy,) = s.assignments(taken=4, now=0.5)  # (taken: room in the depth)
    assert busy.server == 1 and not busy.retry
    _alive(s, 5.0)
    assert [(x.index, x.failed) for x in s.late(5.01)] == [(i, False) for i in hung]
    asked = []
    for t in (6.0, 9.0, 10.5):  # each reply frees the credit for the next batch asked again
        _alive(s, t)
        s.on_reply(1, busy.req_id, now=t)
        (busy,) = s.assignments(taken=4, now=t)
        assert busy.retry and busy.server == 1
        asked.append(busy.index)
        assert s.late(t) == []
        if t == 9.0:  # the last one waits past 5.01 + 5: server 1 sent a request at 9
            _alive(s, 10.2)
            assert s.late(10.2) == []
    assert asked == hung
    _alive(s, 15.0)
    assert s.late(15.0) == [] and s.next_deadline(15.0) == pytest.approx(0.5)
    assert [(x.index, x.failed, x.again) for x in s.late(15.51)] == [(hung[-1], True, True)]


def test_a_batch_asked_again_fails_on_time_while_other_servers_go_on_answering() -> None:
    """Batch 20 hangs at every server, the others are answered in 3 s and a slow consumer
    keeps the servers busy: asked again at 5.01, it fails ``request_timeout`` after that
    request, however many other requests the servers are sent meanwhile."""
    s = _late_sched(credits=(8, 8, 8))
    _start(s, 1, _batches(400))
    pending: list[tuple[float, int, int, range]] = []
    done: dict[int, float] = {}
    failed = None
    t, taken, last_take = 0.0, 0, 0.0
    while failed is None and t < 60:
        for a in s.assignments(taken=taken, now=t):
            if 20 not in a.indexes:
                pending.append((t + 3.0, a.server, a.req_id, a.indexes))
        for x in s.late(t):
            if x.index == 20 and x.failed:
                failed = t
        t = round(t + 0.01, 2)
        _alive(s, t)
        for p in [p for p in pending if p[0] <= t]:
            pending.remove(p)
            s.on_reply(p[1], p[2], now=t)
            done.update(dict.fromkeys(p[3], t))
        if taken in done and t - last_take >= 1.0:  # one batch a second, in order
            taken, last_take = taken + 1, t
    assert failed is not None and 10.0 < failed <= 10.05, failed


def test_a_lost_server_s_batch_fails_when_every_other_server_holds_its_credit_unanswered(
        ) -> None:
    """Server 0 goes silent (lost: its batch is queued to be asked again); server 1 answers
    heartbeats but never its request, so its one credit never comes back: the queued batch
    fails ``request_timeout`` after it was queued, not never (the consumer would hang on it),
    and batch 1 fails too; while a server answers, a queued batch waits."""
    s = _late_sched(credits=(1, 1))
    _start(s, 1, _batches(2))
    assert [(a.index, a.server) for a in s.assignments(taken=0, now=0.0)] == [(0, 0), (1, 1)]
    failed, t = {}, 0.0
    while len(failed) < 2 and t < 60:
        t = round(t + 0.5, 2)
        for i in s.heartbeats_due(t):
            if i == 1:
                s.heard(i, t)
        s.check(t)
        failed.update((x.index, (t, x.queued)) for x in s.late(t) if x.failed)
        assert s.assignments(taken=0, now=t) == []
    assert s.state(0) is State.DOWN and s.state(1) is State.UP
    assert failed[1] == (5.5, False)
    when, queued = failed[0]
    assert queued and 8.0 <= when <= 10.0, failed  # suspect at 3.5, queued then: + 5 s


def test_no_batch_is_looked_for_late_before_the_oldest_request_is_request_timeout_old() -> None:
    """The deadline is then that moment (here a request of an abandoned generation, whose
    batch is never late); from it on, the exact one."""
    s = Scheduler(["tcp://s0:1"], timeout=100.0, heartbeat_s=50.0, silent_s=90.0, grace=5.0,
                  request_timeout=5.0)
    s.link(0, CONTROL, up=True, now=0.0)
    s.hellos_due(0.0)
    s.grant(0, 4, now=0.0, readers=4)
    _start(s, 1, _batches(8))
    old = s.assignments(taken=0, now=0.0)
    _start(s, 2, _batches(8))
    for a in old[1:]:
        assert s.on_reply(0, a.req_id, now=2.0) is None  # of the abandoned generation
    assert [a.index for a in s.assignments(taken=0, now=3.0)] == [0, 1, 2]
    assert s.late(4.0) == [] and s.next_deadline(4.0) == pytest.approx(1.0)  # old[0]: 5 s
    assert s.late(5.5) == [] and s.next_deadline(5.5) == pytest.approx(2.5)  # the new: 5 s
    assert s.late(7.99) == []
    assert [x.index for x in s.late(8.01)] == [0, 1, 2]


def test_no_request_timeout_means_no_late_batch() -> None:
    s = _late_sched(request_timeout=float("inf"))
    _start(s, 1, _batches(4))
    s.assignments(taken=0, now=0.0)
    assert s.late(1e9) == []


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("seed", range(10))
def test_late_requests_at_random_keep_every_batch_once_answered_or_failed(seed: int,
                                                                          group: int) -> None:
    """Three servers answer after random delays, some far past the request timeout: every
    batch is accepted once or fails once, never both, and no server is taken for dead (also
    with requests of up to ``group`` batches)."""
    rng = __import__("random").Random(seed)
    s = _late_sched(credits=(2, 1, 2), request_timeout=2.0, group=group)
    n = 30
    _start(s, 1, _batches(n))
    due: dict[tuple[int, int], float] = {}  # (server, req_id) -> when its reply comes
    accepted: list[int] = []
    failed: list[int] = []
    now, reasked = 0.0, 0
    while len(accepted) + len(failed) < n:
        now += 0.1
        _alive(s, now)
        for a in s.assignments(taken=len(accepted) + len(failed), now=now):
            due[(a.server, a.req_id)] = now + rng.choice([0.2, 0.5, 1.0, 3.0, 9.0])
        for (server, req), when in sorted(due.items(), key=lambda kv: kv[1]):
            if when <= now:
                del due[(server, req)]
                slot = s.on_reply(server, req, now)
                if slot is not None:
                    accepted.extend(slot.indexes)
        late = s.late(now)
        reasked += sum(not x.failed for x in late)
        failed += [x.index for x in late if x.failed]
        assert now < 500, (accepted, failed)
    assert sorted(accepted + failed) == list(range(n))
    assert reasked > 0
    assert all(s.state(i) is State.UP for i in range(3))
