"""The client's side of same-host shared memory: one segment per server session, its slots
lent with REQUESTs, and batches read from them.

Per server join (:mod:`dataflow.client.joins`) the client creates a fresh segment in
``/dev/shm`` (:class:`dataflow.shm.Segment`: mode 0600, a random name carrying its uid, PID
namespace and pid; sparse, memory is taken as slots are written) and offers it in the HELLO.
The server answers the nonce it read there in INDEX ``shm``; only when it is this segment's
does the session use it (a server on another host, of another user or in another
``/dev/shm`` cannot read it; one that refuses, ``--shared-memory refuse``, or predates the
field answers none; an old server that refuses the unknown HELLO field is asked again without
it). Otherwise the segment is unlinked at once and the session uses TCP frames.

A REQUEST then lends a free slot (:class:`~dataflow.shm.SlotLedger`; none free: TCP frames for
it); the reader writes the arrays there and answers a BATCH whose descriptor names it, which
is checked against what was lent (:meth:`ShmRings.take`), read (:func:`receive_shared`) and
the slot given back. A segment is unlinked when its session ends (the server lost, or joining
again: a reader still holding a request of the old session writes into memory nobody reads,
and its reply is discarded as late) and when the loader closes; one left by a killed loader
is removed by the next loader start of the same user (:func:`dataflow.shm.remove_stale`).

No copy on the client where it can be helped (:func:`receive_shared`): unpinned CPU batches
are views of their slot, which is lent again once the batch's tensors are all freed (at most
the requests kept at the server and :data:`VIEWS` more held at once, those waiting in the
hand-off included; beyond, a batch is copied out). With a CUDA ``device`` a slot's bytes are
registered with ``cudaHostRegister`` as they are first read (:func:`cuda_register`, the one
seam that touches CUDA: it does nothing without it; a session pins what its slots in use
were written, not its whole segment), and a :class:`CudaSink`'s host-to-device copy reads the
slot itself; the slot is lent again once that copy finished. Otherwise a batch is copied out
of its slot into memory of its own: the CUDA ring's slot, or, for pinned CPU batches, a
buffer of torch's caching host allocator, never a view of the slot: a training loop's
``non_blocking`` copy from such a buffer is guarded by the allocator (it is not reused
before the copy ran), while a slot given back is written again at once. Every batch is
checked by :meth:`dataflow.wire.BatchLayout.check_frames` first.

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
import zmq

from dataflow import wire
from dataflow.client.buffers import (
    BufferLanding,
    CopyEvent,
    CudaSink,
    HostSink,
    Received,
    typed_views,
)
from dataflow.client.parts import split
from dataflow.client.receive import drain
from dataflow.client.scheduler import requests_kept
from dataflow.errors import ProtocolError, SegmentError
from dataflow.shm import HEADER_BYTES, SHM_DIR, Geometry, Segment, SlotLedger, remove_stale

log = logging.getLogger("dataflow.client")

Register = Callable[[memoryview], Callable[[], None] | None]
# Slots of a ring beyond twice the requests a loader may keep at its server: a loader's
# batches are either views of their slots (CPU: held at once, waiting in the hand-off or the
# consumer's; up to the requests it keeps at the server worth of replies of several batches
# waiting, and this many slots more) or read by device copies (a CUDA ``device``), never
# both.
VIEWS = 3
# Slots are made of whole pages of this many bytes (the segment's header is one): a slot's
# registration with CUDA covers pages of its own on hosts of 4 KiB pages.
PAGE_BYTES = HEADER_BYTES


def cuda_register(buf: memoryview) -> Callable[[], None] | None:
    """Register ``buf`` as pinned host memory with CUDA; returns its unregistration, or None
    (no CUDA, or the registration failed: logged)."""
    if not torch.cuda.is_available():
        return None
    cudart = torch.cuda.cudart()
    base = torch.frombuffer(buf, dtype=torch.uint8)
    ptr, size = base.data_ptr(), base.numel()
    try:
        err = cudart.cudaHostRegister(ptr, size, 0)
    except (RuntimeError, AttributeError) as e:
        err = e
    if err != cudart.cudaError.success:
        log.warning("cudaHostRegister of the shared-memory segment failed (%s); batches are "
                    "copied into pinned buffers", err)
        return None
    return lambda: cudart.cudaHostUnregister(ptr)


def _unpinned(buf: memoryview) -> None:
    """No registration."""
    return None


class Ring:
    """One server session's segment and its slots.

    Args:
        segment: the segment.
        register: registers memory with CUDA (or does nothing): a slot's bytes as they are
            first read by a device copy (:meth:`pinned`), so a session pins what its slots in
            use were written, not its whole segment.
        views: the most slots held by batches viewing them at once (beyond, batches are
            copied out): the requests kept at its server and :data:`VIEWS` more.

    Attributes:
        segment: the segment.
        ledger: its slots.
    """

    def __init__(self, segment: Segment, register: Register, views: int) -> None:
        self.segment = segment
        self._most_views = views
        self.ledger = SlotLedger(segment.geometry.slots, segment.geometry.slot_bytes)
        self._register: Register | None = register
        self._pinned: dict[int, tuple[int, Callable[[], None]]] = {}  # slot -> bytes, undo
        self._host: torch.Tensor | None = None
        self._copies: list[CopyEvent] = []
        self._views: list[weakref.ref[np.ndarray]] = []

    def pinned(self, slot: int, nbytes: int) -> torch.Tensor | None:
        """A uint8 tensor over the whole segment when the first ``nbytes`` of ``slot`` (taken)
        are registered with CUDA, so that a device copy reads them in place; else None: no
        CUDA, or a registration failed (logged; none is tried after it). A slot is
        registered in whole pages the first time it is read, and again, larger, when a
        larger reply comes (nothing reads a slot that was lent again)."""
        held = self._pinned.get(slot)
        if held is None or held[0] < nbytes:
            if self._register is None:
                return None
            if held is not None:
                del self._pinned[slot]
                held[1]()
            geometry = self.segment.geometry
            size = min(-(-max(nbytes, 1) // PAGE_BYTES) * PAGE_BYTES, geometry.slot_bytes)
            start = geometry.offset(slot)
            unregister = self._register(self.segment.buf[start : start + size])
            if unregister is None:
                self._register = None
                return None
            self._pinned[slot] = (size, unregister)
        if self._host is None:
            self._host = torch.frombuffer(self.segment.buf, dtype=torch.uint8)
        return self._host

    def may_view(self) -> bool:
        """Whether a batch may be a view of its slot (fewer than ``views`` slots are held as
        views)."""
        self._views = [v for v in self._views if v() is not None]
        return len(self._views) < self._most_views

    def viewed(self, arr: np.ndarray) -> Callable[[], bool]:
        """Track a batch viewing a slot through ``arr`` (every tensor of the batch holds it);
        returns whether it is gone (every tensor of it freed, on whichever thread: its weak
        reference is then dead)."""
        view = weakref.ref(arr)
        self._views.append(view)
        return lambda: view() is None

    def copied(self, event: CopyEvent) -> Callable[[], bool]:
        """Track a device copy reading a slot; returns whether it finished."""
        self._copies = [e for e in self._copies if not e.query()]
        self._copies.append(event)
        return event.query

    def close(self) -> None:
        """Wait for the copies reading it, unregister it and unlink it (idempotent)."""
        for event in self._copies:
            event.synchronize()
        self._copies = []
        self._host = None
        for _, unregister in self._pinned.values():
            unregister()
        self._pinned.clear()
        self.segment.close()


class ShmRings:
    """The shared-memory segments of one loader's server sessions.

    Args:
        hello: the HELLO every server is sent.
        prefetch: the loader's ``prefetch``: a ring's batches held as views of their slots
            are at most the requests kept at its server (:func:`~dataflow.client.scheduler.
            requests_kept`) and :data:`VIEWS` more (:class:`Ring`'s ``views``).
        geometry: slots of each segment, or None: shared memory off (every HELLO is
            ``hello``).
        count: the loader's counters (``shm_sessions``, ``shm_batches``).
        register: how a segment's slots are pinned for device copies (:func:`cuda_register`,
            given a CUDA ``device``), or None: never (no CUDA context is made for it).
        directory: where segments are made (``/dev/shm``).
    """

    def __init__(self, hello: wire.Hello, prefetch: int, geometry: Geometry | None,
                 count: Callable[[str, int], None], register: Register | None = None,
                 directory: str = SHM_DIR) -> None:
        self._hello = hello
        self._prefetch = prefetch
        self._plain = wire.encode(hello)
        self._geometry = geometry
        self._count = count
        self._register = register
        self._directory = directory
        self._offered: dict[int, Segment] = {}  # server -> the segment its HELLO offered
        self._rings: dict[int, Ring] = {}  # server -> its session's ring, once proved
        self._old: set[int] = set()  # servers that refused the HELLO field
        if geometry is not None:
            stale = remove_stale(directory)
            if stale:
                log.warning("removed %d shared-memory segment(s) of dead loaders from %s: %s",
                            len(stale), directory, ", ".join(stale[:4]))

    def hello(self, server: int) -> list[wire.Buffer]:
        """The HELLO for a join of ``server``: offering a fresh segment (the last one of
        ``server`` is closed), or plain."""
        self.drop(server)
        if self._geometry is None or server in self._old:
            return self._plain
        try:
            seg = Segment(self._geometry, self._directory)
        except SegmentError as e:
            log.warning("shared memory off for this loader: %s; batches travel in TCP frames",
                        e)
            self._geometry = None
            return self._plain
        self._offered[server] = seg
        offer = wire.ShmOffer(seg.name, self._geometry.slots, self._geometry.slot_bytes)
        return wire.encode(replace(self._hello, shm=offer))

    def refused_field(self, server: int, msg: wire.Message) -> bool:
        """Whether ``msg`` is ``server``'s refusal of the HELLO's ``shm`` field (a server that
        predates it): it is then asked again without it (:meth:`hello`)."""
        if (server in self._offered and isinstance(msg, wire.ErrorMsg)
                and msg.kind is wire.ErrorKind.PROTOCOL
                and "unexpected field `shm`" in msg.message):
            self._old.add(server)
            return True
        return False

    def joined(self, server: int, index: wire.Index, endpoint: str) -> bool:
        """``server`` joined: its session uses the segment offered when the INDEX proves the
        server read it, else TCP frames (the segment is unlinked). Returns whether it uses
        one."""
        seg = self._offered.pop(server, None)
        if seg is None:
            return False
        if index.shm != seg.nonce.hex():
            log.info("%s: shared memory not used (%s); TCP frames", endpoint,
                     "the server did not open the segment" if not index.shm
                     else "the server read another segment's nonce")
            seg.close()
            return False
        views = requests_kept(index.credits, len(index.data), self._prefetch) + VIEWS
        self._rings[server] = Ring(seg, self._register or _unpinned, views)
        self._count("shm_sessions", 1)
        return True

    def lend(self, server: int, req: wire.Request) -> wire.Request:
        """``req`` lending a free slot of ``server``'s ring, or ``req`` (none)."""
        ring = self._rings.get(server)
        if ring is None:
            return req
        slot = ring.ledger.lend(req.req_id)
        return req if slot < 0 else replace(req, slot=slot)

    def answered(self, server: int, req_id: int) -> None:
        """Request ``req_id`` of ``server`` got an answer not read from its slot (an ERROR, a
        BATCH in frames, a reply discarded): its slot is free again."""
        ring = self._rings.get(server)
        if ring is not None:
            ring.ledger.answered(req_id)

    def take(self, server: int, msg: wire.BatchMsg, endpoint: str) -> tuple[Ring, int] | None:
        """The ring and slot holding ``msg``'s arrays, or None: they come in frames (its lent
        slot, if any, is free again).

        Raises:
            ProtocolError: the descriptor names a slot not lent to the request, bytes beyond
                a slot, or ``server`` has no proved segment (naming ``endpoint``).
        """
        ring = self._rings.get(server)
        if msg.shm is None:
            if ring is not None:
                ring.ledger.answered(msg.req_id)
            return None
        if ring is None:
            raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} names shared-memory slot "
                                f"{msg.shm.slot}, but this session has no shared memory")
        return ring, ring.ledger.take(msg.req_id, msg.shm.slot, msg.shm.nbytes, endpoint)

    def drop(self, server: int) -> None:
        """``server``'s session ended (lost, or joining again): unlink its segment."""
        seg = self._offered.pop(server, None)
        if seg is not None:
            seg.close()
        ring = self._rings.pop(server, None)
        if ring is not None:
            ring.close()

    def close(self) -> None:
        """Unlink every segment (idempotent)."""
        for server in list(self._offered) + list(self._rings):
            self.drop(server)


