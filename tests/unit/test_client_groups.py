"""Requests of several batches (the scheduler's ``group``): runs within a pass and the depth,
sized from the first batch, and every batch still accepted, late, failed or asked again on
its own. Pure, with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.client.cursor import Pass
from dataflow.client.passes import PassPlan
from dataflow.client.scheduler import CONTROL, Scheduler
from dataflow.client.stream import Demand
from dataflow.errors import InternalError
from dataflow.plan import Batches, Range
from dataflow.wire import BatchTag, Part


def _batches(n: int, shard: int = 0) -> Batches:
    return Batches.of([[Range(shard, 4 * i, 4 * i + 4)] for i in range(n)])


def _sched(credits=(2,), group: int = 3, group_bytes: int | None = None,
           request_timeout: float = float("inf"),
           shared_bytes: int | None = None) -> Scheduler:
    s = Scheduler([f"tcp://s{i}:1" for i in range(len(credits))], timeout=100.0,
                  heartbeat_s=1.0, silent_s=3.0, grace=5.0, request_timeout=request_timeout,
                  group=group, group_bytes=group_bytes, shared_bytes=shared_bytes)
    for i, c in enumerate(credits):
        s.link(i, CONTROL, up=True, now=0.0)
        s.hellos_due(0.0)
        s.grant(i, c, now=0.0, readers=c, group=group)
    return s


def _alive(s: Scheduler, now: float) -> None:
    for i in s.heartbeats_due(now):
        s.heard(i, now)


def test_a_request_carries_a_run_of_one_pass_within_the_depth() -> None:
    s = _sched(credits=(2,), group=3)
    assert s.depth == 6
    passes = (PassPlan(Pass(0, 0), _batches(5), 7), PassPlan(Pass(1, 0), _batches(4, 1), 7))
    s.follow(Demand(1, passes))
    a, b = s.assignments(taken=0, now=0.0)
    assert (list(a.indexes), list(b.indexes)) == ([0, 1, 2], [3, 4])  # not into the next pass
    req = a.request()
    assert req.tag == BatchTag() and req.ranges.tolist() == [[0, 0, 4], [0, 4, 8], [0, 8, 12]]
    assert req.parts == (Part(1, BatchTag(7, 0, 0)), Part(1, BatchTag(7, 0, 1)),
                         Part(1, BatchTag(7, 0, 2)))
    assert s.on_reply(0, a.req_id, now=0.1).indexes == (0, 1, 2)
    # 5 requested and none taken: room for 1 of the next run of 3: it waits (a consumer
    # taking batches one by one would otherwise make every request one batch)
    assert s.assignments(taken=0, now=0.1) == [] and s.full(0) and not s.full(2)
    (c,) = s.assignments(taken=2, now=0.1)
    assert list(c.indexes) == [5, 6, 7] and c.request().parts[0].tag == BatchTag(7, 1, 0)
    s.on_reply(0, b.req_id, now=0.2)
    (d,) = s.assignments(taken=3, now=0.2)
    assert list(d.indexes) == [8]  # the rest of the pass: a whole run
    s.on_reply(0, c.req_id, now=0.3)
    assert s.assignments(taken=3, now=0.3) == []  # the demand ends at 9


def test_requests_are_sized_once_from_the_first_batch() -> None:
    s = _sched(credits=(2, 2), group=8, group_bytes=1000)
    assert (s.group, s.depth) == (1, 4)
    assert s.sized(200) and (s.group, s.depth) == (5, 20)
    assert not s.sized(10) and s.group == 5  # once
    small = _sched(group=8, group_bytes=1000)
    assert small.sized(10) and small.group == 8
    for nbytes in (251, 5000):  # fewer than 4 fit: alone
        big = _sched(credits=(2,), group=8, group_bytes=1000)
        assert not big.sized(nbytes) and (big.group, big.depth) == (1, 2)
    fixed = _sched(credits=(2,), group=4)
    assert not fixed.sized(1) and (fixed.group, fixed.depth) == (4, 8)
    with pytest.raises(InternalError):
        _sched(group=0)
    with pytest.raises(InternalError):
        _sched(group=8, group_bytes=1000, shared_bytes=0)


def test_while_a_server_shares_memory_requests_are_sized_to_its_slot() -> None:
    """Sized from 200-byte batches: 5 a request over TCP (1,000 bytes), 1 while a server's
    replies land in shared memory (400 bytes: fewer than 4 fit), 5 again once none does; the
    depth never shrinks."""
    s = _sched(credits=(1, 1), group=8, group_bytes=1000, shared_bytes=400)
    assert s.sized(200) and (s.group, s.depth) == (5, 10)
    s.lost(0, now=1.0)
    s.link(0, CONTROL, up=True, now=1.0)
    s.hellos_due(100.0)
    s.grant(0, 1, now=100.0, readers=1, group=8, shared=True)  # joins again, sharing
    assert (s.group, s.depth) == (1, 10)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(12), 7),)))
    assert [len(slot.indexes) for slot in s.assignments(taken=0, now=100.0)] == [1, 1]
    s.lost(0, now=101.0)
    s.link(0, CONTROL, up=True, now=101.0)
    s.hellos_due(300.0)
    s.grant(0, 1, now=300.0, readers=1, group=8)  # joins again over TCP
    assert (s.group, s.depth) == (5, 10)
    shared = _sched(credits=(1,), group=8, group_bytes=1000, shared_bytes=400)
    shared.lost(0, now=1.0)
    shared.link(0, CONTROL, up=True, now=1.0)
    shared.hellos_due(100.0)
    shared.grant(0, 1, now=100.0, readers=1, group=8, shared=True)
    assert not shared.sized(200) and (shared.group, shared.depth) == (1, 1)  # sized after


def test_a_late_request_of_several_batches_is_asked_again_batch_by_batch() -> None:
    """Its only server may be asked for each batch alone; the first reply of each batch wins,
    so the late request's reply, when it comes, hands over only the batches still open."""
    s = _sched(credits=(2,), group=2, request_timeout=5.0)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(4)),)))
    a, b = s.assignments(taken=0, now=0.0)
    assert s.on_reply(0, b.req_id, now=1.0).indexes == (2, 3)
    _alive(s, 5.01)
    late = s.late(5.01)
    assert [(x.index, x.failed, x.tag) for x in late] == [(0, False, BatchTag(0, 0, 0)),
                                                          (1, False, BatchTag(0, 0, 1))]
    (again,) = s.assignments(taken=0, now=5.01)  # one credit free: batch 0 alone
    assert (list(again.indexes), again.retry, again.server) == ([0], True, 0)
    assert s.on_reply(0, again.req_id, now=6.0).indexes == (0,)
    (again1,) = s.assignments(taken=0, now=6.0)
    assert list(again1.indexes) == [1] and again1.retry
    assert s.on_reply(0, a.req_id, now=7.0).indexes == (1,)  # the late reply: batch 1 only
    assert s.on_reply(0, again1.req_id, now=7.5) is None  # a duplicate
    _alive(s, 20.0)
    assert s.late(20.0) == []


