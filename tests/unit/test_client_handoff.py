"""The consumer <-> I/O thread hand-off: demands and generations, bounded delivery, failures,
wake-ups."""

from __future__ import annotations

import threading

import pytest

from dataflow.client.cursor import Pass
from dataflow.client.handoff import COUNTERS, Failed, Handoff
from dataflow.client.passes import PassPlan
from dataflow.client.stream import Demand
from dataflow.errors import (
    DataflowError,
    InternalError,
    LoaderClosedError,
    RemoteError,
    ServerUnavailable,
)
from dataflow.plan import Batches
from dataflow.wire import ErrorKind

NONE = PassPlan(Pass(0, 0), Batches.of([]))


def _demand(gen: int) -> Demand:
    return Demand(gen, (NONE,))


class _Waker:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _handoff(capacity: int = 2) -> tuple[Handoff[str], _Waker]:
    waker = _Waker()
    h: Handoff[str] = Handoff(waker)
    h.set_capacity(capacity)
    return h, waker


def _alive() -> bool:
    return True


def test_a_new_generation_discards_older_ones_and_the_io_thread_sees_the_latest() -> None:
    h, waker = _handoff()
    assert h.wanted() == Demand()
    h.want(_demand(1))
    assert h.deliver(1, 0, "a")
    h.want(_demand(2))
    assert not h.deliver(1, 1, "late")  # stale on arrival
    assert h.deliver(2, 0, "b")
    assert h.take(2, 0.01, _alive) == (0, "b")
    assert h.wanted() == _demand(2) and waker.count == 2
    with pytest.raises(InternalError, match="generation 1 after 2"):
        h.want(_demand(1))


def test_many_abandoned_generations_never_overflow() -> None:
    h, _ = _handoff(capacity=2)
    for gen in range(1, 50):
        h.want(_demand(gen))
        h.deliver(gen, 0, f"g{gen}")
        h.deliver(gen, 1, f"g{gen}")
    assert h.take(49, 0.01, _alive) == (0, "g49")
    assert h.stats() == {"delivered": 98, "discarded": 96, "waiting": 1,
                         **dict.fromkeys(COUNTERS, 0)}


def test_io_thread_counters_add_up() -> None:
    h, _ = _handoff(capacity=2)
    h.count("skipped", 3)
    h.count("skipped")
    h.count("servers_lost")
    stats = h.stats()
    assert stats["skipped"] == 4 and stats["servers_lost"] == 1 and stats["rejoined"] == 0


def test_delivery_beyond_capacity_is_loud() -> None:
    h, _ = _handoff(capacity=1)
    h.want(_demand(1))
    h.deliver(1, 0, "a")
    with pytest.raises(InternalError, match="capacity 1"):
        h.deliver(1, 1, "b")


def test_taken_counts_the_current_generation_and_wakes_only_when_asked() -> None:
    h, waker = _handoff(capacity=4)
    h.want(_demand(1))
    for i in range(3):
        h.deliver(1, i, str(i))
    before = waker.count
    h.take(1, 0.01, _alive)
    assert waker.count == before and h.taken(1, wake_at=2) == 1
    h.take(1, 0.01, _alive)
    assert waker.count == before + 1 and h.taken(1) == 2
    h.take(1, 0.01, _alive)
    assert waker.count == before + 1
    assert h.taken(0) == 0
    for i in range(3, 6):
        h.deliver(1, i, str(i))
    assert h.taken(1, wake_at=5) == 3  # the take that gets to 5 wakes, not those before
    h.take(1, 0.01, _alive)
    assert waker.count == before + 1
    h.take(1, 0.01, _alive)
    assert waker.count == before + 2


def test_failure_reaches_a_waiting_consumer_and_stays() -> None:
    h, _ = _handoff()
    h.want(_demand(1))
    got: list[BaseException] = []

    def consume() -> None:
        try:
            h.take(1, 0.05, _alive)
        except DataflowError as e:
            got.append(e)

    t = threading.Thread(target=consume)
    t.start()
    h.fail(ServerUnavailable("tcp://a:1", "gone"))
    h.fail(ServerUnavailable("tcp://b:1", "second"))
    t.join(5)
    assert not t.is_alive() and "tcp://a:1" in str(got[0]) and h.failed
    with pytest.raises(ServerUnavailable, match="tcp://a:1"):
        h.hello(0.01, _alive)


