"""The batches of one epoch generation still to request and to receive. Pure, no sockets."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from dataflow.client.slots import Slot
from dataflow.plan import Batches


@dataclass
class EpochWork:
    """Batches ``first``, ``first + 1``, ... of generation ``gen``: which are requested, which
    are *open* (requested, no reply accepted yet) and which to request again.

    Thread invariant: used by the I/O thread only (through the scheduler).
    """

    gen: int
    batches: Batches
    first: int
    next_request: int = field(init=False)
    open: set[int] = field(default_factory=set)
    retry: list[int] = field(default_factory=list)  # a heap of open batches to request again

    def __post_init__(self) -> None:
        self.next_request = self.first

    def _unsent_due(self, taken: int, window: int) -> bool:
        return (self.next_request < self.first + len(self.batches)
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
        return (not self.retry and self.next_request < self.first + len(self.batches)
                and self.next_request - self.first - taken >= window)

    def waiting(self, taken: int, window: int) -> bool:
        """Whether a server is needed now (open batches, or batches due to be requested)."""
        return bool(self.open) or self._unsent_due(taken, window)

    def accept(self, slot: Slot) -> bool:
        """A reply for ``slot`` arrived: True when it is the first for an open batch of this
        generation (the batch is then closed)."""
        if slot.gen != self.gen or slot.index not in self.open:
            return False
        self.open.discard(slot.index)
        return True

    def again(self, index: int) -> None:
        """A reply accepted for ``index`` could not be delivered: request it again."""
        self.open.add(index)
        heapq.heappush(self.retry, index)

    def requeue(self, indexes: Iterable[int]) -> None:
        """Request these batches again, those still open and not queued already."""
        for index in indexes:
            if index in self.open and index not in self.retry:
                heapq.heappush(self.retry, index)
