"""Which usable server takes the next request: shares in proportion to capacity. Pure, no
sockets; the time is passed in, so the rules are unit-tested with a fake clock (through
:class:`~dataflow.client.scheduler.Scheduler`, which says which servers may take a request).

* **Capacity.** A server's capacity is its readers (the reader connections its INDEX lists)
  over its *service time*, the seconds one of its readers takes to answer one request. Each
  reply is a sample: the seconds from the request to its reply, over the rounds its readers
  needed for the requests the server held when it was sent, itself counted (``ceil(held /
  readers)``). The estimate is the median of its latest ``SERVICE_MEMORY`` samples, so a few
  replies far slower (each reader's first, which opens the shards; a process descheduled
  for a moment) do not move it, and a server that became slower shows it within half as
  many.
* **Alike or slower.** A server whose service time is within ``EQUAL_WITHIN`` (2x) of the
  fastest usable server's counts as fast as that one, so servers that are alike share alike
  however noisy the clock; a server slower than that gets a share cut in proportion (4x
  slower: a quarter per reader). A server with fewer than ``MIN_SAMPLES`` samples counts as
  fast as the fastest.
* **Shares.** Requests are shared in virtual time (start-time fair queueing): each server has
  the finish tag of its latest request; of the servers that may take a request, the one whose
  next finish, ``max(tag, V - credits / weight) + 1 / weight``, is lowest takes it (weight:
  readers x speed), equal finishes going round the servers in turn; ``V`` is the latest start
  given. Over equal servers that is round-robin; over unequal ones, in the long run, each
  server's share of the requests is its weight over the total. When the server whose turn it
  is has no credit, the request goes out of turn only to a server as fast as the fastest
  with a reader idle (it waits behind no other request there), else it waits for a credit:
  a slower server, or one whose readers are busy, never takes more than its turns, which
  would hold up the batches after it. A server that could not take its turns (its credits
  in use, or stalled) keeps up to its credits of them, so a moment's hold-up does not cost
  it its share, and no more than its credits go to it in a burst after a long one. A server
  that joins (or joins again) starts at ``V``.
* **Stalled.** A server holding requests that answered none for ``STALL`` of its service times
  (those of the fastest server while it has no estimate of its own) is stalled: the scheduler
  gives it no new request while a server that answers may take it; the requests it holds are
  left to the liveness and late rules.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

SERVICE_MEMORY = 16  # the latest samples whose median is the service-time estimate
MIN_SAMPLES = 8  # samples before a server's estimate may cut its share
EQUAL_WITHIN = 2.0  # service times within this factor of the fastest count as equal
STALL = 16.0  # a server silent for this many service times while holding requests: stalled
MIN_WAIT_S = 1e-6  # the shortest sample (a clock that did not move)
_TIE = 1e-9  # finishes this close (relative) are equal


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (at least one), as ``statistics.median`` has it (the mean of
    the middle two of an even count), without its checks and conversions: a reply's cost."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass
class Pace:
    """One joined server's part in the sharing (see the module).

    Attributes:
        readers: its reader processes.
        credits: the credits it granted (the turns it may keep while it cannot take them).
        finish: the virtual finish tag of its latest request.
        answered: when its latest reply arrived (or it joined).
        samples: the logs of its latest service-time samples (log seconds), oldest first.
        log_service: their median; 0 without any.
    """

    readers: int
    credits: int
    finish: float
    answered: float
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SERVICE_MEMORY))
    log_service: float = 0.0

    def sample(self, waited: float, held: int) -> None:
        """A reply ``waited`` seconds after its request, sent while the server held ``held``
        requests (itself counted)."""
        rounds = math.ceil(max(held, 1) / self.readers)
        self.samples.append(math.log(max(waited, MIN_WAIT_S) / rounds))
        self.log_service = median(self.samples)


class Shares:
    """The sharing of requests over the joined servers (see the module for the rules).

    Thread invariant: used by the I/O thread only (through the scheduler).
    """

    def __init__(self) -> None:
        self._paces: dict[int, Pace] = {}
        self._clock = 0.0  # V: the latest start given
        self._last = -1  # the server given the latest request (equal finishes go round)

    def join(self, server: int, readers: int, credits: int, now: float) -> None:
        """Server ``server`` joined (or joined again) at ``now`` with ``readers`` reader
        processes and ``credits`` credits: its estimate starts anew, its turns at ``V``."""
        self._paces[server] = Pace(readers, credits, finish=self._clock, answered=now)

    def answered(self, server: int, now: float, waited: float | None = None,
                 held: int = 1) -> None:
        """A reply from ``server`` arrived at ``now``: to a request sent ``waited`` seconds
        before while the server held ``held`` requests (a sample), or to a request whose
        details were forgotten (``waited`` None: it still answers)."""
        p = self._paces[server]
        p.answered = now
        if waited is not None:
            p.sample(waited, held)

    def service(self, server: int) -> float | None:
        """``server``'s estimated service time (seconds), or None before its first reply."""
        p = self._paces[server]
        return math.exp(p.log_service) if p.samples else None

    def _fastest(self, usable: Sequence[int], min_samples: int) -> float | None:
        """The lowest log service time of the ``usable`` servers with ``min_samples``."""
        logs = [self._paces[i].log_service for i in usable
                if len(self._paces[i].samples) >= min_samples]
        return min(logs, default=None)

    def weight(self, server: int, usable: Sequence[int]) -> float:
        """``server``'s weight among the ``usable`` servers: its readers, cut in proportion
        when its service time is more than ``EQUAL_WITHIN`` times the fastest's."""
        return self._weight(self._paces[server], self._fastest(usable, MIN_SAMPLES))

    @staticmethod
    def _weight(p: Pace, fastest: float | None) -> float:
        if (fastest is None or len(p.samples) < MIN_SAMPLES
                or p.log_service - fastest <= math.log(EQUAL_WITHIN)):
            return float(p.readers)
        return p.readers * math.exp(fastest - p.log_service)

    def stalled_at(self, server: int, oldest: float | None, usable: Sequence[int]) -> float:
        """When ``server`` is (or was) stalled from, given that its oldest request was sent
        at ``oldest`` (None: it holds none); infinite when it cannot be."""
        p = self._paces[server]
        logs = p.log_service if p.samples else self._fastest(usable, 1)
        if oldest is None or logs is None:
            return math.inf
        return max(p.answered, oldest) + STALL * math.exp(logs)

    def pick(self, pool: Sequence[int], ready: Collection[int], usable: Sequence[int],
             held: Mapping[int, int]) -> int | None:
        """The server that takes the next request, if one takes it now; its turn is counted.

        Args:
            pool: the servers that may take it (usable, not holding it, answering).
            ready: those of ``pool`` with credit.
            usable: every usable server (for the fastest service time).
            held: requests each server of ``pool`` holds.

        Returns:
            The server of ``pool`` whose turn it is (lowest finish) when it has credit; else
            the next of ``ready`` in turn that is as fast as the fastest and has a reader
            idle (a request out of turn never waits behind another); else None: wait for a
            credit.
        """
        fastest = self._fastest(usable, MIN_SAMPLES)
        if len(pool) == 1:  # one server may take it (one per rank is common): its turn
            only = pool[0]
            if only not in ready:
                return None
            p = self._paces[only]
            weight = self._weight(p, fastest)
            start = max(p.finish, self._clock - p.credits / weight)
            return self._turn(only, start, start + 1.0 / weight)
        weights = {i: self._weight(self._paces[i], fastest) for i in pool}
        starts = {i: max(self._paces[i].finish,
                         self._clock - self._paces[i].credits / weights[i]) for i in pool}
        finishes = {i: starts[i] + 1.0 / weights[i] for i in pool}
        span = max(self._paces) + 1
        low = min(finishes.values(), default=0.0)
        tie = _TIE * max(1.0, abs(low))
        order = sorted(pool, key=lambda i: (round((finishes[i] - low) / tie),
                                            (i - self._last - 1) % span))
        best = next((i for i in order if i in ready and (
            i == order[0] or (held[i] < self._paces[i].readers
                              and weights[i] == self._paces[i].readers))), None)
        return None if best is None else self._turn(best, starts[best], finishes[best])

    def _turn(self, server: int, start: float, finish: float) -> int:
        """``server`` takes the request, its turn from ``start`` to ``finish``."""
        self._paces[server].finish = finish
        self._clock = max(self._clock, start)
        self._last = server
        return server