def test_foreign_exceptions_are_wrapped_and_a_dead_thread_is_noticed() -> None:
    h, _ = _handoff()
    h.fail(KeyError("x"))
    with pytest.raises(InternalError, match="KeyError") as info:
        h.take(0, 0.01, _alive)
    assert isinstance(info.value.__cause__, KeyError)
    quiet, _ = _handoff()
    with pytest.raises(InternalError, match="I/O thread has stopped"):
        quiet.take(0, 0.01, lambda: False)
    assert not quiet.stopping
    quiet.close()
    assert quiet.stopping


def test_a_demand_of_the_same_generation_keeps_its_batches_and_takes_count_on() -> None:
    h, waker = _handoff(capacity=2)
    h.want(_demand(1))
    assert h.taken(1) == 0 and h.capacity == 2
    assert h.deliver(1, 0, "a") and h.take(1, 0.01, _alive) == (0, "a")
    assert h.deliver(1, 1, "b")
    ahead = Demand(1, (NONE, PassPlan(Pass(1, 0), Batches.of([]))))
    h.want(ahead)  # the next pass read ahead: the same generation
    assert h.wanted() is ahead and waker.count == 2
    assert h.take(1, 0.01, _alive) == (1, "b")
    assert h.deliver(1, 2, "next epoch's first") and h.take(1, 0.01, _alive)[0] == 2
    assert h.taken(1) == 3
    h.want(_demand(2))
    assert h.taken(1) == 0 and h.taken(2) == 0


def test_a_failed_batch_raises_in_its_place_and_a_dropped_generation_drops_it() -> None:
    h, _ = _handoff(capacity=3)
    h.want(_demand(1))
    h.deliver(1, 0, "a")
    h.deliver(1, 1, Failed(RemoteError("tcp://x:1", ErrorKind.READ_FAILED, "boom")))
    h.want(_demand(2))  # the loop went elsewhere: nothing is raised
    h.deliver(2, 0, "b")
    error = RemoteError("tcp://x:1", ErrorKind.READ_FAILED, "bad shard")
    h.deliver(2, 1, Failed(error))
    h.deliver(2, 2, "c")
    assert h.take(2, 0.01, _alive) == (0, "b") and not h.failed and not h.stopping
    with pytest.raises(RemoteError, match="bad shard"):
        h.take(2, 0.01, _alive)
    assert h.failed and h.failure is error
    assert h.stopping  # the I/O thread says BYE and ends
    with pytest.raises(RemoteError, match="bad shard"):  # the loader is failed from then on
        h.take(2, 0.01, _alive)


def test_peek_shows_the_next_batch_of_the_current_generation_without_taking_it() -> None:
    h, _ = _handoff(capacity=3)
    h.want(_demand(1))
    assert h.peek(1) is None  # nothing here: never waits
    h.deliver(1, 0, "a")
    h.deliver(1, 1, Failed(RemoteError("tcp://x:1", ErrorKind.READ_FAILED, "boom")))
    assert h.peek(1) == (0, "a") and h.peek(1) == (0, "a") and h.peek(0) is None
    assert h.take(1, 0.01, _alive) == (0, "a")
    assert h.peek(1) is None  # a failed batch is raised by take, at its turn
    h.want(_demand(2))
    h.deliver(2, 0, "b")
    assert h.peek(1) is None and h.peek(2) == (0, "b")
    assert h.stats()["waiting"] == 1 and h.take(2, 0.01, _alive) == (0, "b")


def test_close_makes_a_waiting_and_every_later_take_raise_loader_closed() -> None:
    h, _ = _handoff()
    h.want(_demand(1))
    got: list[BaseException] = []

    def consume() -> None:
        try:
            h.take(1, 60.0, _alive)  # waits far longer than the test: close must wake it
        except DataflowError as e:
            got.append(e)

    t = threading.Thread(target=consume)
    t.start()
    h.close()
    t.join(5)
    assert not t.is_alive() and isinstance(got[0], LoaderClosedError)
    h.fail(ServerUnavailable("tcp://a:1", "gone"))  # a failure after it: still closed
    with pytest.raises(LoaderClosedError) as info:
        h.take(1, 0.01, lambda: False)
    assert isinstance(info.value.__cause__, ServerUnavailable)
