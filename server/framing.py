"""Non-blocking socket helpers shared by the frontend and the readers.

Receiving bounded multipart messages from untrusted peers, and sending to a ``ROUTER`` with
``ROUTER_MANDATORY`` without ever blocking.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import zmq

MAX_ERROR_TEXT = 1024  # characters of an ERROR a server makes; bounds what it queues per peer

class SendResult(Enum):
    """Outcome of :func:`try_send`.

    Attributes:
        OK: the message was handed to ZeroMQ.
        FULL: the peer's send queue is full (``EAGAIN``); try again later.
        GONE: no connection to the peer (``EHOSTUNREACH``).
    """

    OK = "ok"
    FULL = "full"
    GONE = "gone"


NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)


def send_parts(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0, *,
               copy: bool = True) -> None:
    """``sock.send_multipart(frames, flags, copy=copy)`` (``frames``: at least one) at about
    half its cost: pyzmq's computes ``SNDMORE | flags`` on its flag enum for every frame
    (~0.8 us each, at every request and batch); here the flags are plain ints. As pyzmq's
    does, it checks every frame is a buffer before the first is sent, so a bad one never
    leaves half a message behind.

    Raises:
        TypeError: a frame is not a buffer (nothing sent).
        zmq.ZMQError: as ``send`` raises it (``zmq.Again`` for a full queue with ``NOBLOCK``).
    """
    for f in frames:
        if not isinstance(f, zmq.Frame | bytes | memoryview):
            memoryview(f)  # raises TypeError for anything that is not a buffer
    more = flags | _SNDMORE
    for f in frames[:-1]:
        sock.send(f, more, copy=copy)
    sock.send(frames[-1], flags, copy=copy)


def recv_parts(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """``sock.recv_multipart(flags)`` at about two thirds of its cost: pyzmq's asks
    ``getsockopt(RCVMORE)`` through its option enum after every frame; a received frame says
    so itself. For trusted peers (the server's own processes): it keeps every frame.

    Raises:
        zmq.Again: ``flags`` has ``NOBLOCK`` and no message is waiting.
    """
    f = sock.recv(flags, copy=False)
    frames = [f.bytes]
    while f.more:  # libzmq delivers a message only once all its frames arrived: no wait
        f = sock.recv(0, copy=False)
        frames.append(f.bytes)
    return frames


def try_send(sock: zmq.Socket, peer: bytes, frames: Sequence[Any]) -> SendResult:
    """Send ``frames`` to ``peer`` through the ROUTER ``sock`` without blocking (zero-copy).

    Raises:
        zmq.ZMQError: any error other than a full queue or an unreachable peer.
    """
    try:
        send_parts(sock, [peer, *frames], NOBLOCK, copy=False)
        return SendResult.OK
    except zmq.Again:
        return SendResult.FULL
    except zmq.ZMQError as e:
        if e.errno == errno.EHOSTUNREACH:
            return SendResult.GONE
        raise


def try_send_tracked(sock: zmq.Socket, peer: bytes,
                     frames: Sequence[Any]) -> zmq.MessageTracker | None:
    """:func:`try_send` with a tracker on the last frame, which tells when ZeroMQ let go of
    the whole message (it writes frames in order): written to the peer's connection, or
    dropped with it. None when the message was not handed over.

    The tracked frame is never copied and no reference to it is kept here: ZeroMQ lets go of
    it only when nothing else holds it.
    """
    tail = zmq.Frame(frames[-1], copy=False, track=True)
    tracker = tail.tracker
    if try_send(sock, peer, [*frames[:-1], tail]) is not SendResult.OK:
        return None
    return tracker


@dataclass(frozen=True)
class Inbound:
    """One received multipart message.

    Attributes:
        frames: its first frames (the ROUTER's routing id first), at most ``max_frames``.
        extra: frames discarded beyond ``max_frames``.
        nbytes: bytes of all its frames, discarded ones included.
    """

    frames: list[zmq.Frame]
    extra: int
    nbytes: int

    @property
    def count(self) -> int:
        """Frames of the message."""
        return len(self.frames) + self.extra


def recv_bounded(sock: zmq.Socket, max_frames: int) -> Inbound:
    """Receive one multipart message without blocking, keeping at most ``max_frames`` frames.

    (libzmq delivers a message only once all its frames arrived, so this never waits.)

    Raises:
        zmq.Again: no message is waiting.
    """
    f = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [f]
    extra = 0
    nbytes = len(f)
    while f.more:
        f = sock.recv(copy=False)
        nbytes += len(f)
        if len(frames) < max_frames:
            frames.append(f)
        else:
            extra += 1
    return Inbound(frames, extra, nbytes)
