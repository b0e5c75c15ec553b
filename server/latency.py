"""How long this server takes per request: from a REQUEST's admission to its reply handed to
ZeroMQ (the reader's SENT notice, or the ERROR the frontend sends in its place), exported as
the ``dataflow_request_seconds`` histogram. The queue, the read, the ``--transform`` and the
wait for a reader are in it; the transfer to the client is not.

Pure: the clock is passed in (a fake one in the tests). Bounded: an entry per request not yet
answered (at most the credits of the open sessions); a closed session's are forgotten.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the histogram's buckets; a last one holds the rest (+Inf)."""


@dataclass(frozen=True)
class Histogram:
    """What a scrape shows: ``counts[i]`` requests took at most ``BUCKETS[i]`` seconds
    (cumulative; the last is every request), taking ``total_s`` seconds together."""

    counts: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    total_s: float = 0.0


class Latency:
    """Admission times of the requests not answered yet, and the histogram of those answered."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started: dict[tuple[bytes, int], float] = {}
        self._counts = [0] * (len(BUCKETS) + 1)
        self._total_s = 0.0

    def __len__(self) -> int:
        """Requests admitted and not answered yet."""
        return len(self._started)

    def start(self, token: bytes, req_id: int) -> None:
        """Request ``req_id`` of session ``token`` was admitted now."""
        self._started[(token, req_id)] = self._clock()

    def finish(self, token: bytes, req_id: int) -> None:
        """Request ``req_id`` of session ``token`` was answered now (nothing if it was not
        admitted: a refused request's ERROR)."""
        began = self._started.pop((token, req_id), None)
        if began is None:
            return
        took = max(self._clock() - began, 0.0)
        self._total_s += took
        bucket = next((i for i, bound in enumerate(BUCKETS) if took <= bound), len(BUCKETS))
        self._counts[bucket] += 1

    def forget(self, token: bytes) -> None:
        """Session ``token`` closed: its requests will not be answered."""
        for key in [k for k in self._started if k[0] == token]:
            del self._started[key]

    def histogram(self) -> Histogram:
        """The histogram so far (cumulative counts)."""
        cumulative, running = [], 0
        for n in self._counts:
            running += n
            cumulative.append(running)
        return Histogram(tuple(cumulative), self._total_s)
