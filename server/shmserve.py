"""The server's side of same-host shared memory: proving a client's segment, checking a
REQUEST's slot, and writing replies into it.

A client on this host offers, in its HELLO, a segment it created in ``/dev/shm``
(:mod:`dataflow.shm`). The frontend opens it (:func:`prove`): only a regular file of this
server's own user, mode 0600, of the announced size, with the client's header; it answers the
nonce found there in INDEX ``shm``, which is the client's proof that this server opened *its*
file (same host, same user, same ``/dev/shm``). The server never creates a segment: it maps
only what a client named, and only while that client keeps it (a reader drops a mapping once
the client unlinked the file, or after ``IDLE_S`` unused: :meth:`Segments.sweep`).

A REQUEST of such a session may lend a slot (:func:`slot_problem` checks it); its reader
writes the batch's arrays there, laid out by :class:`~dataflow.wire.BatchLayout`, and answers
a BATCH whose ``shm`` descriptor names the slot, with no buffer frames
(:meth:`Segments.place`). A batch bigger than a slot, or a segment that cannot be mapped any
more (the client closed it), is answered in TCP frames as usual.

What the file's permissions protect: only processes of the client's user (and root) can open
it; the server proves it is one of them. With CURVE, the HELLO naming the segment and every
BATCH header (the descriptor) travel over the authenticated, encrypted sockets as before; the
arrays themselves never leave the host's memory, so their secrecy is the file's mode 0600.

Thread invariant: :func:`prove` runs on the frontend's thread; a :class:`Segments` is one
reader's.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import replace

from dataflow import wire
from dataflow.errors import SegmentError
from dataflow.server.peerlog import quote
from dataflow.shm import SHM_DIR, Geometry, Mapped, read_proof
from dataflow.wire.internal import Task

MAX_MAPPED = 64
IDLE_S = 60.0

log = logging.getLogger("dataflow.server")


def prove(offer: wire.ShmOffer | None, allowed: bool,
          client: str) -> tuple[wire.ShmOffer | None, str]:
    """The segment a HELLO offered, if this server may and can use it, and its proof.

    Args:
        offer: the HELLO's ``shm``.
        allowed: ``--shared-memory allow``.
        client: the client, as the log names it.

    Returns:
        ``(offer, nonce in hex)`` when it opened the client's segment, else ``(None, "")``
        (the session uses TCP frames; why is logged).
    """
    if offer is None:
        return None, ""
    if not allowed:
        log.info("client %s offered shared memory; refused (--shared-memory refuse)", client)
        return None, ""
    try:
        nonce = read_proof(offer.name, Geometry(offer.slots, offer.slot_bytes))
    except SegmentError as e:
        log.info("client %s offered shared memory this server cannot use (%s); TCP frames",
                 client, quote(str(e), 400))
        return None, ""
    return offer, nonce.hex()


def slot_problem(slot: int, shm: wire.ShmOffer | None) -> str | None:
    """Why a REQUEST may not lend ``slot`` (-1: none lent) to a session whose proved segment
    is ``shm``, or None."""
    if slot < 0:
        return None
    if shm is None:
        return (f"REQUEST lends shared-memory slot {slot}, but this session has no "
                "shared-memory segment (none offered, or this server could not open it)")
    if slot >= shm.slots:
        return f"REQUEST lends shared-memory slot {slot}; the session's segment has {shm.slots}"
    return None


class Segments:
    """The segments one reader writes replies into, mapped once each, by name (at most
    ``cap``, least recently used unmapped first).

    Args:
        cap: mappings kept at once.
        idle_s: seconds after which an unused mapping is dropped by :meth:`sweep`.
        directory: where segments are (``/dev/shm``).
    """

    def __init__(self, cap: int = MAX_MAPPED, idle_s: float = IDLE_S,
                 directory: str = SHM_DIR) -> None:
        self._directory = directory
        self._cap = cap
        self._idle_s = idle_s
        self._mapped: OrderedDict[str, tuple[Mapped, float]] = OrderedDict()
        self.written = 0

    def __len__(self) -> int:
        return len(self._mapped)

    def _get(self, shm: wire.ShmOffer, now: float) -> Mapped:
        entry = self._mapped.pop(shm.name, None)
        geometry = Geometry(shm.slots, shm.slot_bytes)
        if entry is None or entry[0].geometry != geometry or entry[0].gone():
            if entry is not None:
                entry[0].close()
            entry = (Mapped(shm.name, geometry, self._directory), now)
        self._mapped[shm.name] = (entry[0], now)
        while len(self._mapped) > self._cap:
            self._mapped.popitem(last=False)[1][0].close()
        return entry[0]

    def place(self, task: Task, msg: wire.BatchMsg) -> wire.BatchMsg:
        """Write ``msg``'s arrays into the slot ``task`` lent and return the BATCH describing
        them there (no data); ``msg`` itself when the task lent no slot, the batch does not
        fit one, or the segment cannot be used (the client closed it, ``/dev/shm`` is full; logged):
        it then travels in frames."""
        if task.shm is None or task.slot < 0:
            return msg
        layout = wire.BatchLayout.of(msg)
        if layout.nbytes > task.shm.slot_bytes:
            log.debug("request %d: batch of %d bytes exceeds a shared-memory slot (%d); TCP "
                      "frames", task.req_id, layout.nbytes, task.shm.slot_bytes)
            return msg
        try:
            mapped = self._get(task.shm, time.monotonic())
            mapped.reserve(task.slot, layout.nbytes)
            for pieces, offset in zip(wire.array_pieces(msg, layout), layout.offsets,
                                      strict=True):
                for piece in pieces:
                    mapped.write(task.slot, offset, piece.data)
                    offset += piece.nbytes
        except SegmentError as e:
            if isinstance(e.__cause__, FileNotFoundError):  # the client closed it: not news
                log.debug("request %d: the client removed its shared-memory segment (%s); TCP "
                          "frames", task.req_id, quote(str(e), 400))
            else:
                log.warning("request %d: shared memory unusable (%s); TCP frames", task.req_id,
                            quote(str(e), 400))
            return msg
        self.written += 1
        return replace(msg, data=(), shm=wire.ShmRef(task.slot, layout.nbytes), apart=False)

    def sweep(self, now: float) -> None:
        """Unmap the segments their client unlinked, and those unused for ``idle_s``."""
        for name, (mapped, used) in list(self._mapped.items()):
            if mapped.gone() or now - used > self._idle_s:
                del self._mapped[name]
                mapped.close()

    def close(self) -> None:
        """Unmap every segment (idempotent)."""
        while self._mapped:
            self._mapped.popitem()[1][0].close()
