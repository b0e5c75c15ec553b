"""Iteration semantics as a pure state machine: passes, epochs, peeks, resume positions."""

from __future__ import annotations

import pytest

from dataflow.client.cursor import EpochCursor, Pass
from dataflow.errors import InternalError

TOTAL = 100


def _run(c: EpochCursor, batches: int, stop_after: int | None = None,
         exhausted: bool | None = None) -> Pass:
    """A pass of ``batches`` batches, abandoned after ``stop_after`` when given; its iterator
    reaches its end (StopIteration) when ``exhausted`` (by default: when not abandoned)."""
    p = c.begin()
    n = batches if stop_after is None else stop_after
    for _ in range(n):
        c.yielded()
    if exhausted if exhausted is not None else stop_after is None:
        c.end()
    return p


def test_passes_advance_epochs_only_when_complete() -> None:
    c = EpochCursor(TOTAL)
    assert _run(c, 5, stop_after=1) == Pass(0, 0)  # a peek
    assert _run(c, 5, stop_after=3) == Pass(0, 0)  # a break
    assert _run(c, 5) == Pass(0, 0)
    assert c.position(live=True) == (0, TOTAL, 0)
    assert _run(c, 5) == Pass(1, 0)
    c.set_epoch(7)
    assert c.position(live=True) == (7, 0, 0)
    assert _run(c, 5, stop_after=2) == Pass(7, 0) and c.position(live=True) == (7, 0, 2)


def test_a_pass_completes_when_its_iterator_ends_not_when_its_last_batch_is_taken() -> None:
    c = EpochCursor(TOTAL)
    assert _run(c, 1, stop_after=1, exhausted=False) == Pass(0, 0)  # a peek at a 1-batch epoch
    assert _run(c, 1, stop_after=1, exhausted=False) == Pass(0, 0)
    assert _run(c, 1) == Pass(0, 0)
    assert _run(c, 1) == Pass(1, 0)
    c.load(1, 40)  # one batch left after a resume, peeked at
    assert _run(c, 1, stop_after=1, exhausted=False) == Pass(1, 40)
    assert _run(c, 1) == Pass(1, 40)
    assert _run(c, 0) == Pass(2, 0)  # an empty pass completes too once its iterator ends
    assert _run(c, 3) == Pass(3, 0)


def test_the_position_counts_a_pass_s_batches_only_while_its_iterator_is_held() -> None:
    c = EpochCursor(TOTAL)
    c.load(0, 30)
    _run(c, 5, stop_after=2)
    assert c.position(live=True) == (0, 30, 2)  # the loop holds its iterator: it goes on
    assert c.position(live=False) == (0, 30, 0)  # a peek whose iterator is gone
    _run(c, 5, stop_after=5, exhausted=False)
    assert c.position(live=True) == (0, 30, 5)  # every batch taken: consumed() gives total
    c.end()
    assert c.position(live=False) == (0, TOTAL, 0)


def test_set_epoch_after_a_complete_pass_repeats_or_moves() -> None:
    c = EpochCursor(TOTAL)
    _run(c, 3)
    c.set_epoch(0)
    assert _run(c, 3) == Pass(0, 0)
    c.set_epoch(1)
    assert _run(c, 3) == Pass(1, 0)


@pytest.mark.parametrize("loop_calls_set_epoch", [True, False])
def test_resume_mid_epoch_survives_set_epoch_of_that_epoch(loop_calls_set_epoch: bool) -> None:
    c = EpochCursor(TOTAL)
    c.load(2, 40)
    assert c.position(live=False) == (2, 40, 0)
    if loop_calls_set_epoch:
        c.set_epoch(2)
    assert _run(c, 4, stop_after=1) == Pass(2, 40)  # a peek keeps the resumed start
    assert c.position(live=True) == (2, 40, 1)
    c.set_epoch(2)
    assert _run(c, 4) == Pass(2, 40)
    assert _run(c, 9) == Pass(3, 0)


def test_set_epoch_of_an_epoch_whose_resumed_pass_completed_is_the_whole_epoch() -> None:
    c = EpochCursor(TOTAL)
    c.load(2, 40)
    c.set_epoch(2)
    assert _run(c, 4) == Pass(2, 40)
    c.set_epoch(2)  # asked again, explicitly: the whole epoch, as a cold loader reads it
    assert _run(c, 9) == Pass(2, 0)
    c.load(2, TOTAL)
    c.set_epoch(2)
    assert _run(c, 0) == Pass(2, TOTAL)
    c.set_epoch(2)
    assert _run(c, 9) == Pass(2, 0)


def test_resume_then_another_epoch_drops_the_position() -> None:
    c = EpochCursor(TOTAL)
    c.load(2, 40)
    c.set_epoch(5)
    assert _run(c, 4) == Pass(5, 0)
    c.set_epoch(2)
    assert _run(c, 9) == Pass(2, 0)


def test_state_after_the_last_batch_resumes_at_the_next_epoch_or_an_empty_pass() -> None:
    c = EpochCursor(TOTAL)
    c.load(2, TOTAL)
    assert c.position(live=False) == (2, TOTAL, 0)
    assert _run(c, 9) == Pass(3, 0)
    c.load(2, TOTAL)
    c.set_epoch(2)
    assert _run(c, 0) == Pass(2, TOTAL)
    c.set_epoch(3)
    assert _run(c, 9) == Pass(3, 0)
    c.load(2, TOTAL)
    c.set_epoch(3)
    assert _run(c, 9) == Pass(3, 0)


def test_impossible_calls_raise() -> None:
    c = EpochCursor(TOTAL)
    with pytest.raises(InternalError):
        c.yielded()
    with pytest.raises(InternalError):
        c.end()
    with pytest.raises(InternalError):
        c.load(0, TOTAL + 1)
