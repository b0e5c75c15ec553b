"""The consumer's stream of batches, pure: peeks, breaks, set_epoch, resume, reading ahead and
several iterators, against a reference that plans every pass cold."""

from __future__ import annotations

import itertools
import random
import threading

import pytest

from dataflow.client.cursor import EpochCursor, Pass
from dataflow.client.passes import PassPlan, after
from dataflow.client.planner import Planner
from dataflow.client.stream import Demand, Stream
from dataflow.errors import InternalError, StaleIteratorError
from dataflow.plan import Batches
from dataflow.wire import BatchTag

TOTAL = 40  # samples per epoch
BATCH = 4  # samples per batch: 10 batches per epoch


def _plan(span: Pass) -> PassPlan:
    """A pass's plan: one batch per ``BATCH`` samples left; batch ``i`` is tagged with its
    global batch index, so a batch names its epoch and place."""
    n = -(-(TOTAL - span.start) // BATCH)
    rows = Batches.of([[(0, span.start + BATCH * i, span.start + BATCH * (i + 1))]
                       for i in range(n)])
    return PassPlan(span, rows, seed=0, first=span.start // BATCH)


def _cold(span: Pass) -> list[BatchTag]:
    planned = _plan(span)
    return [planned.tag(i) for i in range(len(planned))]


class Loop:
    """A consumer of a :class:`Stream` with an I/O thread that has every batch at once."""

    def __init__(self, *, read_ahead: bool = True, depth: int = 3,
                 planner: Planner[PassPlan] | None = None) -> None:
        self.published: list[Demand] = []
        self.stream = Stream(EpochCursor(TOTAL), planner or _plan, self.published.append,
                             read_ahead=read_ahead,
                             prepare=planner.prepare if planner is not None else None)
        self.depth = depth

    def take(self, token: object) -> BatchTag | None:
        """One ``next()`` of iterator ``token``: the batch's tag, or None at its end."""
        index = self.stream.next(token)
        if index is None:
            return None
        tag = self.stream.demand.batch(index)[1]
        self.stream.took(index, self.depth)
        return tag

    def read(self, token: object, k: int | None = None) -> list[BatchTag]:
        """``k`` batches of iterator ``token`` (None: until its end, StopIteration included)."""
        got: list[BatchTag] = []
        while k is None or len(got) < k:
            tag = self.take(token)
            if tag is None:
                break
            got.append(tag)
        return got

    def gens(self) -> int:
        return len({d.gen for d in self.published})


@pytest.mark.parametrize("read_ahead, depth",
                         list(itertools.product((True, False), (1, 3, 50))))
def test_consecutive_passes_are_the_epochs_in_turn_read_on_in_one_generation(
        read_ahead: bool, depth: int) -> None:
    loop = Loop(read_ahead=read_ahead, depth=depth)
    for epoch in range(4):
        assert loop.read(loop.stream.open()) == _cold(Pass(epoch, 0))
    # reading ahead, every epoch after the first continues the stream: one generation
    assert loop.gens() == (1 if read_ahead else 4)
    if read_ahead:
        assert [len(d.passes) for d in loop.published][:2] == [1, 2]
        assert loop.stream.demand.passes[1].span == Pass(4, 0)  # epoch 4 read ahead


@pytest.mark.parametrize("depth", (1, 3, 50))
def test_the_next_pass_is_appended_once_the_consumer_is_within_depth_of_the_end(
        depth: int) -> None:
    loop = Loop(depth=depth)
    token = loop.stream.open()
    n = len(_cold(Pass(0, 0)))
    for taken in range(1, n + 1):
        loop.read(token, 1)
        ahead = len(loop.stream.demand.passes) == 2
        assert ahead == (n - taken <= depth), taken
    demand = loop.stream.demand
    assert demand.needed == n and demand.end == 2 * n
    assert demand.passes[1].span == after(Pass(0, 0))
    rows, tag = demand.batch(n)
    assert rows.tolist() == [[0, 0, BATCH]] and tag == _cold(Pass(1, 0))[0]


@pytest.mark.parametrize("read_ahead", (True, False))
@pytest.mark.parametrize("k", (0, 1, 5, 9, 10))
def test_a_peek_or_a_break_consumes_nothing_and_the_next_pass_starts_the_epoch_over(
        read_ahead: bool, k: int) -> None:
    loop = Loop(read_ahead=read_ahead)
    token = loop.stream.open()
    assert loop.read(token, k) == _cold(Pass(0, 0))[:k]
    assert loop.stream.position(held=False) == (0, 0, 0)  # its iterator is gone
    assert loop.stream.position(held=True) == (0, 0, k)
    gen = loop.stream.demand.gen
    again = loop.stream.open()  # taking every batch (k == 10) without StopIteration: no end
    assert loop.read(again) == _cold(Pass(0, 0))
    assert loop.stream.demand.gen == gen + 1  # sought: the epoch over, not read on
    assert loop.read(loop.stream.open()) == _cold(Pass(1, 0))
    with pytest.raises(StaleIteratorError):
        loop.take(token)


def test_set_epoch_chooses_the_epoch_and_retargets_an_unread_iterator_only() -> None:
    loop = Loop()
    loop.stream.set_epoch(3, held=False)
    assert loop.read(loop.stream.open()) == _cold(Pass(3, 0))
    lightning = loop.stream.open()  # made before the epoch is set, as Lightning does
    assert loop.stream.set_epoch(5, held=True)
    assert loop.read(lightning) == _cold(Pass(5, 0))
    read = loop.stream.open()
    loop.read(read, 2)
    assert not loop.stream.set_epoch(5, held=True)  # it yielded: stale
    with pytest.raises(StaleIteratorError):
        loop.take(read)
    dropped = loop.stream.open()
    assert not loop.stream.set_epoch(2, held=False)  # not held: stale, whatever it read
    with pytest.raises(StaleIteratorError):
        loop.take(dropped)
    assert loop.read(loop.stream.open()) == _cold(Pass(2, 0))


def test_an_iterator_made_before_set_epoch_after_a_pass_that_stopped_at_len_reads_on() -> None:
    """Lightning's loop takes ``len`` batches and never sees StopIteration (the epoch is not
    complete), then makes its iterator and sets the next epoch: the pass read ahead is the one
    read, in the same generation; its seek waited for the first next()."""
    loop = Loop()
    first = loop.stream.open()
    assert loop.read(first, 10) == _cold(Pass(0, 0))
    gen, published = loop.stream.demand.gen, len(loop.published)
    it = loop.stream.open()  # still epoch 0 (not complete): waits, nothing published
    assert len(loop.published) == published and loop.stream.yielded == 0
    assert loop.stream.set_epoch(1, held=True)
    assert loop.read(it) == _cold(Pass(1, 0)) and loop.stream.demand.gen == gen
    it = loop.stream.open()
    loop.stream.set_epoch(7, held=True)  # retargeted elsewhere than the pass read ahead
    assert loop.read(it) == _cold(Pass(7, 0)) and loop.stream.demand.gen == gen + 1
    it = loop.stream.open()  # no set_epoch: the pass waits, then is sought at its first take
    assert loop.read(it) == _cold(Pass(8, 0))


@pytest.mark.parametrize("k", (7, 9))
def test_a_break_after_the_pass_was_read_ahead_drops_it_whatever_the_next_epoch(k: int) -> None:
    loop = Loop(depth=3)
    assert loop.read(loop.stream.open(), k) == _cold(Pass(0, 0))[:k]  # then a break
    assert loop.stream.demand.passes[1].span == Pass(1, 0)
    gen = loop.stream.demand.gen
    it = loop.stream.open()
    assert loop.stream.set_epoch(1, held=True)  # the epoch read ahead, but not where it stands
    assert loop.read(it) == _cold(Pass(1, 0)) and loop.stream.demand.gen > gen


@pytest.mark.parametrize("start", (0, 4, 20, 36, TOTAL))
@pytest.mark.parametrize("loop_sets_epoch", (True, False))
def test_resume_reads_the_rest_of_the_epoch_then_the_next_ones(start: int,
                                                               loop_sets_epoch: bool) -> None:
    loop = Loop()
    loop.stream.load(2, start)
    if loop_sets_epoch:
        loop.stream.set_epoch(2, held=False)
    rest = loop.read(loop.stream.open())
    if start == TOTAL and not loop_sets_epoch:
        assert rest == _cold(Pass(3, 0))  # saved after the epoch's last batch
        return
    assert rest == _cold(Pass(2, start))
    assert loop.read(loop.stream.open()) == _cold(Pass(3, 0))
    loop.stream.set_epoch(2, held=False)  # after a resumed pass completed: all of it
    assert loop.read(loop.stream.open()) == _cold(Pass(2, 0))


def test_a_load_makes_the_current_iterator_stale_and_the_position_is_the_loaded_one() -> None:
    loop = Loop()
    token = loop.stream.open()
    loop.read(token, 3)
    loop.stream.load(1, 8)
    assert loop.stream.position(held=True) == (1, 8, 0)
    with pytest.raises(StaleIteratorError):
        loop.take(token)
    token = loop.stream.open()
    loop.read(token, 2)
    assert loop.stream.position(held=True) == (1, 8, 2)
    assert loop.read(token) == _cold(Pass(1, 8))[2:]
    assert loop.stream.position(held=True) == (1, TOTAL, 0)


def test_only_the_batch_next_gave_may_be_taken() -> None:
    loop = Loop()
    token = loop.stream.open()
    assert loop.stream.next(token) == 0
    with pytest.raises(InternalError, match="got batch 1, expected 0"):
        loop.stream.took(1, 3)
    with pytest.raises(InternalError, match="outside generation 1"):
        loop.stream.demand.batch(10)


OPS = ("iter", "take", "drain", "set_epoch", "set_epoch_held", "load", "drop")


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("read_ahead", (True, False))
@pytest.mark.parametrize("ahead", (False, True))
def test_random_loops_read_what_a_cold_loader_reads(seed: int, read_ahead: bool,
                                                    ahead: bool) -> None:
    """Whatever a loop does, every pass yields the batches of the pass a reference cursor
    names, planned cold, in order; demands only grow within a generation; the same with the
    next pass planned in the background (``ahead``)."""
    rng = random.Random(seed)
    planner = Planner(_plan) if ahead else None
    loop = Loop(read_ahead=read_ahead, depth=rng.choice((1, 2, 5)), planner=planner)
    ref = EpochCursor(TOTAL)
    token: object | None = None
    span = Pass(0, 0)
    got: list[BatchTag] = []
    ended = False
    for _ in range(60):
        op = rng.choice(OPS)
        if op == "iter":
            token, span, got, ended = loop.stream.open(), ref.begin(), [], False
        elif op in ("take", "drain") and token is not None and loop.stream.current(token):
            for _ in range(rng.randint(1, 4) if op == "take" else 99):
                tag = loop.take(token)
                if tag is None:
                    ref.end()
                    ended = True
                    break
                ref.yielded()
                got.append(tag)
            assert got == _cold(span)[:len(got)]
            if ended:
                assert got == _cold(span)
        elif op in ("set_epoch", "set_epoch_held"):
            epoch = rng.randint(0, 4)
            held = op == "set_epoch_held" and token is not None
            unread = held and loop.stream.current(token) and not got
            assert loop.stream.set_epoch(epoch, held=held) == unread
            ref.set_epoch(epoch)
            if unread:
                span, got = ref.begin(), []
        elif op == "load":
            epoch, start = rng.randint(0, 4), BATCH * rng.randint(0, TOTAL // BATCH)
            loop.stream.load(epoch, start)
            ref.load(epoch, start)
        elif op == "drop":
            token = None
        live = token is not None and loop.stream.current(token)
        assert loop.stream.position(held=token is not None) == ref.position(live)
    for before, now in itertools.pairwise(loop.published):
        assert now.gen >= before.gen
        if now.gen == before.gen:
            assert now.first >= before.first and now.end >= before.end
    if planner is not None:
        planner.close()


def test_the_pass_after_each_one_is_planned_in_the_background_while_it_is_read() -> None:
    """The plan the stream asks for when a pass ends was worked out on the planner's thread
    (not in the consumer's ``next()``), from when that pass was sought."""
    where: dict[Pass, str] = {}

    def plan(span: Pass) -> PassPlan:
        where[span] = threading.current_thread().name
        return _plan(span)

    planner = Planner(plan)
    loop = Loop(depth=2, planner=planner)
    try:
        for epoch in range(4):
            assert loop.read(loop.stream.open()) == _cold(Pass(epoch, 0))
    finally:
        planner.close()
    assert where[Pass(0, 0)] == threading.current_thread().name  # the first: sought at once
    assert all(where[Pass(e, 0)].startswith("dataflow-plan") for e in range(1, 5)), where


@pytest.mark.parametrize("first", (0, 7))
def test_a_demand_finds_each_batch_in_its_pass_skipping_empty_ones_and_refuses_others(
        first: int) -> None:
    full = _plan(Pass(0, 0))  # 10 batches
    empty = PassPlan(Pass(1, TOTAL), Batches.of([]), first=TOTAL // BATCH)
    short = _plan(Pass(2, TOTAL - 2 * BATCH))  # 2 batches
    demand = Demand(3, (full, empty, short), first)
    assert demand.ends == (first + 10, first + 10, first + 12)
    assert (demand.needed, demand.end) == (first + 10, first + 12)
    passes = [(full, i) for i in range(10)] + [(short, i) for i in range(2)]
    for index, (p, i) in enumerate(passes, start=first):
        rows, tag = demand.batch(index)
        assert rows.tolist() == p.rows(i).tolist() and tag == p.tag(i)
        assert demand.run_end(index) == (first + 10 if p is full else first + 12)
    for outside in (first - 1, first + 12):
        with pytest.raises(InternalError, match=f"batch {outside} is outside generation 3"):
            demand.batch(outside)
        with pytest.raises(InternalError, match="outside"):
            demand.run_end(outside)
    nothing = Demand()
    assert (nothing.needed, nothing.end, nothing.ends) == (0, 0, ())
    with pytest.raises(InternalError, match="outside"):
        nothing.batch(0)
