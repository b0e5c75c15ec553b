"""Receiving bounded multipart messages from untrusted peers without blocking."""

from __future__ import annotations

import zmq


def recv_bounded(sock: zmq.Socket, max_frames: int) -> tuple[list[zmq.Frame], int]:
    """Receive one multipart message without blocking, keeping at most ``max_frames`` frames.

    Returns:
        The kept frames and the number of frames discarded beyond ``max_frames``.

    Raises:
        zmq.Again: no message is waiting.
    """
    frames = [sock.recv(zmq.NOBLOCK, copy=False)]
    extra = 0
    more = frames[0].more
    while more:
        f = sock.recv(copy=False)
        more = f.more
        if len(frames) < max_frames:
            frames.append(f)
        else:
            extra += 1
    return frames, extra
