"""Receiving one message from a server's socket: the header, then array frames in place.

A BATCH's frames are received by one loop (:func:`receive_batch`) wherever its sink lands them
(:mod:`dataflow.client.buffers`: ZeroMQ messages the tensors view, or ``recv_into`` a pinned
buffer), then checked by the one check every receiver of a BATCH runs,
:meth:`dataflow.wire.BatchLayout.check_frames` (frame count and sizes, ragged offsets), so a
malformed batch is a ``ProtocolError`` naming the endpoint and the request before any tensor
is made of it.
"""

from __future__ import annotations

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Received
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
                  sink: HostSink | CudaSink) -> list[Received]:
    """Receive the array frames of ``msg`` where ``sink`` lands them and finish its batches
    (one, or one per ``parts`` entry: :mod:`dataflow.client.parts`).

    Every frame of the message is received (those beyond the announced ones are discarded), so
    the socket is at the next message whatever arrived.

    Raises:
        ProtocolError: frames missing, of the wrong size, in excess, or ragged offsets that
            do not fit their values (naming the endpoint and the request).
    """
    layout = wire.BatchLayout.of(msg)
    landing = sink.land(layout)
    announced = len(layout.frames)
    sizes: list[int] = []
    more = sock.getsockopt(zmq.RCVMORE)
    while more:
        if len(sizes) < announced:
            size, more = landing.recv(sock, len(sizes))
        else:
            extra = sock.recv(copy=False)
            size, more = len(extra), extra.more
        sizes.append(size)
    try:
        bounds = layout.check_frames(msg, sizes, landing.frames)
    except ProtocolError as e:
        raise ProtocolError(f"{endpoint}: {e}") from e
    return landing.finish(msg, bounds)
