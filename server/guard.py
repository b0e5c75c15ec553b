"""Bounds on client connections that libzmq does not give: unfinished messages and their count.

libzmq hands a multipart message to the application only once its last frame arrived, and it
keeps the frames before that in memory without limit (``MAXMSGSIZE`` bounds each frame, the
high-water marks count whole messages only). One peer sending frames with MORE set and never
the last one grows the server without bound while the application sees nothing.

So the frontend watches each client connection from outside libzmq: a socket monitor reports
every accepted connection's file descriptor; the kernel's ``TCP_INFO`` gives the bytes
received on it; every message the frontend receives carries its descriptor (``SRCFD``) and
size. Bytes received but never delivered as whole messages are what libzmq holds for that
peer (plus ZMTP framing, allowed for). A connection holding more than ``limit`` is cut with
``shutdown(2)``; libzmq then closes it and frees what it held. Connections beyond
``max_connections`` are cut as they are accepted (a descriptor budget).

Byte accounting needs TCP (``TCP_INFO``); on ipc endpoints only the connection count applies.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from dataflow.server.peerlog import RateLimitedLog

GUARD_MS = 20  # ms between checks of a process's connections while it has any
TCPI_BYTES_RECEIVED = 128  # offset of the u64 tcpi_bytes_received in Linux's struct tcp_info
TCP_INFO_LEN = 136
ZMTP_ALLOWANCE = 4096  # greeting, READY command and the like
FRAME_OVERHEAD = 9  # most ZMTP framing bytes per frame
HEARTBEAT_BYTES_PER_S = 64  # PING/PONG commands, never delivered as messages
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


@dataclass
class _Conn:
    opened: float
    delivered: int = 0


def _with_fd(fd: int, how: str) -> bytes | None:
    """``TCP_INFO`` of socket ``fd`` (``how == "info"``), or shut it down (``"cut"``).

    The descriptor belongs to libzmq: it is borrowed, never closed here.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if how == "info":
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
        sock.shutdown(socket.SHUT_RDWR)
        return None
    except OSError:
        return None
    finally:
        sock.detach()


class InboundGuard:
    """Cuts client connections that hold too many undelivered bytes or exceed the budget.

    Args:
        router: the client-facing ROUTER (monitored from now on).
        limit: bytes a connection may hold undelivered (``--max-inbound-bytes``).
        max_connections: connections at once.
        tcp: whether ``router`` is bound to a tcp endpoint (byte accounting works).
        counters: STATS counters (``connections_cut`` is counted).
        peer_log: where cuts are logged.
        limit_name: what sets ``limit``, for the log.

    Attributes:
        monitor: the socket monitor's PAIR socket; poll it so that a new connection wakes the
            caller (an unfinished message never makes ``router`` readable).
    """

    def __init__(self, router: zmq.Socket, limit: int, max_connections: int, *, tcp: bool,
                 counters: dict[str, int], peer_log: RateLimitedLog,
                 limit_name: str = "--max-inbound-bytes") -> None:
        self.monitor = router.get_monitor_socket(EVENTS)
        self._limit_name = limit_name
        self._router = router
        self._limit = limit
        self._max = max_connections
        self._tcp = tcp
        self._counters = counters
        self._log = peer_log
        self._conns: dict[int, _Conn] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def close(self) -> None:
        """Stop monitoring (idempotent)."""
        if not self.monitor.closed:
            self._router.disable_monitor()
            self.monitor.close(linger=0)

    def delivered(self, fd: int, nbytes: int, frames: int) -> None:
        """A message of ``frames`` frames and ``nbytes`` bytes came in on connection ``fd``."""
        conn = self._conns.get(fd)
        if conn is not None:
            conn.delivered += nbytes + FRAME_OVERHEAD * frames

    def check(self, now: float) -> None:
        """Track connections opened and closed; cut those over a bound."""
        self._events(now)
        if not self._tcp:
            return
        for fd, conn in list(self._conns.items()):
            info = _with_fd(fd, "info")
            if info is None or len(info) < TCP_INFO_LEN:
                continue
            received = struct.unpack_from("<Q", info, TCPI_BYTES_RECEIVED)[0]
            held = received - conn.delivered
            if held > self._limit + ZMTP_ALLOWANCE + HEARTBEAT_BYTES_PER_S * (now - conn.opened):
                self._cut(fd, f"it holds {held} bytes not yet received as whole messages "
                              f"(limit {self._limit}: {self._limit_name})")

    def _events(self, now: float) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int(event["value"])
            if event["event"] != zmq.EVENT_ACCEPTED:
                self._conns.pop(fd, None)
            elif len(self._conns) >= self._max:
                self._cut(fd, f"{len(self._conns)} connections are open, the most allowed "
                              "(2 x --max-sessions + 64)")
            else:
                self._conns[fd] = _Conn(now)

    def _cut(self, fd: int, why: str) -> None:
        self._counters["connections_cut"] += 1
        self._conns.pop(fd, None)
        self._log.warning("client connection (fd %d) cut: %s", fd, why)
        _with_fd(fd, "cut")