def receive_shared(sock: zmq.Socket, endpoint: str, msg: wire.BatchMsg, ring: Ring, slot: int,
                   sink: HostSink | CudaSink,
                   count: Callable[[str, int], None]) -> list[Received]:
    """Read the batches of ``msg`` (one, or one per ``parts`` entry:
    :func:`dataflow.client.parts.split`) from ``slot`` of ``ring`` (taken) where ``sink``
    wants them, and give the slot back: at once when they were copied out of it, when the
    device copy reading it finished (a registered slot, a CUDA ``device``), or, for
    unpinned CPU batches viewing the slot in place (no copy), once every tensor of them is
    freed; while the ring's ``views`` such slots are held, the next ones are copied out, so
    the consumer keeping batches never starves the ring.

    Raises:
        ProtocolError: buffer frames follow the header, or the arrays fail
            :meth:`~dataflow.wire.BatchLayout.check_frames` (naming the endpoint).
    """
    layout = wire.BatchLayout.of(msg)
    if drain(sock):
        raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} in shared memory must have no "
                            "buffer frames")
    nbytes = layout.nbytes
    start = ring.segment.geometry.offset(slot)
    if isinstance(sink, HostSink) and not sink.pin and ring.may_view():
        arr = np.frombuffer(ring.segment.buf, dtype=np.uint8, count=nbytes, offset=start)
        _, bounds = _check(endpoint, msg, layout, arr)
        ring.ledger.release(slot, ring.viewed(arr))
        count("shm_batches", max(1, len(msg.parts)))
        return split(Received(_tensors(msg, layout, arr)), msg, bounds)
    pinned = ring.pinned(slot, nbytes) if isinstance(sink, CudaSink) else None
    if isinstance(sink, CudaSink) and pinned is not None:
        host = pinned[start : start + nbytes]
        _, bounds = _check(endpoint, msg, layout, host.numpy())
        dev, event = sink.copier.copy(host)
        ring.ledger.release(slot, ring.copied(event))
        count("shm_batches", max(1, len(msg.parts)))
        return split(Received(typed_views(dev, msg.arrays, layout.offsets), event, dev), msg,
                     bounds)
    landing = sink.land(layout)
    own = (landing.host if isinstance(landing, BufferLanding)
           else torch.empty(nbytes, dtype=torch.uint8))
    dst = own.numpy()
    np.copyto(dst[:nbytes], np.frombuffer(ring.segment.slot(slot, nbytes), dtype=np.uint8))
    ring.ledger.release(slot)
    frames, bounds = _check(endpoint, msg, layout, dst)
    count("shm_batches", max(1, len(msg.parts)))
    if isinstance(landing, BufferLanding):
        landing.frames = frames
        return landing.finish(msg, bounds)
    return split(Received(typed_views(own, msg.arrays, layout.offsets)), msg, bounds)


def _tensors(msg: wire.BatchMsg, layout: wire.BatchLayout,
             buf: np.ndarray) -> dict[str, torch.Tensor]:
    """Typed tensors of ``msg``'s arrays over the uint8 array ``buf`` (no copy), by name. Each
    holds a numpy view whose base is ``buf``, so ``buf`` lives while any of them does (what
    :meth:`Ring.viewed` watches); numpy's views cost a third of torch's slice and two views per
    array (:func:`~dataflow.client.buffers.typed_views`)."""
    return {name: torch.from_numpy(a) for name, a in layout.arrays(msg, buf).items()}


def _check(endpoint: str, msg: wire.BatchMsg, layout: wire.BatchLayout,
           buf: np.ndarray) -> tuple[list[np.ndarray], dict[str, tuple[int, ...]]]:
    """Views of ``buf`` at the batch's frame places, checked as frames are, and the ragged
    values bounds of its batches (``BatchLayout.check_frames``)."""
    frames = [buf[s : s + n] for s, n in layout.frames]
    try:
        bounds = layout.check_frames(msg, layout.sizes, frames)
    except ProtocolError as e:
        raise ProtocolError(f"{endpoint}: {e}") from e
    return frames, bounds
