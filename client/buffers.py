"""Where received batches land: host buffers, the pinned ring and host-to-device copies.

A BATCH's arrays are received into one uint8 buffer laid out by
:class:`dataflow.wire.BatchLayout` (the layout the wire's decoder uses too) with ``recv_into``;
the yielded tensors are typed views of that buffer (CPU) or of its device copy (CUDA).

* :class:`HostSink` (device None or CPU): every batch gets a buffer of its own, so a batch the
  user keeps never aliases memory that is reused later. Pinned buffers come from torch's
  caching host allocator (CUDA available and ``pin_memory``); plain ones from a
  :class:`HostPool` that takes a buffer back only when every tensor of its batch is gone —
  a fresh multi-MiB allocation per batch costs a page fault per 4 KiB page (the kernel maps
  and zeroes each one), which measured as more than half of the client's CPU per batch.
* :class:`CudaSink`: a fixed ring of reusable pinned host slots; after a batch is received into
  a slot its H2D copy is issued on a dedicated CUDA stream and an event recorded; the slot is
  reused only after that event completed, and the consumer's stream waits on the event before
  it uses the batch (:func:`hand_over`).

Thread invariant: a sink is used by the client's I/O thread only; :func:`hand_over` runs on the
consumer's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dataflow import wire

RING_SLOTS = 3
POOL_ROUND = 64 * 1024

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16,
    "uint32": torch.uint32, "uint64": torch.uint64, "float16": torch.float16,
    "float32": torch.float32, "float64": torch.float64,
}


def typed_views(buf: torch.Tensor, arrays: Sequence[wire.ArraySpec],
                offsets: Sequence[int]) -> dict[str, torch.Tensor]:
    """Typed tensors of ``arrays`` over the uint8 buffer ``buf`` (no copy)."""
    out = {}
    for spec, off in zip(arrays, offsets, strict=True):
        raw = buf[off : off + spec.nbytes]
        out[spec.name] = raw.view(TORCH_DTYPES[spec.dtype]).view(spec.shape)
    return out


@dataclass
class Landing:
    """A receive buffer for one BATCH.

    Attributes:
        host: uint8 host tensor the frames are received into.
        array: ``host`` as a writable numpy array (for ``recv_into``).
        offsets: byte offset of each array in ``host``.
        slot: ring slot index (CUDA sink) or -1.
    """

    host: torch.Tensor
    array: np.ndarray
    offsets: Sequence[int]
    slot: int = -1


@dataclass
class Ready:
    """A received batch ready for the consumer.

    Attributes:
        tensors: field name -> tensor (see the DataLoader docstring for names and shapes).
        event: CUDA event the consumer's stream must wait on, or None on CPU.
        base: the device buffer the tensors view (for ``record_stream``), or None on CPU.
    """

    tensors: dict[str, torch.Tensor]
    event: torch.cuda.Event | None = None
    base: torch.Tensor | None = None


class _Lease:
    """A pooled buffer lent to one batch; back to its pool when the last view of it dies.

    numpy keeps the object that provides ``__array_interface__`` as the base of the array it
    builds, and torch keeps that array alive as long as any tensor viewing it, so ``__del__``
    runs exactly when the batch's last tensor is gone.
    """

    def __init__(self, pool: HostPool, buf: np.ndarray, nbytes: int) -> None:
        self._pool = pool
        self._buf = buf
        self.__array_interface__ = {
            "data": (buf.ctypes.data, False), "shape": (nbytes,), "typestr": "|u1",
            "version": 3,
        }

    def __del__(self) -> None:
        self._pool.give_back(self._buf)


class HostPool:
    """Reusable plain host buffers, at most ``capacity`` kept idle.

    Thread invariant: :meth:`take` runs on the I/O thread; :meth:`give_back` on whichever
    thread drops a batch's last tensor; both under one lock.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._idle: dict[int, list[np.ndarray]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` bytes that no live batch uses."""
        size = max(-(-nbytes // POOL_ROUND) * POOL_ROUND, POOL_ROUND)
        with self._lock:
            idle = self._idle.get(size)
            buf = idle.pop() if idle else None
            if buf is not None:
                self._count -= 1
        if buf is None:
            buf = np.empty(size, dtype=np.uint8)
        return torch.from_numpy(np.asarray(_Lease(self, buf, nbytes)))

    def give_back(self, buf: np.ndarray) -> None:
        # Allocate before taking the lock: an allocation can start a garbage collection whose
        # finalizers (another batch's lease) call give_back on this same thread.
        fresh: list[np.ndarray] = []
        with self._lock:
            if self._count < self._capacity:
                self._idle.setdefault(len(buf), fresh).append(buf)
                self._count += 1

    @property
    def idle(self) -> int:
        """Buffers waiting to be reused."""
        return self._count


class HostSink:
    """A host buffer of its own per batch (pinned when ``pin``); tensors stay on the CPU.

    Args:
        pin: use pinned memory (torch's caching host allocator) instead of the pool.
        pool_capacity: idle plain buffers kept for reuse.
    """

    def __init__(self, pin: bool, pool_capacity: int = 16) -> None:
        self._pin = pin
        self.pool = HostPool(pool_capacity)

    def land(self, layout: wire.BatchLayout) -> Landing:
        if self._pin:
            host = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=True)
        else:
            host = self.pool.take(layout.nbytes)
        return Landing(host, host.numpy(), layout.offsets)

    def finish(self, landing: Landing, msg: wire.BatchMsg) -> Ready:
        return Ready(typed_views(landing.host, msg.arrays, landing.offsets))

    def close(self) -> None:
        """Nothing to release (idempotent)."""


class CudaSink:
    """Pinned host ring + asynchronous H2D copies on a dedicated stream."""

    def __init__(self, device: torch.device, slots: int = RING_SLOTS) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)
        self._slots: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def land(self, layout: wire.BatchLayout) -> Landing:
        total = layout.nbytes
        i = self._next
        self._next = (i + 1) % len(self._slots)
        event = self._events[i]
        if event is not None:
            event.synchronize()
        slot = self._slots[i]
        if slot is None or slot.numel() < total:
            slot = self._slots[i] = torch.empty(max(total, wire.ALIGN), dtype=torch.uint8,
                                                pin_memory=True)
        host = slot[:total]
        return Landing(host, host.numpy(), layout.offsets, i)

    def finish(self, landing: Landing, msg: wire.BatchMsg) -> Ready:
        with torch.cuda.stream(self._stream):
            dev = torch.empty(landing.host.numel(), dtype=torch.uint8, device=self._device)
            dev.copy_(landing.host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._events[landing.slot] = event
        return Ready(typed_views(dev, msg.arrays, landing.offsets), event, dev)

    def close(self) -> None:
        """Wait for pending copies and drop the ring (idempotent)."""
        for event in self._events:
            if event is not None:
                event.synchronize()
        self._slots = [None] * len(self._slots)
        self._events = [None] * len(self._events)


def hand_over(ready: Ready) -> dict[str, torch.Tensor]:
    """Make a batch safe to use on the consumer's current stream and return its tensors."""
    if ready.event is not None and ready.base is not None:
        stream = torch.cuda.current_stream(ready.base.device)
        stream.wait_event(ready.event)
        ready.base.record_stream(stream)
    return ready.tensors
