"""The one meeting point of a DataLoader's consumer thread and its I/O thread.

Everything that crosses between the two threads goes through a :class:`Handoff`, under its
lock: one way what the consumer wants read (its latest :class:`~dataflow.client.stream.Demand`)
and whether the I/O thread is to stop; the other way the servers that joined (the first one
starts the loader), the batches of the stream in order (a failed request's :class:`Failed` in
its batch's place), and a failure. Nothing else is shared.

Batches belong to a stream *generation* (:mod:`dataflow.client.stream`). A demand of a new
generation (:meth:`Handoff.want`) discards every batch of older ones at once, so iterators that
were created and abandoned never leave batches behind; a batch the I/O thread delivers for a
generation that is no longer current is discarded on arrival. The I/O thread never has more
than ``capacity`` batches of one generation requested but not taken (its scheduler's depth),
so a delivery beyond it is a bug and raises :class:`~dataflow.errors.InternalError` — never a
silent drop.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from dataflow import wire
from dataflow.client.stream import Demand, Readable
from dataflow.errors import DataflowError, InternalError, LoaderClosedError

T = TypeVar("T")

# The I/O thread's counters (see :meth:`Handoff.count`).
COUNTERS = ("skipped", "servers_lost", "rejoined", "rerequested", "recovered", "joined", "left",
            "late", "shm_sessions", "shm_batches")


@dataclass(frozen=True)
class Failed:
    """A batch whose request failed (its server answered with an error): it takes the batch's
    place in stream order, and taking it raises ``error``. A generation dropped before the
    consumer reaches it (a loop that went elsewhere than the epoch read ahead) drops it too."""

    error: DataflowError


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
        self._demand: Demand[Readable] = Demand()
        self._stopping = False
        self._batches: deque[tuple[int, T | Failed]] = deque()
        self._taken = 0
        self._first: wire.Index | None = None  # the INDEX of the first server that joined
        self._readers: dict[str, int] = {}  # each server that joined -> its reader processes
        self._error: BaseException | None = None
        self._closed = False
        self._wake_at: int | None = None  # the take count that wakes the I/O thread
        self._delivered = 0
        self._discarded = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._capacity = 0

    # -- consumer side --------------------------------------------------------------------------

    def want(self, demand: Demand) -> None:
        """What the consumer wants read from now on; a demand of a newer generation discards
        every batch of older ones. Wakes the I/O thread.

        Raises:
            InternalError: ``demand`` is of an older generation than the last one.
        """
        with self._lock:
            if demand.gen < self._demand.gen:
                raise InternalError(f"stream generation {demand.gen} after "
                                    f"{self._demand.gen}")
            if demand.gen > self._demand.gen:
                self._discarded += len(self._batches)
                self._batches.clear()
                self._taken = 0
            self._demand = demand
        self._wake()

    @property
    def capacity(self) -> int:
        """Batches of the current generation that may wait at most: the most the I/O thread
        requests ahead of the consumer."""
        with self._lock:
            return self._capacity

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
                thread is told to stop: it says BYE to the servers, see :attr:`stopping`);
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
            if gen != self._demand.gen:
                raise InternalError(f"take for generation {gen}; current is "
                                    f"{self._demand.gen}")
            index, item = self._batches.popleft()
            self._taken += 1
            if isinstance(item, Failed):
                self._error = item.error
                self._stopping = True  # a failed loader holds no session
                wake = True
            elif self._wake_at is not None and self._taken >= self._wake_at:
                self._wake_at = None
                wake = True
        if wake:
            self._wake()
        if isinstance(item, Failed):
            raise item.error
        return index, item

    def peek(self, gen: int) -> tuple[int, T] | None:
        """The batch :meth:`take` would return next for ``gen``, if it is here already, without
        taking it (never waits); None when none waits, the next is a :class:`Failed`, or
        ``gen`` is not current."""
        with self._lock:
            if gen != self._demand.gen or not self._batches:
                return None
            index, item = self._batches[0]
            return None if isinstance(item, Failed) else (index, item)

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
        :class:`~dataflow.errors.LoaderClosedError`, and the I/O thread is to stop
        (idempotent; any thread; the caller wakes the I/O thread)."""
        with self._lock:
            self._closed = True
            self._stopping = True
            self._ready.notify_all()

    # -- I/O thread side ------------------------------------------------------------------------

    def wanted(self) -> Demand:
        """What the consumer wants read: its latest demand."""
        with self._lock:
            return self._demand

    @property
    def stopping(self) -> bool:
        """Whether the I/O thread is to say BYE to the servers, close its sockets and end:
        the loader is closing, or the consumer took a failed batch."""
        with self._lock:
            return self._stopping

    def taken(self, gen: int, wake_at: int | None = None) -> int:
        """Batches of ``gen`` the consumer took (0 for a generation no longer current).

        ``wake_at``: the I/O thread cannot request more until the consumer took this many
        batches of ``gen``; the :meth:`take` that gets there wakes it (takes do not wake it
        otherwise). None: no take wakes it.
        """
        with self._lock:
            current = gen == self._demand.gen
            self._wake_at = wake_at if current else None
            return self._taken if current else 0

    def deliver(self, gen: int, index: int, item: T | Failed) -> bool:
        """Hand batch ``index`` of ``gen`` to the consumer.

        Returns:
            False when ``gen`` is no longer current (the item was not kept).

        Raises:
            InternalError: more than ``capacity`` batches would wait.
        """
        with self._lock:
            if gen != self._demand.gen:
                self._discarded += 1
                return False
            if len(self._batches) >= self._capacity:
                raise InternalError(f"hand-off over its capacity {self._capacity} at batch "
                                    f"{index} of generation {gen}")
            self._batches.append((index, item))
            self._delivered += 1
            self._ready.notify()
            return True

    def set_capacity(self, capacity: int) -> None:
        """Batches of the current generation that may wait at most (the scheduler's depth)."""
        with self._lock:
            self._capacity = capacity

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

