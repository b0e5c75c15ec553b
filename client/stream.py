"""The one stream of batches a DataLoader reads, and where its iterator stands in it. Pure.

Every iterator reads one pass (which one is :mod:`dataflow.client.cursor`'s rule) out of one
stream: passes planned for this rank (:class:`~dataflow.client.passes.PassPlan`) back to back,
their batches numbered on across them. What the consumer wants read is a :class:`Demand`, a
frozen value that the :class:`Stream` publishes and the I/O thread fetches
(:mod:`dataflow.client.handoff`, :mod:`dataflow.client.fetch`): the pass the consumer reads,
and the pass after it once that one is read ahead.

* **Seek.** A new iterator starts its pass as a new *generation* of the stream, from batch 0:
  the I/O thread drops every batch of older generations, so iterators that were made and
  abandoned (a peek, a ``break``) never leave batches behind.
* **Read ahead.** Once the consumer is within ``depth`` batches of its pass's end (``depth``:
  the most batches the I/O thread requests ahead of it), the pass that follows when this one
  completes (the next epoch, from its start) is appended, so that an epoch's first batches
  are read while the epoch before it ends.
* **Continue.** A new iterator whose pass is the one appended, made once the consumer took
  every batch before it, continues the stream: nothing is dropped. While such a pass waits and
  a new iterator wants another, its seek waits for its first ``next()``: a ``set_epoch`` made
  before it may make it the pass read ahead (Lightning makes its iterator, then sets the
  epoch).
* **One iterator at a time.** A new iterator, :meth:`Stream.load` and :meth:`Stream.set_epoch`
  make the current iterator stale, except one that :meth:`Stream.set_epoch` retargets: still
  held and not read yet, it covers the new epoch.

The generation is the stream's only counter.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from dataflow.client.cursor import EpochCursor, Pass
from dataflow.client.passes import after
from dataflow.errors import InternalError, StaleIteratorError
from dataflow.wire import BatchTag


class Planned(Protocol):
    """A pass planned for this rank, as the stream sees it: its span and its batch count."""

    @property
    def span(self) -> Pass: ...

    def __len__(self) -> int: ...


class Readable(Planned, Protocol):
    """A planned pass whose batches a server reads: each one's rows and tag
    (:class:`~dataflow.client.passes.PassPlan`)."""

    def rows(self, i: int) -> np.ndarray: ...

    def tag(self, i: int) -> BatchTag: ...

    def run_end(self, i: int) -> int:
        """One past the last batch a request starting at batch ``i`` may carry (batches one
        request carries must not name a sample twice: a server refuses that)."""
        ...


P = TypeVar("P", bound=Planned, covariant=True)


@dataclass(frozen=True)
class Demand(Generic[P]):
    """The batches the consumer wants read: generation ``gen``'s ``passes``, back to back,
    numbered from ``first``. ``passes[0]`` is the pass the consumer reads (its batches are
    needed); a pass after it is read ahead.

    Attributes:
        ends: one past the last batch of each pass, numbered as the demand numbers them
            (a planned pass never changes its length, so they are counted once: the I/O
            thread asks for them several times per batch).
    """

    gen: int = 0
    passes: tuple[P, ...] = ()
    first: int = 0
    ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ends = []
        end = self.first
        for p in self.passes:
            end += len(p)
            ends.append(end)
        object.__setattr__(self, "ends", tuple(ends))

    @property
    def needed(self) -> int:
        """One past the last batch of the pass the consumer reads."""
        return self.ends[0] if self.ends else self.first

    @property
    def end(self) -> int:
        """One past the last batch wanted."""
        return self.ends[-1] if self.ends else self.first

    def _locate(self, index: int) -> tuple[int, int]:
        """The pass holding batch ``index`` and where that pass starts.

        Raises:
            InternalError: ``index`` is not a batch of this demand.
        """
        k = bisect_right(self.ends, index)
        if index < self.first or k == len(self.ends):
            raise InternalError(f"batch {index} is outside generation {self.gen}'s batches "
                                f"[{self.first}, {self.end})")
        return k, self.ends[k - 1] if k else self.first

    def run_end(self: Demand[Readable], index: int) -> int:
        """One past the last batch that one request starting at batch ``index`` may carry:
        its pass's end, or sooner where the pass says (:meth:`Readable.run_end`).

        Raises:
            InternalError: ``index`` is not a batch of this demand.
        """
        k, start = self._locate(index)
        return start + self.passes[k].run_end(index - start)

    def batch(self: Demand[Readable], index: int) -> tuple[np.ndarray, BatchTag]:
        """Batch ``index``'s ``(shard, start, stop)`` rows and its tag.

        Raises:
            InternalError: ``index`` is not a batch of this demand.
        """
        k, start = self._locate(index)
        p = self.passes[k]
        return p.rows(index - start), p.tag(index - start)


Q = TypeVar("Q", bound=Planned)


class Stream(Generic[Q]):
    """A loader's stream of batches and its current iterator (see the module).

    Args:
        cursor: the loader's epochs: which pass an iterator covers, and the resume position.
        plan: this rank's plan of a pass.
        publish: tells the I/O thread what the consumer wants read now (each new
            :attr:`demand`, in order).
        read_ahead: append the next pass while one ends.
        prepare: told the pass that follows each pass sought, whose plan is asked for when
            that pass ends (with ``read_ahead``): the loader's
            :class:`~dataflow.client.planner.Planner` works it out meanwhile.

    Thread invariant: used by the consumer's thread only.
    """

    def __init__(self, cursor: EpochCursor, plan: Callable[[Pass], Q],
                 publish: Callable[[Demand[Q]], None], *, read_ahead: bool,
                 prepare: Callable[[Pass], None] | None = None) -> None:
        self._cursor = cursor
        self._plan = plan
        self._publish = publish
        self._read_ahead = read_ahead
        self._prepare = prepare if read_ahead else None
        self.demand: Demand[Q] = Demand()
        self._taken = 0  # batches of the demand's generation the consumer took
        self._current: object | None = None  # the current iterator's token
        self._pending: Pass | None = None  # its pass, sought at its first next()

    @property
    def epoch(self) -> int:
        """The epoch of the current pass (or of the next one, once set)."""
        return self._cursor.epoch

    @property
    def span(self) -> Pass:
        """The pass the consumer reads (once one was sought)."""
        return self.demand.passes[0].span

    @property
    def yielded(self) -> int:
        """Batches the current iterator yielded (0 when there is none)."""
        if self._current is None or self._pending is not None:
            return 0
        return self._taken - self.demand.first

    def open(self) -> object:
        """A new iterator: its pass begins; the iterator before it is stale from now on.

        Returns:
            The iterator's token, for :meth:`next`.
        """
        token = self._current = object()
        self._begin()
        return token

    def current(self, token: object) -> bool:
        """Whether ``token``'s iterator is the current one."""
        return token is self._current

    def set_epoch(self, epoch: int, *, held: bool) -> bool:
        """The next pass covers ``epoch`` (:meth:`EpochCursor.set_epoch`).

        Args:
            held: the program still holds the current iterator.

        Returns:
            Whether the current iterator, held and not read yet, was retargeted to ``epoch``
            (else it is stale from now on).
        """
        unread = held and self._current is not None and self.yielded == 0
        self._cursor.set_epoch(epoch)
        if unread:
            self._begin()
        else:
            self._current = None
        return unread

    def load(self, epoch: int, start: int) -> None:
        """Resume at sample ``start`` of ``epoch`` (:meth:`EpochCursor.load`); the current
        iterator is stale from now on."""
        self._cursor.load(epoch, start)
        self._current = None

    def next(self, token: object) -> int | None:
        """The index of the batch iterator ``token`` takes next (its pass is sought now if it
        waited), or None: its pass yielded every batch and is complete (the cursor is told;
        no iterator is current from then on).

        Raises:
            StaleIteratorError: ``token``'s iterator is not the current one.
        """
        if token is not self._current:
            raise StaleIteratorError("this iterator was invalidated: a newer iterator was "
                                     "started, or set_epoch/load_state_dict was called "
                                     "after it yielded")
        if self._pending is not None:
            self._seek(self._pending)
        if self._taken < self.demand.needed:
            return self._taken
        self._cursor.end()
        self._current = None
        return None

    def took(self, index: int, depth: int) -> int:
        """The current iterator took batch ``index`` (the one :meth:`next` gave); the pass
        after it is appended once at most ``depth`` batches of this one are left.

        Returns:
            The batches its pass has left.

        Raises:
            InternalError: ``index`` is not the batch :meth:`next` gave.
        """
        if self._current is None or index != self._taken:
            raise InternalError(f"got batch {index}, expected {self._taken}")
        self._taken += 1
        self._cursor.yielded()
        d = self.demand
        left = d.needed - self._taken
        if self._read_ahead and len(d.passes) == 1 and left <= depth:
            self._want(Demand(d.gen, (*d.passes, self._plan(after(d.passes[0].span))), d.first))
        return left

    def position(self, held: bool) -> tuple[int, int, int]:
        """``(epoch, start, batches)`` (:meth:`EpochCursor.position`); the current pass's
        batches count when ``held``: the program still holds its iterator."""
        return self._cursor.position(held and self._current is not None)

    def _begin(self) -> None:
        span = self._cursor.begin()
        self._pending = None
        d = self.demand
        at_next = len(d.passes) > 1 and self._taken == d.needed
        if at_next and d.passes[1].span == span:
            self._want(Demand(d.gen, d.passes[1:], d.needed))
            self._ahead(span)
        elif at_next:
            self._pending = span
        else:
            self._seek(span)

    def _seek(self, span: Pass) -> None:
        planned = self._plan(span)
        self._pending = None
        self._taken = 0
        self._want(Demand(self.demand.gen + 1, (planned,)))
        self._ahead(span)

    def _ahead(self, span: Pass) -> None:
        """``span`` is read now: the pass after it is planned meanwhile."""
        if self._prepare is not None:
            self._prepare(after(span))

    def _want(self, demand: Demand[Q]) -> None:
        self.demand = demand
        self._publish(demand)
