"""Where received batches land: ZeroMQ's messages, pinned buffers, the CUDA ring.

A sink says where the buffer frames of one BATCH land: :meth:`land` returns a
:class:`Landing` for the batch, whose :meth:`Landing.recv` receives frame ``i`` in its place,
and whose :meth:`Landing.finish` makes the batch's tensors once
:meth:`dataflow.wire.BatchLayout.check_frames` passed (the one loop over the frames is
:func:`dataflow.client.receive.receive_batch`).

* :class:`HostSink` (device None or CPU): every batch has memory of its own, so a batch the
  user keeps never aliases memory that is reused later. Without pinning the frames stay the
  ZeroMQ messages they arrived in and the tensors view them (:class:`MessageLanding`,
  :func:`frame_views`), which saves the client a memcpy per batch and any buffer bookkeeping
  (a fresh multi-MiB buffer of our own per batch cost a page fault per 4 KiB page, and a pool
  of them Python per batch). Pinned (CUDA available and ``pin_memory``), each batch is received
  with ``recv_into`` into a fresh buffer from torch's caching host allocator
  (:class:`BufferLanding`), laid out by :class:`dataflow.wire.BatchLayout`.
* :class:`CudaSink`: a fixed ring of reusable pinned host slots received into with
  ``recv_into``; after a batch is received into a slot its H2D copy is issued and an event
  recorded; the slot is reused only after that event completed, and the consumer's stream
  waits on the event before it uses the batch (:func:`hand_over`). The copy is the sink's
  :class:`DeviceCopier`: :class:`CudaCopier` (a dedicated CUDA stream) on a GPU; the CPU
  suite runs the ring with a copier of its own.

Thread invariant: a sink and its landings are used by the client's I/O thread only;
:func:`hand_over` runs on the consumer's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import zmq

from dataflow import wire
from dataflow.client.parts import split, split_pieces

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


class CopyEvent(Protocol):
    """Completes with one host-to-device copy."""

    def query(self) -> bool:
        """Whether the copy finished."""
        ...

    def synchronize(self) -> None:
        """Block until the copy finished."""
        ...

    def wait(self, base: torch.Tensor) -> None:
        """Make the consumer's current stream wait for the copy into ``base`` (and keep
        ``base`` alive until that stream's work so far is done)."""
        ...


class DeviceCopier(Protocol):
    """How a :class:`CudaSink` gets batches to its device: host buffers and async copies."""

    def host(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of ``nbytes`` that :meth:`copy` can read asynchronously."""
        ...

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, CopyEvent]:
        """Start copying ``host`` (uint8, 1-D, from :meth:`host`) to the device.

        Returns:
            The device uint8 buffer (valid once the event completed) and the copy's event;
            ``host`` must not be written before the event completed.
        """
        ...


def pinned(nbytes: int) -> torch.Tensor:
    """A uint8 host buffer of ``nbytes`` from torch's caching host allocator (pinned)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class CudaEvent:
    """A CUDA event recorded after a copy on a side stream."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def wait(self, base: torch.Tensor) -> None:
        stream = torch.cuda.current_stream(base.device)
        stream.wait_event(self._event)
        base.record_stream(stream)


class CudaCopier:
    """Pinned host buffers; copies on a dedicated CUDA stream of ``device``."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)

    def host(self, nbytes: int) -> torch.Tensor:
        return pinned(nbytes)

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, CopyEvent]:
        with torch.cuda.stream(self._stream):
            dev = torch.empty(host.numel(), dtype=torch.uint8, device=self._device)
            dev.copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return dev, CudaEvent(event)


@dataclass
class Received:
    """A received batch ready for the consumer.

    Attributes:
        tensors: field name -> tensor (see the DataLoader docstring for names and shapes).
        event: the device copy the consumer must wait for (:func:`hand_over`), or None on CPU.
        base: the device buffer the tensors view, or None on CPU.
        left_out: which of the samples the batch's plan names the server left out as damaged
            (``--on-error skip``): positions in the plan's order; None when some were and the
            server did not say which.
    """

    tensors: dict[str, torch.Tensor]
    event: CopyEvent | None = None
    base: torch.Tensor | None = None
    left_out: tuple[int, ...] | None = ()