def test_a_failed_request_of_several_batches_is_asked_again_batch_by_batch() -> None:
    s = _sched(credits=(1, 1), group=3)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(6)),)))
    a, b = s.assignments(taken=0, now=0.0)
    s.again(s.on_reply(a.server, a.req_id, now=0.1), now=0.1)
    got = s.assignments(taken=0, now=0.1)
    assert [(list(x.indexes), x.retry) for x in got] == [([0], True)]
    assert got[0].server == a.server  # it holds none of them alone
    s.on_reply(got[0].server, got[0].req_id, now=0.2)
    (nxt,) = s.assignments(taken=0, now=0.2)
    assert (list(nxt.indexes), nxt.retry) == ([1], True)


def test_a_lost_server_s_requests_of_several_batches_go_to_the_others_batch_by_batch() -> None:
    s = _sched(credits=(1, 1), group=3)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(6)),)))
    a, b = s.assignments(taken=0, now=0.0)
    s.lost(a.server, now=1.0)
    assert s.assignments(taken=0, now=1.0) == []  # the other server has no credit free
    assert s.on_reply(b.server, b.req_id, now=1.1).indexes == tuple(b.indexes)
    (again,) = s.assignments(taken=0, now=1.1)
    assert list(again.indexes) == [0] and again.retry and again.server == b.server
    s.on_reply(b.server, again.req_id, now=1.2)
    (nxt,) = s.assignments(taken=0, now=1.2)
    assert list(nxt.indexes) == [1] and nxt.retry
    assert np.array_equal(nxt.ranges, np.array([[0, 4, 8]]))


def test_a_server_s_group_bounds_its_requests() -> None:
    """A server that takes fewer batches a request (its INDEX's ``group``) gets shorter runs."""
    s = Scheduler(["tcp://s0:1", "tcp://s1:1"], timeout=100.0, heartbeat_s=1.0, silent_s=3.0,
                  grace=5.0, group=4)
    for i, group in enumerate((4, 2)):
        s.link(i, CONTROL, up=True, now=0.0)
        s.hellos_due(0.0)
        s.grant(i, 1, now=0.0, readers=1, group=group)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(12)),)))
    a, b = s.assignments(taken=0, now=0.0)
    assert [(x.server, list(x.indexes)) for x in (a, b)] == [(0, [0, 1, 2, 3]), (1, [4, 5])]
