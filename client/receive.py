"""Receiving one message from a server's socket: the header, then array frames in place.

A BATCH's frames are received either as ZeroMQ messages that the batch's tensors view
(:func:`dataflow.client.buffers.frame_views`, plain host memory), or with ``recv_into``
straight into a pinned sink buffer laid out by :class:`dataflow.wire.BatchLayout` (the same
layout the wire's validating decoder uses). Either way the frame count and sizes and the
ragged offsets are checked first, so a malformed batch is a ``ProtocolError`` naming the
endpoint before any tensor is made of it.
"""

from __future__ import annotations

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Ready, frame_views
from dataflow.errors import ProtocolError


def drain(sock: zmq.Socket) -> int:
    """Discard the rest of a multipart message; returns how many frames were discarded."""
    n = 0
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv(copy=False)
        n += 1
    return n


def receive_header(sock: zmq.Socket, endpoint: str) -> wire.Message | None:
    """The next message, or None when none is waiting.

    A BATCH is returned after its header frame only: the caller must next call
    :func:`receive_batch` or :func:`drain`. Any other message is received and validated whole.

    Raises:
        ProtocolError: the message is malformed (its frames are discarded), naming the
            endpoint.
    """
    try:
        header = sock.recv(zmq.NOBLOCK)
    except zmq.Again:
        return None
    try:
        msg = wire.decode_header(header)
        if not isinstance(msg, wire.BatchMsg):
            rest = []
            while sock.getsockopt(zmq.RCVMORE):
                rest.append(sock.recv())
            msg = wire.decode([header, *rest])
    except ProtocolError as e:
        drain(sock)
        raise ProtocolError(f"{endpoint}: {e}") from e
    return msg


def receive_batch(sock: zmq.Socket, endpoint: str, msg: wire.BatchMsg,
                  sink: HostSink | CudaSink) -> Ready:
    """Receive the array frames of ``msg`` into a buffer of ``sink`` and finish the batch.

    Raises:
        ProtocolError: frames missing, of the wrong size, in excess, or ragged offsets that
            do not fit their values (naming the endpoint and the request).
    """
    layout = wire.BatchLayout.of(msg)
    if isinstance(sink, HostSink) and sink.zero_copy:
        return _receive_frames(sock, endpoint, msg, layout)
    landing = sink.land(layout)
    buf = landing.array
    raw = buf.data  # a memoryview of the buffer: recv_into writes there without a copy
    for start, n in layout.frames:
        if not sock.getsockopt(zmq.RCVMORE):
            raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} ended after fewer than its "
                                f"{len(layout.frames)} buffer frames")
        got = sock.recv_into(raw[start : start + n])
        if got != n:
            drain(sock)
            raise ProtocolError(f"{endpoint}: BATCH {msg.req_id}: a frame of {got} bytes where "
                                f"{n} were announced")
    extra = drain(sock)
    if extra:
        raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} has {extra} extra frame(s)")
    try:
        layout.check(msg, buf)
    except ProtocolError as e:
        raise ProtocolError(f"{endpoint}: {e}") from e
    return sink.finish(landing, msg)


def _receive_frames(sock: zmq.Socket, endpoint: str, msg: wire.BatchMsg,
                    layout: wire.BatchLayout) -> Ready:
    """The batch as tensors viewing its frames' ZeroMQ messages (see ``frame_views``)."""
    frames = []
    more = sock.getsockopt(zmq.RCVMORE)
    for _, n in layout.frames:
        if not more:
            raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} ended after fewer than its "
                                f"{len(layout.frames)} buffer frames")
        frame = sock.recv(copy=False)
        more = frame.more
        if len(frame) != n:
            drain(sock)
            raise ProtocolError(f"{endpoint}: BATCH {msg.req_id}: a frame of {len(frame)} bytes "
                                f"where {n} were announced")
        frames.append(frame)
    extra = drain(sock) if more else 0
    if extra:
        raise ProtocolError(f"{endpoint}: BATCH {msg.req_id} has {extra} extra frame(s)")
    try:
        return Ready(frame_views(msg, layout, frames))
    except ProtocolError as e:
        raise ProtocolError(f"{endpoint}: {e}") from e
