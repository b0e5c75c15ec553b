"""Fetching what the consumer wants: which batches are requested, open, late, or to ask again.
Pure, no sockets.

The consumer's :class:`~dataflow.client.stream.Demand` names the batches of one stream
generation; a :class:`Fetch` follows it while it grows (a pass appended, read ahead) and
advances (the consumer began that pass), and a new generation gets a new :class:`Fetch`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dataflow.client.slots import Slot
from dataflow.client.stream import Demand
from dataflow.errors import InternalError
from dataflow.wire import BatchTag


@dataclass
class Fetch:
    """The requests for ``demand``'s batches: which are requested, which are *open*
    (requested, no reply accepted yet) and which to request again.

    Batches are requested in order from ``demand.first``, at most ``depth`` of them requested
    and not taken by the consumer (who took ``taken``: the index of the batch it takes next);
    a request may carry a run of consecutive batches of one pass (:meth:`run`), each open on
    its own, and a new request waits until a whole run (``group`` batches, or the rest of the
    pass) is within the depth: a consumer taking batches one by one frees the depth one batch
    at a time, and requests of one batch each would undo the grouping. A batch to request
    again goes alone.

    Thread invariant: used by the I/O thread only (through the scheduler).
    """

    demand: Demand
    next_request: int = field(init=False)
    open: set[int] = field(default_factory=set)
    retry: list[int] = field(default_factory=list)  # a heap of open batches to request again
    late: dict[int, float] = field(default_factory=dict)  # open batch -> when it was re-asked
    # for want of a reply within the request timeout
    queued: dict[int, float] = field(default_factory=dict)  # batch in ``retry`` -> since when

    def __post_init__(self) -> None:
        self.next_request = self.demand.first

    @property
    def gen(self) -> int:
        return self.demand.gen

    def follow(self, demand: Demand) -> None:
        """The consumer's demand of this generation changed: a pass was appended, or the
        consumer began it (the pass before it, taken whole, is dropped).

        Raises:
            InternalError: ``demand`` is of another generation, drops a batch not received
                yet, or ends before a batch already wanted.
        """
        lowest = min(self.open, default=self.next_request)
        if (demand.gen != self.gen or not self.demand.first <= demand.first <= lowest
                or demand.end < self.demand.end):
            raise InternalError(f"demand of generation {demand.gen} for batches "
                                f"[{demand.first}, {demand.end}) after generation {self.gen}'s "
                                f"[{self.demand.first}, {self.demand.end}) with batch {lowest} "
                                "not received")
        self.demand = demand

    def batch(self, index: int) -> tuple[np.ndarray, BatchTag]:
        """Batch ``index``'s ``(shard, start, stop)`` rows and its tag."""
        return self.demand.batch(index)

    def _unsent_due(self, taken: int, depth: int) -> bool:
        return self.next_request < self.demand.end and self.next_request - taken < depth

    def _run_due(self, taken: int, depth: int, group: int) -> bool:
        """Whether the next run may be requested: a whole one (``group`` batches, or the rest
        of its pass) fits within ``depth``."""
        index = self.next_request
        if index >= self.demand.end:
            return False
        room = taken + depth - index
        if room >= group:  # a whole run fits, however short its pass makes it
            return True
        return group > 1 and room >= min(group, self.demand.run_end(index) - index)

    def peek(self, taken: int, depth: int, group: int = 1) -> int | None:
        """The batch to request next, or None: the lowest open batch to request again, else
        the next in order once a whole run of up to ``group`` fits within ``depth``
        requested and not taken."""
        while self.retry and self.retry[0] not in self.open:
            heapq.heappop(self.retry)
        if self.retry:
            return self.retry[0]
        return self.next_request if self._run_due(taken, depth, group) else None

    def retrying(self, index: int) -> bool:
        """Whether :meth:`peek`'s ``index`` is a batch to request again."""
        return bool(self.retry) and self.retry[0] == index

    def run(self, index: int, taken: int, depth: int, group: int) -> int:
        """How many batches from ``index`` (:meth:`peek`'s, not one to request again) one
        request takes: at most ``group``, within its pass (:meth:`Demand.run_end`) and within
        ``depth``; at least 1."""
        if group == 1:
            return 1
        return max(1, min(group, self.demand.run_end(index) - index,
                          taken + depth - index))

    def claim(self, index: int, count: int = 1) -> bool:
        """The batch :meth:`peek` gave, and the ``count - 1`` after it (:meth:`run`), are
        requested now; returns whether it is a re-request (then ``count`` is 1).

        Raises:
            InternalError: a re-request of more than one batch, or a run that is not next.
        """
        if self.retry and self.retry[0] == index:
            if count != 1:
                raise InternalError(f"batch {index} requested again with {count - 1} more")
            heapq.heappop(self.retry)
            self.queued.pop(index, None)
            return True
        if index != self.next_request or index + count > self.demand.end:
            raise InternalError(f"batches [{index}, {index + count}) claimed; the next to "
                                f"request is {self.next_request} of [{self.demand.first}, "
                                f"{self.demand.end})")
        self.next_request += count
        self.open.update(range(index, index + count))
        return False

    def full(self, taken: int, depth: int, group: int = 1) -> bool:
        """True when only the consumer taking batches lets more requests go out."""
        return self.unblocked_at(taken, depth, group) is not None

    def unblocked_at(self, taken: int, depth: int, group: int = 1) -> int | None:
        """When only the consumer taking batches lets more requests go out: how many it must
        have taken (more than ``taken``) for the next whole run to fit; else None."""
        index = self.next_request
        if self.retry or index >= self.demand.end or self._run_due(taken, depth, group):
            return None
        whole = 1 if group == 1 else min(group, self.demand.run_end(index) - index)
        return index + whole - depth

    def waiting(self, taken: int, depth: int) -> bool:
        """Whether a server is needed now: batches of the pass the consumer reads open, or
        due to be requested (not those of a pass read ahead that it has not begun)."""
        needed = self.demand.needed
        return (any(i < needed for i in self.open)
                or (self._unsent_due(taken, depth) and self.next_request < needed))

    def accept(self, slot: Slot) -> tuple[int, ...]:
        """A reply for ``slot`` arrived: its batches for which it is the first reply (open
        batches of this generation), which are then closed; the others' parts of the reply
        are to be discarded."""
        if slot.gen != self.gen:
            return ()
        first = tuple(i for i in slot.indexes if i in self.open)
        for i in first:
            self.close(i)
        return first

    def close(self, index: int) -> None:
        """Batch ``index`` is done with (answered, or failed): later replies are discarded."""
        self.open.discard(index)
        self.late.pop(index, None)
        self.queued.pop(index, None)

    def again(self, index: int, now: float) -> None:
        """A reply accepted for ``index`` could not be delivered: request it again."""
        self.open.add(index)
        heapq.heappush(self.retry, index)
        self.queued.setdefault(index, now)

    def requeue(self, indexes: Iterable[int], now: float) -> None:
        """Request these batches again, those still open and not queued already."""
        for index in indexes:
            if index in self.open and index not in self.retry:
                heapq.heappush(self.retry, index)
                self.queued.setdefault(index, now)
