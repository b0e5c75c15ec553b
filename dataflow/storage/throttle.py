"""Backoff and adaptive concurrency for object-store requests.

Object stores answer overload with a throttling reply (S3: ``503 SlowDown``, about 5,500
GET/s per prefix). The answer is to wait and to send fewer requests at once:

* :class:`Backoff` gives the wait before each retry: exponential, capped, jittered.
* :class:`AdaptiveLimit` decides how many requests may be in flight (AIMD): halved on a
  throttling reply (at most once per ``cooldown_s``, since a burst of 503s answers requests
  sent together), raised by one after ``increase_every_s`` without a throttling reply.

Both are pure (the clock and the random draw are arguments), so they are tested with a fake
clock. :class:`Gate` is the thin threaded part: it lets at most ``limit`` callers in at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter.

    Attributes:
        base_s: wait before the first retry (seconds, before jitter).
        cap_s: longest wait (seconds).
        max_retries: retries after the first attempt before giving up.
    """

    base_s: float = 0.05
    cap_s: float = 5.0
    max_retries: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ConfigError(f"`base_s` must be in (0, cap_s={self.cap_s}]. Found: {self.base_s}")
        object.__setattr__(self, "max_retries", check_int("max_retries", self.max_retries, 0))

    def delay(self, retry: int, draw: float) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first).

        Args:
            retry: how many retries came before this one.
            draw: a uniform random number in ``[0, 1)``; the wait lies in ``[d/2, d)`` of the
                un-jittered ``d = min(cap_s, base_s * 2**retry)``.
        """
        if retry < 0 or not 0 <= draw < 1:
            raise ConfigError(f"retry {retry} must be >= 0 and draw {draw} in [0, 1)")
        full = min(self.cap_s, self.base_s * 2.0 ** min(retry, 62))
        return full * (0.5 + draw / 2)


class AdaptiveLimit:
    """How many requests may be in flight: additive increase, multiplicative decrease.

    Not thread-safe: :class:`Gate` calls it under its lock.

    Attributes:
        limit: requests allowed in flight now, in ``[1, max_limit]``.
        throttles: throttling replies seen.
        decreases: times the limit was halved.
    """

    def __init__(self, max_limit: int, *, cooldown_s: float = 1.0,
                 increase_every_s: float = 1.0, now: float = 0.0) -> None:
        max_limit = check_int("max_limit", max_limit, 1)
        if cooldown_s < 0 or increase_every_s <= 0:
            raise ConfigError(f"`cooldown_s` ({cooldown_s}) must be >= 0 and "
                              f"`increase_every_s` ({increase_every_s}) > 0")
        self.max_limit = max_limit
        self.limit = max_limit
        self.throttles = 0
        self.decreases = 0
        self._cooldown_s = cooldown_s
        self._increase_every_s = increase_every_s
        self._last_decrease: float | None = None
        self._last_change = now

    def on_throttle(self, now: float) -> None:
        """A request was answered with a throttling reply at time ``now``."""
        self.throttles += 1
        if self._last_decrease is not None and now - self._last_decrease < self._cooldown_s:
            return
        self.limit = max(1, self.limit // 2)
        self.decreases += 1
        self._last_decrease = self._last_change = now

    def on_success(self, now: float) -> None:
        """A request succeeded at time ``now``."""
        if self.limit < self.max_limit and now - self._last_change >= self._increase_every_s:
            self.limit += 1
            self._last_change = now


class Gate:
    """Lets at most ``limit.limit`` callers hold a slot at once (a semaphore whose size the
    :class:`AdaptiveLimit` changes). Thread-safe.

    Attributes:
        limit: the decisions; read it under no lock only for reporting.
        retries: retries made by callers (counted through :meth:`note_retry`).
        waited_s: seconds callers spent backing off.
    """

    def __init__(self, limit: AdaptiveLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.retries = 0
        self.waited_s = 0.0
        self._clock = clock
        self._cond = threading.Condition()
        self._in_flight = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot while the body runs (waits while the limit is reached)."""
        with self._cond:
            while self._in_flight >= self.limit.limit:
                self._cond.wait(1.0)
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def succeeded(self) -> None:
        with self._cond:
            self.limit.on_success(self._clock())
            self._cond.notify_all()

    def throttled(self) -> None:
        with self._cond:
            self.limit.on_throttle(self._clock())

    def note_retry(self, wait_s: float) -> None:
        with self._cond:
            self.retries += 1
            self.waited_s += wait_s
