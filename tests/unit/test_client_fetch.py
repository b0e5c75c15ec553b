"""Fetching the consumer's demand: request order, depth, re-requests, exactly-once acceptance
and following a demand that grows and advances (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.client.cursor import Pass
from dataflow.client.fetch import Fetch
from dataflow.client.passes import PassPlan
from dataflow.client.slots import Slot
from dataflow.client.stream import Demand
from dataflow.errors import InternalError
from dataflow.plan import Batches
from dataflow.wire import BatchTag


def _pass(n: int, epoch: int = 0) -> PassPlan:
    return PassPlan(Pass(epoch, 0), Batches.of([[(epoch, i, i + 1)] for i in range(n)]), seed=5)


def _slot(gen: int, index: int) -> Slot:
    return Slot(0, 1, gen, index, np.zeros((1, 3), dtype=np.int64), BatchTag(), False, 0.0)


def _request(f: Fetch, taken: int, depth: int) -> list[int]:
    """Claim every batch due now; returns their indexes."""
    out = []
    while (index := f.peek(taken, depth)) is not None:
        f.claim(index)
        out.append(index)
    return out


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_batches_are_requested_in_order_at_most_depth_ahead_of_the_consumer(depth: int) -> None:
    f = Fetch(Demand(1, (_pass(6),)))
    got = _request(f, taken=0, depth=depth)
    assert got == list(range(min(depth, 6))) and f.open == set(got)
    assert f.full(0, depth) == (depth < 6)
    for index in got:
        assert f.accept(_slot(1, index))
    assert _request(f, taken=len(got), depth=depth) == list(range(len(got),
                                                                 min(2 * depth, 6)))
    _request(f, taken=6, depth=depth)  # the consumer took them all: the rest goes out
    assert f.next_request == 6 and not f.full(6, depth) and f.peek(6, depth) is None


def test_batches_to_request_again_come_first_lowest_first_and_once() -> None:
    f = Fetch(Demand(1, (_pass(8),)))
    assert _request(f, 0, 4) == [0, 1, 2, 3]
    f.requeue([3, 1, 1, 7], now=0.0)  # 7 was never requested: not open, not queued
    assert f.peek(0, 4) == 1 and f.retrying(1)
    assert f.claim(1) and f.peek(0, 4) == 3 and f.claim(3)  # re-requests stay open
    assert f.peek(0, 4) is None and f.open == {0, 1, 2, 3}
    assert f.accept(_slot(1, 2))
    f.requeue([2], now=0.0)  # answered meanwhile: not asked again
    assert f.peek(0, 4) is None
    f.again(2, now=0.0)  # its reply could not be delivered: open and asked again
    assert f.peek(0, 4) == 2 and f.claim(2) and 2 in f.open


def test_only_the_first_reply_for_an_open_batch_of_this_generation_is_accepted() -> None:
    f = Fetch(Demand(3, (_pass(4),)))
    _request(f, 0, 4)
    f.late[1] = 9.0
    assert not f.accept(_slot(2, 0))  # another generation
    assert f.accept(_slot(3, 0)) and not f.accept(_slot(3, 0))  # then a duplicate
    f.close(1)  # failed: its reply, when it comes, is discarded
    assert not f.accept(_slot(3, 1)) and f.late == {}


def test_a_demand_that_grows_is_followed_and_only_the_consumer_s_pass_is_waited_for() -> None:
    current, ahead = _pass(3), _pass(2, epoch=1)
    f = Fetch(Demand(1, (current,)))
    assert _request(f, 0, 4) == [0, 1, 2] and f.waiting(0, 4)
    f.follow(Demand(1, (current, ahead)))
    assert _request(f, 0, 4) == [3]
    rows, tag = f.batch(3)
    assert rows.tolist() == [[1, 0, 1]] and tag == BatchTag(5, 1, 0)
    for index in range(4):
        f.accept(_slot(1, index))
    assert not f.waiting(3, 4)  # only the pass read ahead is left: nothing the consumer needs
    f.follow(Demand(1, (ahead,), first=3))  # the consumer began it
    assert f.waiting(3, 4) and _request(f, 3, 4) == [4]
    assert f.batch(4)[1] == BatchTag(5, 1, 1)
    with pytest.raises(InternalError, match="outside generation 1"):
        f.batch(2)  # the pass taken is dropped


@pytest.mark.parametrize("demand", [
    Demand(2, (_pass(3), _pass(2))),  # another generation
    Demand(1, (_pass(2),), first=3),  # drops batch 2, still open
    Demand(1, (_pass(2),)),  # ends before a batch wanted
    Demand(1, (), first=0),
])
def test_a_demand_that_does_not_follow_raises(demand: Demand) -> None:
    f = Fetch(Demand(1, (_pass(3), _pass(2))))
    assert _request(f, 0, 3) == [0, 1, 2]
    f.accept(_slot(1, 0))
    f.accept(_slot(1, 1))
    with pytest.raises(InternalError, match="not received"):
        f.follow(demand)


def test_a_run_waits_until_it_fits_whole_within_the_depth() -> None:
    """With runs of 3: a consumer taking one batch frees room for one; the next request waits
    for a whole run, or for the rest of the pass when that is shorter."""
    f = Fetch(Demand(1, (_pass(10),)))
    assert f.peek(0, 6, 3) == 0 and f.run(0, 0, 6, 3) == 3
    f.claim(0, 3)
    assert f.peek(0, 6, 3) == 3 and f.run(3, 0, 6, 3) == 3
    f.claim(3, 3)
    for taken in (0, 1, 2):  # room for fewer than the next run of 3: the third take frees it
        assert f.peek(taken, 6, 3) is None and f.unblocked_at(taken, 6, 3) == 3
    assert f.peek(1, 6, 1) == 6  # runs of one: as soon as a batch is taken
    assert f.peek(3, 6, 3) == 6 and f.unblocked_at(3, 6, 3) is None
    f.claim(6, 3)
    assert f.peek(7, 6, 3) == 9 and f.run(9, 7, 6, 3) == 1  # the rest of the pass: 1