class Landing(ABC):
    """Where the buffer frames of one BATCH land, and the batch made of them.

    Attributes:
        layout: the batch's ``BatchLayout``.
        frames: the contents of the frames received so far, where they landed (read by
            ``BatchLayout.check_frames``).
    """

    def __init__(self, layout: wire.BatchLayout) -> None:
        self.layout = layout
        self.frames: list[Any] = []

    @abstractmethod
    def recv(self, sock: zmq.Socket, i: int) -> tuple[int, bool]:
        """Receive buffer frame ``i`` (``< len(layout.frames)``, in order) in its place.

        Returns:
            The frame's size in bytes (what arrived, whatever fitted), and whether more frames
            follow.
        """

    @abstractmethod
    def finish(self, msg: wire.BatchMsg, bounds: dict[str, tuple[int, ...]]) -> list[Received]:
        """The batches (one, or one per ``parts`` entry), once the frames passed
        ``BatchLayout.check_frames``, which returned ``bounds``."""


class MessageLanding(Landing):
    """Frames stay the ZeroMQ messages they arrived in; the tensors view them."""

    def recv(self, sock: zmq.Socket, i: int) -> tuple[int, bool]:
        frame = sock.recv(copy=False)
        self.frames.append(frame)
        return len(frame), frame.more

    def finish(self, msg: wire.BatchMsg, bounds: dict[str, tuple[int, ...]]) -> list[Received]:
        return [Received(t) for t in
                split_pieces(frame_views(msg, self.layout, self.frames), msg, bounds)]


class BufferLanding(Landing):
    """Frames received with ``recv_into`` at their layout slots of one uint8 host buffer.

    Attributes:
        host: the buffer, ``layout.nbytes`` bytes.
    """

    def __init__(self, host: torch.Tensor, layout: wire.BatchLayout) -> None:
        super().__init__(layout)
        self.host = host
        self._raw = host.numpy().data  # recv_into writes there without a copy

    def recv(self, sock: zmq.Socket, i: int) -> tuple[int, bool]:
        start, n = self.layout.frames[i]
        place = self._raw[start : start + n]
        self.frames.append(place)
        return sock.recv_into(place), bool(sock.getsockopt(zmq.RCVMORE))

    def finish(self, msg: wire.BatchMsg, bounds: dict[str, tuple[int, ...]]) -> list[Received]:
        return split(Received(typed_views(self.host, msg.arrays, self.layout.offsets)), msg,
                     bounds)


def frame_views(msg: wire.BatchMsg, layout: wire.BatchLayout,
                frames: Sequence[zmq.Frame]) -> list[list[torch.Tensor]]:
    """Typed tensors of each piece of ``msg``'s arrays (``layout.pieces``: each array whole,
    or each batch's rows of it for a BATCH sent ``apart``) over its received buffer frames, in
    array order.

    A piece of at least ``ZERO_COPY_MIN_BYTES`` that travelled in one frame is viewed in
    place: the tensor keeps ZeroMQ's message alive and writes go to that message, which no
    one else uses. Smaller pieces, pieces split over several frames (> 24 MiB) and frames not
    aligned for their dtype are copied into fresh memory.

    Args:
        msg: the BATCH header.
        layout: ``BatchLayout.of(msg)``.
        frames: the buffer frames, checked by ``layout.check_frames``.
    """
    out: list[list[torch.Tensor]] = []
    i = 0
    for spec, pieces in zip(msg.arrays, layout.pieces, strict=True):
        views = []
        for rows, count in pieces:
            typed = _piece_view(spec, frames[i : i + count])
            views.append(typed.view((rows, *spec.shape[1:])))
            i += count
        out.append(views)
    return out


