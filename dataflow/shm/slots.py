"""Which slots of a client's segment are free, lent to a request, or still being read: pure.

The client lends a free slot with a REQUEST (a slot is a credit of shared memory); the server's
reader writes the batch's arrays there and answers a BATCH whose descriptor
(:class:`~dataflow.wire.ShmRef`) names the slot. :meth:`SlotLedger.take` checks that
descriptor against what was lent: a BATCH naming a slot not lent to its request, or more bytes
than a slot holds, is a :class:`~dataflow.errors.ProtocolError` naming the endpoint: nothing is
read that the client did not lend. The slot comes back when the client has read it
(:meth:`SlotLedger.release`, at once, or once a device copy from it finished), or when the
request got any other answer (an ERROR, a BATCH in TCP frames: :meth:`SlotLedger.answered`).
The slot freed last is lent first: a session writes only as many slots as it has in use at
once, and a slot's memory is taken the first time it is written (the segment is sparse).

An impossible state (a request lent two slots, a slot released twice) raises ``RuntimeError``.

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from dataflow.errors import ProtocolError


class SlotLedger:
    """The slots of one segment of ``slots`` slots of ``slot_bytes`` bytes.

    Attributes:
        slot_bytes: bytes of one slot.
    """

    def __init__(self, slots: int, slot_bytes: int) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a ledger needs slots and bytes. Found: {slots}, {slot_bytes}")
        self.slot_bytes = slot_bytes
        self._free: deque[int] = deque(reversed(range(slots)))  # lent from the right
        self._lent: dict[int, int] = {}  # req_id -> slot
        self._reading: list[tuple[int, Callable[[], bool]]] = []  # (slot, done) read by a copy
        self._slots = slots

    @property
    def free(self) -> int:
        """Slots free to lend now (slots whose copy finished included)."""
        self._reap()
        return len(self._free)

    @property
    def lent(self) -> int:
        return len(self._lent)

    def _reap(self) -> None:
        if self._reading:
            still = []
            for slot, done in self._reading:
                (self._free.append(slot) if done() else still.append((slot, done)))
            self._reading = still

    def lend(self, req_id: int) -> int:
        """A free slot for request ``req_id``, or -1 when none is free (the request then asks
        for TCP frames).

        Raises:
            RuntimeError: ``req_id`` holds a slot already.
        """
        if req_id in self._lent:
            raise RuntimeError(f"request {req_id} holds slot {self._lent[req_id]} already")
        self._reap()
        if not self._free:
            return -1
        slot = self._free.pop()
        self._lent[req_id] = slot
        return slot

    def answered(self, req_id: int) -> None:
        """Request ``req_id`` got an answer that is not in its slot (an ERROR, a BATCH in TCP
        frames, a reply discarded): its slot, if it holds one, is free again."""
        slot = self._lent.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)

    def take(self, req_id: int, slot: int, nbytes: int, endpoint: str) -> int:
        """The slot a BATCH of request ``req_id`` says it wrote ``nbytes`` bytes into; it is
        the caller's to read until :meth:`release`.

        Raises:
            ProtocolError: no slot was lent to ``req_id``, another one was, or ``nbytes``
                exceeds a slot (naming ``endpoint`` and the request); the lent slot is not
                lent again (the server may still write there).
        """
        lent = self._lent.get(req_id)
        if lent is None:
            raise ProtocolError(f"{endpoint}: BATCH {req_id} names shared-memory slot {slot}, "
                                "but no slot was lent to that request")
        if slot != lent:
            raise ProtocolError(f"{endpoint}: BATCH {req_id} names shared-memory slot {slot}, "
                                f"but slot {lent} was lent to it")
        if not 0 <= nbytes <= self.slot_bytes:
            raise ProtocolError(f"{endpoint}: BATCH {req_id} says {nbytes} bytes are in its "
                                f"shared-memory slot, which holds {self.slot_bytes}")
        del self._lent[req_id]
        return slot

    def release(self, slot: int, done: Callable[[], bool] | None = None) -> None:
        """The caller read ``slot`` (taken): free at once, or once ``done()`` is true (a device
        copy from it finished).

        Raises:
            RuntimeError: ``slot`` is free or lent already.
        """
        if (not 0 <= slot < self._slots or slot in self._free
                or slot in self._lent.values() or any(s == slot for s, _ in self._reading)):
            raise RuntimeError(f"slot {slot} released but not taken")
        if done is None:
            self._free.append(slot)
        else:
            self._reading.append((slot, done))
