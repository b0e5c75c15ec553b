"""The one meeting point of a DataLoader's consumer thread and its I/O thread.

Everything that crosses between the two threads goes through a :class:`Handoff`, under its
lock: commands one way (:class:`StartEpoch`, :class:`Extend`, :class:`Need`, :class:`Stop`),
and the other way the servers that joined (the first one starts the loader), batches of the
current epoch in plan order (a failed request's :class:`Failed` in its batch's place), and a
failure. Nothing else is shared.

Batches belong to an epoch *generation*. :meth:`Handoff.start` (consumer) makes a new
generation current and discards every batch of older ones at once, so iterators that were
created and abandoned never leave batches behind; a batch the I/O thread delivers for a
generation that is no longer current is discarded on arrival. The I/O thread never has more
than its window of batches of one generation requested but not taken, so a delivery beyond
``capacity`` is a bug and raises :class:`~dataflow.errors.InternalError` — never a silent drop.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from dataflow import wire
from dataflow.errors import DataflowError, InternalError, LoaderClosedError
from dataflow.plan import Batches
from dataflow.wire import BatchTag

T = TypeVar("T")

# The I/O thread's counters (see :meth:`Handoff.count`).
COUNTERS = ("skipped", "servers_lost", "rejoined", "rerequested", "recovered", "joined", "left",
            "late")


@dataclass(frozen=True)
class Tags:
    """The :class:`~dataflow.wire.BatchTag` of each batch of a pass: the pass's batch ``i`` is
    global batch ``first + i * stride`` of ``epoch`` (:func:`dataflow.transform.
    global_batch_index`), read under the loader's ``seed``."""

    seed: int = 0
    epoch: int = 0
    first: int = 0
    stride: int = 1

    def of(self, index: int) -> BatchTag:
        return BatchTag(self.seed, self.epoch, self.first + index * self.stride)


NO_TAGS = Tags()


@dataclass(frozen=True)
class Failed:
    """A batch whose request failed (its server answered with an error): it takes the batch's
    place in plan order, and taking it raises ``error``. A generation dropped before the
    consumer reaches it (a loop that went elsewhere than the epoch read ahead) drops it too."""

    error: DataflowError


@dataclass(frozen=True)
class StartEpoch:
    """Request ``batches`` (batch ``first`` of the epoch and the ones after it) for ``gen``,
    each tagged ``tags.of(its index)``."""

    gen: int
    batches: Batches
    first: int
    tags: Tags = Tags()


@dataclass(frozen=True)
class Extend:
    """Request ``batches`` (the loader's next pass, tagged ``tags``) after those of ``gen``,
    as batches of the same generation: the next epoch is read while the current one ends.
    Ignored once ``gen`` is not current."""

    gen: int
    batches: Batches
    tags: Tags


@dataclass(frozen=True)
class Need:
    """The consumer began the pass that ends before batch ``end`` of generation ``gen`` (one
    read ahead): waiting for its batches with no usable server now counts toward
    ``timeout``. Batches appended ahead are not needed until then."""

    gen: int
    end: int


@dataclass(frozen=True)
class Stop:
    """Say BYE to the servers, close every socket and end the I/O thread."""


Command = StartEpoch | Extend | Need | Stop