def _piece_view(spec: wire.ArraySpec, frames: Sequence[zmq.Frame]) -> torch.Tensor:
    """One piece of an array of ``spec``, flat, over the frames it travelled in."""
    if len(frames) == 1 and len(frames[0]) >= wire.ZERO_COPY_MIN_BYTES:
        dtype = TORCH_DTYPES[spec.dtype]
        typed = torch.frombuffer(frames[0], dtype=torch.uint8)
        if dtype is not torch.uint8:
            if typed.data_ptr() % dtype.itemsize:
                typed = typed.clone()
            typed = typed.view(dtype)
        return typed
    if len(frames) == 1:
        return torch.from_numpy(np.frombuffer(frames[0].buffer, dtype=spec.dtype).copy())
    return torch.from_numpy(np.concatenate(
        [np.frombuffer(f.buffer, dtype=np.uint8) for f in frames]).view(spec.dtype))


class HostSink:
    """Batches on the CPU: pinned buffers of their own, or ZeroMQ's own message buffers.

    With ``pin`` each batch is received into a fresh buffer from torch's caching host
    allocator (:class:`BufferLanding`). Without, the frames stay ZeroMQ messages
    (:class:`MessageLanding`) and :func:`frame_views` views them: no copy in the client, no
    buffer of ours; a batch the user keeps holds its messages and nothing else.

    Args:
        pin: use pinned memory.
        alloc: ``nbytes -> uint8 host buffer`` of a pinned batch (default: torch's caching
            host allocator).
    """

    def __init__(self, pin: bool, alloc: Callable[[int], torch.Tensor] = pinned) -> None:
        self.pin = pin
        self._alloc = alloc

    def land(self, layout: wire.BatchLayout) -> Landing:
        if not self.pin:
            return MessageLanding(layout)
        return BufferLanding(self._alloc(layout.nbytes), layout)

    def close(self) -> None:
        """Nothing to release (idempotent)."""


class RingLanding(BufferLanding):
    """A batch received into a slot of :class:`CudaSink`'s ring; finishing issues its copy.

    Attributes:
        event: the slot's copy (None until :meth:`finish`).
    """

    def __init__(self, host: torch.Tensor, layout: wire.BatchLayout,
                 copier: DeviceCopier) -> None:
        super().__init__(host, layout)
        self._copier = copier
        self.event: CopyEvent | None = None

    def finish(self, msg: wire.BatchMsg, bounds: dict[str, tuple[int, ...]]) -> list[Received]:
        dev, self.event = self._copier.copy(self.host)
        return split(Received(typed_views(dev, msg.arrays, self.layout.offsets), self.event,
                              dev), msg, bounds)


class CudaSink:
    """A ring of ``slots`` host buffers and asynchronous copies to ``device``.

    A slot is received into again only after the copy of what it last held finished; a slot
    too small for a batch is replaced by a bigger one (after that wait too).

    Args:
        device: the CUDA device.
        slots: ring size.
        copier: host buffers and copies (default: :class:`CudaCopier` of ``device``).

    Attributes:
        copier: its copier (also used for copies from registered shared memory,
            :mod:`dataflow.client.shmring`).
    """

    def __init__(self, device: torch.device, slots: int = RING_SLOTS,
                 copier: DeviceCopier | None = None) -> None:
        self.copier = copier if copier is not None else CudaCopier(device)
        self._slots: list[torch.Tensor | None] = [None] * slots
        self._landed: list[RingLanding | None] = [None] * slots
        self._next = 0

    def land(self, layout: wire.BatchLayout) -> RingLanding:
        """The next slot of the ring, once the copy of what it last held finished."""
        i = self._next
        self._next = (i + 1) % len(self._slots)
        last = self._landed[i]
        if last is not None and last.event is not None:
            last.event.synchronize()
        slot = self._slots[i]
        if slot is None or slot.numel() < layout.nbytes:
            slot = self._slots[i] = self.copier.host(max(layout.nbytes, wire.ALIGN))
        landing = self._landed[i] = RingLanding(slot[: layout.nbytes], layout, self.copier)
        return landing

    def close(self) -> None:
        """Wait for pending copies and drop the ring (idempotent)."""
        for landing in self._landed:
            if landing is not None and landing.event is not None:
                landing.event.synchronize()
        self._slots = [None] * len(self._slots)
        self._landed = [None] * len(self._landed)


def hand_over(ready: Received) -> dict[str, torch.Tensor]:
    """Make a batch safe to use on the consumer's current stream and return its tensors."""
    if ready.event is not None and ready.base is not None:
        ready.event.wait(ready.base)
    return ready.tensors
