"""Which discovered servers a DataLoader uses, from successive lookups. Pure, no sockets.

Driven by the client's I/O thread with the time passed in (unit-tested with a fake clock):

* **When.** A lookup is due every ``interval`` seconds after the previous one finished; one
  at a time.
* **Joins.** A server found that is not a member joins at once (the I/O thread connects,
  says HELLO and, once it joined, gives it requests).
* **Leaves, without flapping.** A member leaves once it was missing from ``absent_limit``
  consecutive lookups, or from one lookup while it is lost by the liveness rules
  (:mod:`dataflow.client.servers`). A member found again before that stays, its count reset.
  A server that left and is found again later joins anew.
* **Failed lookups** (the name does not resolve, the file cannot be read) change nothing:
  a DNS outage never empties the loader.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from dataflow.errors import ConfigError

DEFAULT_ABSENT_LIMIT = 3


@dataclass(frozen=True)
class Changes:
    """Servers to add and to remove, each sorted."""

    joins: tuple[str, ...] = ()
    leaves: tuple[str, ...] = ()


class Membership:
    """The members and the lookup schedule (see the module for the rules).

    Args:
        members: the servers found by the first lookup.
        interval: seconds between lookups (> 0).
        now: the current time (the first lookup is due at ``now + interval``).
        absent_limit: consecutive lookups a member may be missing from before it leaves.

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, members: Iterable[str], *, interval: float, now: float,
                 absent_limit: int = DEFAULT_ABSENT_LIMIT) -> None:
        if not interval > 0:
            raise ConfigError(f"`resolve_interval` must be > 0 seconds. Found: {interval!r}")
        if absent_limit < 1:
            raise ConfigError(f"`absent_limit` must be >= 1. Found: {absent_limit!r}")
        self._absent = dict.fromkeys(members, 0)  # member -> consecutive lookups missed
        self._interval = interval
        self._limit = absent_limit
        self._next = now + interval
        self._asked = False

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted(self._absent))

    def lookup_due(self, now: float) -> bool:
        """Whether to start a lookup now (then none is due until :meth:`found`)."""
        if self._asked or now < self._next:
            return False
        self._asked = True
        return True

    def deadline(self, now: float) -> float:
        """Seconds until a lookup is due (infinite while one is under way)."""
        return float("inf") if self._asked else max(self._next - now, 0.0)

    def found(self, now: float, servers: Collection[str] | None,
              lost: Callable[[str], bool]) -> Changes:
        """The lookup started by :meth:`lookup_due` finished at ``now``.

        Args:
            servers: the servers it found, or None when it failed (nothing changes).
            lost: whether a member is lost by the liveness rules now.

        Returns:
            The joins and leaves due; they are applied to the members.
        """
        self._asked = False
        self._next = now + self._interval
        if servers is None:
            return Changes()
        found = set(servers)
        joins = tuple(sorted(found - self._absent.keys()))
        leaves = []
        for member in sorted(self._absent):
            missed = 0 if member in found else self._absent[member] + 1
            self._absent[member] = missed
            if missed >= self._limit or (missed and lost(member)):
                leaves.append(member)
        for member in leaves:
            del self._absent[member]
        self._absent.update(dict.fromkeys(joins, 0))
        return Changes(joins, tuple(leaves))
