"""Which entry a reader's decoded-sample cache evicts: least recently used, or plan-aware.

Clients know their whole order in advance, so each REQUEST may announce the rows its session
reads next (its ``ahead``, :class:`~dataflow.wire.Request`): a window of the session's plan.
:class:`PlanAware` keeps the latest window of each session that announced one and evicts as
Belady's rule does over them: first an entry no window names (least recently used first, as
:class:`Recency` would), else the one whose next use is furthest ahead (ties: the least
recently used). An entry's next use is its first position in a window, the least over the
sessions' windows (each window counts from its own request, so sessions reading at about the
same pace are compared fairly).

An announcement is a hint only: it changes which entry is evicted, never which sample is
served; none, or a wrong one, leaves the choice to recency. Both policies are pure (no I/O,
no clock) and bounded: :class:`PlanAware` holds at most ``sessions`` windows of at most
``window`` rows each (a new session's window replaces the least recently announced one; a
freed session's is dropped, :meth:`PlanAware.forget_session`).
Not thread-safe (one per cache, used by its reader's one thread).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from dataflow.errors import ConfigError

K = TypeVar("K", bound=Hashable)


class Recency(Generic[K]):
    """Least recently used first: the cached keys in the order of their last use."""

    def __init__(self) -> None:
        self._order: OrderedDict[K, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: K) -> bool:
        return key in self._order

    def used(self, key: K) -> None:
        """``key`` is cached and was read or written now: it becomes the most recent."""
        self._order[key] = None
        self._order.move_to_end(key)

    def forget(self, key: K) -> None:
        """``key`` left the cache (a no-op if it was not there)."""
        self._order.pop(key, None)

    def victim(self) -> K:
        """The key to evict next (it stays tracked until :meth:`forget`).

        Raises:
            KeyError: no key is cached.
        """
        if not self._order:
            raise KeyError("no cached key to evict")
        return next(iter(self._order))


class PlanAware(Recency[K]):
    """Belady's rule over the windows sessions announce (see the module docstring).

    Args:
        sessions: most windows kept, > 0.
        window: most rows of one window, > 0.

    Raises:
        ConfigError: a bound is not a positive integer.
    """

    def __init__(self, sessions: int, window: int) -> None:
        super().__init__()
        for name, value in (("sessions", sessions), ("window", window)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"`{name}` must be a positive integer. Found: {value!r}")
        self.sessions = sessions
        self.window = window
        self._windows: OrderedDict[Hashable, dict[K, int]] = OrderedDict()
        self._soon: dict[K, int] = {}  # key -> its next use, over every window
        self._tick = 0
        self._last: dict[K, int] = {}  # cached key -> tick of its last use
        # Lazy heaps of the cached keys (an entry is current while its ticks and use are):
        self._free: list[tuple[int, K]] = []  # in no window: (last use, key)
        self._planned: list[tuple[int, int, K]] = []  # (-next use, last use, key)

    def announce(self, session: Hashable, keys: Iterable[K]) -> None:
        """``session`` reads ``keys`` next, in this order (after the request announcing them):
        its window, replacing the one it announced before.

        Raises:
            ValueError: more than ``window`` keys.
        """
        new: dict[K, int] = {}
        for at, key in enumerate(keys):
            if at >= self.window:
                raise ValueError(f"an announcement holds at most {self.window} rows")
            new.setdefault(key, at)
        old = self._windows.pop(session, {})
        if new:
            self._windows[session] = new
        if len(self._windows) > self.sessions:
            _, dropped = self._windows.popitem(last=False)
            old = {**dropped, **old}
        for key in old.keys() | new.keys():
            self._update(key)

    def forget_session(self, session: Hashable) -> None:
        """``session`` ended: drop its window (a no-op if it has none)."""
        self.announce(session, ())

    def next_use(self, key: K) -> int | None:
        """``key``'s first position in any window (the least), or None: no window names it."""
        return self._soon.get(key)

    def used(self, key: K) -> None:
        super().used(key)
        self._tick += 1
        self._last[key] = self._tick
        self._place(key)

    def forget(self, key: K) -> None:
        super().forget(key)
        self._last.pop(key, None)

    def victim(self) -> K:
        free = self._free
        while free:
            tick, key = free[0]
            if self._last.get(key) == tick and key not in self._soon:
                return key
            heapq.heappop(free)
        planned = self._planned
        while planned:
            use, tick, key = planned[0]
            if self._last.get(key) == tick and self._soon.get(key) == -use:
                return key
            heapq.heappop(planned)
        return super().victim()

    def _update(self, key: K) -> None:
        """Recompute ``key``'s next use from the windows."""
        uses = [w[key] for w in self._windows.values() if key in w]
        if uses:
            self._soon[key] = min(uses)
        else:
            self._soon.pop(key, None)
        if key in self._last:
            self._place(key)

    def _place(self, key: K) -> None:
        """File the cached ``key`` as free or planned after its next use or last use changed."""
        use, tick = self._soon.get(key), self._last[key]
        if use is None:
            heapq.heappush(self._free, (tick, key))
        else:
            heapq.heappush(self._planned, (-use, tick, key))
        if len(self._free) + len(self._planned) > 4 * len(self._last) + 64:
            self._free = [(t, k) for k, t in self._last.items() if k not in self._soon]
            self._planned = [(-self._soon[k], t, k) for k, t in self._last.items()
                             if k in self._soon]
            heapq.heapify(self._free)
            heapq.heapify(self._planned)
