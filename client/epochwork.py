"""The batches of one epoch generation still to request and to receive. Pure, no sockets.

A generation is a stream of batches: the pass it was started for, then any passes appended to
it (:meth:`EpochWork.extend`: the loader's next epoch, requested ahead while the current one
ends). Batch indexes run on across the passes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dataflow.client.handoff import Tags
from dataflow.client.slots import Slot
from dataflow.errors import InternalError
from dataflow.plan import Batches
from dataflow.wire import BatchTag


@dataclass
class EpochWork:
    """Batches ``first``, ``first + 1``, ... of generation ``gen``: which are requested, which
    are *open* (requested, no reply accepted yet) and which to request again.

    ``batches`` are batches ``first``... of the pass, tagged ``tags.of(i)`` for the pass's batch
    ``i``; :meth:`extend` appends more passes.

    Thread invariant: used by the I/O thread only (through the scheduler).
    """

    gen: int
    batches: Batches
    first: int
    tags: Tags = Tags()
    next_request: int = field(init=False)
    end: int = field(init=False)  # one past the last batch of the stream
    needed: int = field(init=False)  # one past the last batch of the pass the consumer is in
    open: set[int] = field(default_factory=set)
    retry: list[int] = field(default_factory=list)  # a heap of open batches to request again
    late: dict[int, float] = field(default_factory=dict)  # open batch -> when it was re-asked
    # for want of a reply within the request timeout
    # (index of its first batch, its batches, index its tags count from), latest first
    _passes: list[tuple[int, Batches, int, Tags]] = field(default_factory=list, init=False,
                                                          repr=False)

    def __post_init__(self) -> None:
        self.next_request = self.first
        self.end = self.first + len(self.batches)
        self.needed = self.end
        self._passes.append((self.first, self.batches, 0, self.tags))

    def need(self, end: int) -> None:
        """Batches before ``end`` are needed by the consumer (a pass appended ahead began)."""
        if not self.needed <= end <= self.end:
            raise InternalError(f"pass ending at {end} needed; the generation has batches up "
                                f"to {self.end}, {self.needed} needed already")
        self.needed = end

    def extend(self, batches: Batches, tags: Tags) -> None:
        """Append a pass: its batch ``i`` is batch ``end + i`` of this generation.

        Passes whose batches are all requested and received are forgotten (a generation may
        run for many epochs).
        """
        lowest = min(self.open, default=self.next_request)
        ends = [self.end] + [start for start, *_ in self._passes[:-1]]
        self._passes = [p for p, end in zip(self._passes, ends, strict=True) if end > lowest]
        self._passes.insert(0, (self.end, batches, self.end, tags))
        self.end += len(batches)

    def request(self, index: int) -> tuple[np.ndarray, BatchTag]:
        """Batch ``index``'s ``(shard, start, stop)`` rows and its tag."""
        for start, batches, origin, tags in self._passes:
            if index >= start:
                return batches.rows(index - start), tags.of(index - origin)
        raise InternalError(f"batch {index} is before the generation's first, {self.first}")

    def _unsent_due(self, taken: int, window: int) -> bool:
        return (self.next_request < self.end
                and self.next_request - self.first - taken < window)

    def peek(self, taken: int, window: int) -> int | None:
        """The batch to request next, or None: the lowest open batch to request again, else
        the next in plan order while fewer than ``window`` are requested and not taken (the
        consumer took ``taken``)."""
        while self.retry and self.retry[0] not in self.open:
            heapq.heappop(self.retry)
        if self.retry:
            return self.retry[0]
        return self.next_request if self._unsent_due(taken, window) else None

    def retrying(self, index: int) -> bool:
        """Whether :meth:`peek`'s ``index`` is a batch to request again."""
        return bool(self.retry) and self.retry[0] == index

    def claim(self, index: int) -> bool:
        """The batch :meth:`peek` gave is requested now; returns whether it is a re-request."""
        if self.retry and self.retry[0] == index:
            heapq.heappop(self.retry)
            return True
        self.next_request += 1
        self.open.add(index)
        return False

    def full(self, taken: int, window: int) -> bool:
        """True when only the consumer taking batches lets more requests go out."""
        return (not self.retry and self.next_request < self.end
                and self.next_request - self.first - taken >= window)

    def waiting(self, taken: int, window: int) -> bool:
        """Whether a server is needed now: batches of the consumer's pass open, or due to be
        requested (not those of a pass appended ahead that the consumer has not begun)."""
        return (any(i < self.needed for i in self.open)
                or (self._unsent_due(taken, window) and self.next_request < self.needed))

    def accept(self, slot: Slot) -> bool:
        """A reply for ``slot`` arrived: True when it is the first for an open batch of this
        generation (the batch is then closed)."""
        if slot.gen != self.gen or slot.index not in self.open:
            return False
        self.close(slot.index)
        return True

    def close(self, index: int) -> None:
        """Batch ``index`` is done with (answered, or failed): later replies are discarded."""
        self.open.discard(index)
        self.late.pop(index, None)

    def again(self, index: int) -> None:
        """A reply accepted for ``index`` could not be delivered: request it again."""
        self.open.add(index)
        heapq.heappush(self.retry, index)

    def requeue(self, indexes: Iterable[int]) -> None:
        """Request these batches again, those still open and not queued already."""
        for index in indexes:
            if index in self.open and index not in self.retry:
                heapq.heappush(self.retry, index)