class Handoff(Generic[T]):
    """Thread-safe exchange between one consumer and one I/O thread.

    Args:
        wake: wakes the I/O thread (called without the lock held; must never block).

    Thread invariant: every attribute is read and written under ``_lock``.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._commands: deque[Command] = deque()
        self._gen = 0
        self._batches: deque[tuple[int, T | Failed]] = deque()
        self._taken = 0
        self._first: wire.Index | None = None  # the INDEX of the first server that joined
        self._readers: dict[str, int] = {}  # each server that joined -> its reader processes
        self._error: BaseException | None = None
        self._closed = False
        self._want_wake = False
        self._delivered = 0
        self._discarded = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        self.capacity = 0

    # -- consumer side --------------------------------------------------------------------------

    def command(self, cmd: Command) -> None:
        """Queue ``cmd`` for the I/O thread and wake it."""
        with self._lock:
            self._commands.append(cmd)
        self._wake()

    @property
    def window(self) -> int:
        """Batches of the current generation that may wait at most (the I/O thread's window)."""
        with self._lock:
            return self.capacity

    def start(self, cmd: StartEpoch) -> None:
        """Make ``cmd.gen`` the current generation, discard older batches, send ``cmd``."""
        with self._lock:
            if cmd.gen <= self._gen:
                raise InternalError(f"epoch generation {cmd.gen} after {self._gen}")
            self._gen = cmd.gen
            self._discarded += len(self._batches)
            self._batches.clear()
            self._taken = 0
            self._commands.append(cmd)
        self._wake()

    def take(self, gen: int, timeout: float, alive: Callable[[], bool]) -> tuple[int, T]:
        """The next batch ``(index, item)`` of generation ``gen``, waiting for it.

        Args:
            gen: the consumer's generation (must be current).
            timeout: seconds between checks of ``alive``.
            alive: whether the I/O thread still runs.

        Raises:
            LoaderClosedError: :meth:`close` was called (also while this waited, from another
                thread).
            the I/O thread's failure, if it reported one; the error of a :class:`Failed`
                batch, when it is the next (it is the failure from then on, and the I/O
                thread is told to stop: it says BYE to the servers);
            InternalError: the I/O thread ended without reporting one.
        """
        wake = False
        with self._lock:
            while not self._batches:
                self._raise_failure()
                if not alive():
                    raise InternalError("the DataLoader's I/O thread has stopped")
                self._ready.wait(timeout)
            self._raise_failure()
            if gen != self._gen:
                raise InternalError(f"take for generation {gen}; current is {self._gen}")
            index, item = self._batches.popleft()
            self._taken += 1
            if isinstance(item, Failed):
                self._error = item.error
                self._commands.append(Stop())  # a failed loader holds no session
                wake = True
            elif self._want_wake:
                self._want_wake = False
                wake = True
        if wake:
            self._wake()
        if isinstance(item, Failed):
            raise item.error
        return index, item

    def consumed(self, gen: int) -> int | None:
        """Batches of generation ``gen`` the consumer took, or None when ``gen`` is not
        current."""
        with self._lock:
            return self._taken if gen == self._gen else None

    def hello(self, timeout: float, alive: Callable[[], bool]) -> wire.Index:
        """The INDEX of the first server that joined, once one did (raises the I/O thread's
        failure: ServerUnavailable when none joined within the loader's ``timeout``)."""
        with self._lock:
            while self._first is None:
                self._raise_failure()
                if not alive():
                    raise InternalError("the DataLoader's I/O thread has stopped")
                self._ready.wait(timeout)
            return self._first

    def readers(self) -> tuple[int, ...]:
        """The reader process count of each server that joined so far, in the order they
        first joined (as its INDEX said)."""
        with self._lock:
            return tuple(self._readers.values())

    def _raise_failure(self) -> None:
        if self._closed:
            raise LoaderClosedError("this DataLoader was closed") from self._error
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """The loader is closing: every consumer call, waiting or later, raises
        :class:`~dataflow.errors.LoaderClosedError` (idempotent; any thread)."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    # -- I/O thread side ------------------------------------------------------------------------

    def commands(self) -> list[Command]:
        """Commands queued since the last call, oldest first."""
        with self._lock:
            out = list(self._commands)
            self._commands.clear()
            return out

    def taken(self, gen: int, window_full: bool) -> int:
        """Batches of ``gen`` the consumer took (0 for a generation no longer current).

        ``window_full``: the I/O thread cannot request more until the consumer takes a batch;
        the next :meth:`take` then wakes it (otherwise takes do not wake it).
        """
        with self._lock:
            self._want_wake = window_full
            return self._taken if gen == self._gen else 0

    def deliver(self, gen: int, index: int, item: T | Failed) -> bool:
        """Hand batch ``index`` of ``gen`` to the consumer.

        Returns:
            False when ``gen`` is no longer current (the item was not kept).

        Raises:
            InternalError: more than ``capacity`` batches would wait.
        """
        with self._lock:
            if gen != self._gen:
                self._discarded += 1
                return False
            if len(self._batches) >= self.capacity:
                raise InternalError(f"hand-off over its capacity {self.capacity} at batch "
                                    f"{index} of generation {gen}")
            self._batches.append((index, item))
            self._delivered += 1
            self._ready.notify()
            return True

    def set_capacity(self, capacity: int) -> None:
        """Batches of the current generation that may wait at most (the scheduler's window)."""
        with self._lock:
            self.capacity = capacity

    def admitted(self, endpoint: str, index: wire.Index) -> None:
        """Server ``endpoint`` joined with ``index`` (the first one starts the loader)."""
        with self._lock:
            self._readers[endpoint] = index.workers
            if self._first is None:
                self._first = index
                self._ready.notify_all()

    def fail(self, error: BaseException) -> None:
        """Report a failure; every later consumer call raises it (the first one is kept)."""
        if not isinstance(error, DataflowError):
            wrapped = InternalError(f"client I/O thread failed: {type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        with self._lock:
            if self._error is None:
                self._error = error
            self._ready.notify_all()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the I/O thread's counter ``name`` (one of :data:`COUNTERS`)."""
        with self._lock:
            self._counters[name] += n

    def stats(self) -> dict[str, int]:
        """Batches delivered to the consumer's side, batches of abandoned generations
        discarded (waiting when a new one started, or arriving after), batches waiting, and
        the I/O thread's :data:`COUNTERS`."""
        with self._lock:
            return {"delivered": self._delivered, "discarded": self._discarded,
                    "waiting": len(self._batches), **self._counters}

    @property
    def failed(self) -> bool:
        with self._lock:
            return self._error is not None

    @property
    def failure(self) -> BaseException | None:
        """The failure raised to the consumer (or to be raised), if any."""
        with self._lock:
            return self._error

