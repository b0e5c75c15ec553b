"""The consumer <-> I/O thread hand-off: generations, bounded delivery, failures, wake-ups."""

from __future__ import annotations

import threading

import pytest

from dataflow.client.handoff import COUNTERS, Extend, Failed, Handoff, StartEpoch, Stop, Tags
from dataflow.errors import (
    DataflowError,
    InternalError,
    LoaderClosedError,
    RemoteError,
    ServerUnavailable,
)
from dataflow.plan import Batches
from dataflow.transform import global_batch_index
from dataflow.wire import NO_TAG, BatchTag, ErrorKind

NONE = Batches.of([])


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


def test_start_discards_older_generations_and_queues_the_command() -> None:
    h, waker = _handoff()
    h.start(StartEpoch(1, NONE, 0))
    assert h.deliver(1, 0, "a")
    h.start(StartEpoch(2, NONE, 0))
    assert not h.deliver(1, 1, "late")  # stale on arrival
    assert h.deliver(2, 0, "b")
    assert h.take(2, 0.01, _alive) == (0, "b")
    assert [c.gen for c in h.commands() if isinstance(c, StartEpoch)] == [1, 2]
    assert h.commands() == [] and waker.count == 2


def test_many_abandoned_generations_never_overflow() -> None:
    h, _ = _handoff(capacity=2)
    for gen in range(1, 50):
        h.start(StartEpoch(gen, NONE, 0))
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
    h.start(StartEpoch(1, NONE, 0))
    h.deliver(1, 0, "a")
    with pytest.raises(InternalError, match="capacity 1"):
        h.deliver(1, 1, "b")


def test_taken_counts_the_current_generation_and_wakes_only_when_asked() -> None:
    h, waker = _handoff(capacity=4)
    h.start(StartEpoch(1, NONE, 0))
    for i in range(3):
        h.deliver(1, i, str(i))
    before = waker.count
    h.take(1, 0.01, _alive)
    assert waker.count == before and h.taken(1, window_full=True) == 1
    h.take(1, 0.01, _alive)
    assert waker.count == before + 1 and h.taken(1, window_full=False) == 2
    h.take(1, 0.01, _alive)
    assert waker.count == before + 1
    assert h.taken(0, window_full=False) == 0


def test_failure_reaches_a_waiting_consumer_and_stays() -> None:
    h, _ = _handoff()
    h.start(StartEpoch(1, NONE, 0))
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
    assert quiet.commands() == []
    quiet.command(Stop())
    assert quiet.commands() == [Stop()]


@pytest.mark.parametrize("world, start", [(1, 0), (3, 0), (2, 12)])
def test_tags_give_each_rank_its_global_batches(world: int, start: int) -> None:
    tags = [Tags(9, 4, global_batch_index(start=start, batch_size=4, world_size=world, rank=r,
                                          index=0), world) for r in range(world)]
    got = sorted(t.of(j) for t in tags for j in range(5))
    assert got == [BatchTag(9, 4, start // 4 + g) for g in range(5 * world)]
    assert StartEpoch(1, NONE, 0).tags.of(7) == BatchTag(0, 0, 7) != NO_TAG


def test_an_extension_is_a_command_of_the_same_generation_and_takes_count_on() -> None:
    h, waker = _handoff(capacity=2)
    h.start(StartEpoch(1, NONE, 0))
    assert h.consumed(1) == 0 and h.consumed(2) is None and h.window == 2
    assert h.deliver(1, 0, "a") and h.take(1, 0.01, _alive) == (0, "a")
    h.command(Extend(1, NONE, Tags(0, 1, 0, 1)))
    assert [type(c) for c in h.commands()] == [StartEpoch, Extend] and waker.count == 2
    assert h.deliver(1, 1, "next epoch's first") and h.take(1, 0.01, _alive)[0] == 1
    assert h.consumed(1) == 2
    h.start(StartEpoch(2, NONE, 0))
    assert h.consumed(1) is None and h.consumed(2) == 0


def test_a_failed_batch_raises_in_its_place_and_a_dropped_generation_drops_it() -> None:
    h, _ = _handoff(capacity=3)
    h.start(StartEpoch(1, NONE, 0))
    h.deliver(1, 0, "a")
    h.deliver(1, 1, Failed(RemoteError("tcp://x:1", ErrorKind.READ_FAILED, "boom")))
    h.start(StartEpoch(2, NONE, 0))  # the loop went elsewhere: nothing is raised
    h.deliver(2, 0, "b")
    error = RemoteError("tcp://x:1", ErrorKind.READ_FAILED, "bad shard")
    h.deliver(2, 1, Failed(error))
    h.deliver(2, 2, "c")
    assert h.take(2, 0.01, _alive) == (0, "b") and not h.failed
    h.commands()
    with pytest.raises(RemoteError, match="bad shard"):
        h.take(2, 0.01, _alive)
    assert h.failed and h.failure is error
    assert h.commands() == [Stop()]  # the I/O thread says BYE and ends
    with pytest.raises(RemoteError, match="bad shard"):  # the loader is failed from then on
        h.take(2, 0.01, _alive)


def test_close_makes_a_waiting_and_every_later_take_raise_loader_closed() -> None:
    h, _ = _handoff()
    h.start(StartEpoch(1, NONE, 0))
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
