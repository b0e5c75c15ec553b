"""Where received batches land: host buffers, the pinned ring and host-to-device copies.

A BATCH's arrays are received into one uint8 buffer laid out by
:class:`dataflow.wire.BatchLayout` (the layout the wire's decoder uses too) with ``recv_into``;
the yielded tensors are typed views of that buffer (CPU) or of its device copy (CUDA).

* :class:`HostSink` (device None or CPU): every batch has memory of its own, so a batch the
  user keeps never aliases memory that is reused later. Pinned buffers come from torch's
  caching host allocator (CUDA available and ``pin_memory``); otherwise the tensors view the
  ZeroMQ messages the frames arrived in (:func:`frame_views`), which saves the client a
  memcpy per batch and any buffer bookkeeping (a fresh multi-MiB buffer of our own per batch
  cost a page fault per 4 KiB page, and a pool of them Python per batch).
* :class:`CudaSink`: a fixed ring of reusable pinned host slots; after a batch is received into
  a slot its H2D copy is issued on a dedicated CUDA stream and an event recorded; the slot is
  reused only after that event completed, and the consumer's stream waits on the event before
  it uses the batch (:func:`hand_over`).

Thread invariant: a sink is used by the client's I/O thread only; :func:`hand_over` runs on the
consumer's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from dataflow import wire

RING_SLOTS = 3

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


def frame_views(msg: wire.BatchMsg, layout: wire.BatchLayout,
                frames: Sequence[zmq.Frame]) -> dict[str, torch.Tensor]:
    """Typed tensors of ``msg``'s arrays over its received buffer frames, by name.

    An array of at least ``ZERO_COPY_MIN_BYTES`` that travelled in one frame is viewed in
    place: the tensor keeps ZeroMQ's message alive and writes go to that message, which no
    one else uses. Smaller arrays, arrays split over several frames (> 8 MiB) and frames not
    aligned for their dtype are copied into fresh memory.

    Args:
        msg: the BATCH header.
        layout: ``BatchLayout.of(msg)``.
        frames: the buffer frames, sizes already checked against ``layout.frames``.

    Raises:
        ProtocolError: a ragged field's offsets do not fit its values.
    """
    out: dict[str, torch.Tensor] = {}
    i = 0
    for spec, count in zip(msg.arrays, layout.counts, strict=True):
        if count == 1 and spec.nbytes >= wire.ZERO_COPY_MIN_BYTES:
            dtype = TORCH_DTYPES[spec.dtype]
            flat = torch.frombuffer(frames[i], dtype=torch.uint8)
            if flat.data_ptr() % dtype.itemsize:
                flat = flat.clone()
            typed = flat.view(dtype)
        elif count == 1:
            typed = torch.from_numpy(np.frombuffer(frames[i].buffer, dtype=spec.dtype).copy())
        else:
            typed = torch.from_numpy(np.concatenate(
                [np.frombuffer(f.buffer, dtype=np.uint8) for f in frames[i : i + count]]
            ).view(spec.dtype))
        i += count
        out[spec.name] = typed.view(spec.shape)
    if msg.ragged:
        wire.check_ragged(msg, {n + wire.OFFSETS_SUFFIX: out[n + wire.OFFSETS_SUFFIX].numpy()
                                for n, _ in msg.ragged})
    return out


class HostSink:
    """Batches on the CPU: pinned buffers of their own, or ZeroMQ's own message buffers.

    With ``pin`` each batch is received into a fresh buffer from torch's caching host
    allocator (:meth:`land`, :meth:`finish`). Without, the receiver takes the frames as
    ZeroMQ messages (``zero_copy``) and :func:`frame_views` views them: no copy in the
    client, no buffer of ours; a batch the user keeps holds its messages and nothing else.

    Args:
        pin: use pinned memory (torch's caching host allocator).
    """

    def __init__(self, pin: bool) -> None:
        self._pin = pin
        self.zero_copy = not pin

    def land(self, layout: wire.BatchLayout) -> Landing:
        host = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=True)
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
