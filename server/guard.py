"""Bounds on client connections that libzmq does not give: unfinished messages, their count,
their bytes over all connections, and connections per peer address.

libzmq hands a multipart message to the application only once its last frame arrived, and it
keeps the frames before that in memory without limit (``MAXMSGSIZE`` bounds each frame, the
high-water marks count whole messages only). One peer sending frames with MORE set and never
the last one grows the server without bound while the application sees nothing.

So each server process watches its client connections from outside libzmq: a socket monitor
reports every accepted connection's file descriptor; the kernel's ``TCP_INFO`` gives the bytes
received on it; every message the process receives carries its descriptor (``SRCFD``) and
size. Bytes received but never delivered as whole messages are what libzmq holds for that
peer (plus ZMTP framing, allowed for); they are looked at every ``GUARD_MS`` (not at every
message: a ``TCP_INFO`` per connection is dear at thousands of messages a second). A
connection holding more than ``limit`` is cut with
``shutdown(2)``; libzmq then closes it and frees what it held. While all connections together
hold more than ``total_limit``, the ones holding the most are cut. Connections beyond
``max_connections``, or beyond ``per_address`` from one peer address, are cut as they are
accepted (a descriptor budget no single peer can take).

libzmq's memory per byte held is at most ~33 bytes (an empty frame is 2 bytes on the wire and
a 64-byte message in memory), so ``total_limit`` bounds it to ~33 x ``total_limit``.

The client-facing sockets have no receive high-water mark (:func:`client_socket_options`): a
full inbound pipe stops libzmq reading that connection, and a peer that then resets the
connection with a ZMTP PING still in libzmq's input buffer makes libzmq 4.3.5 abort the whole
process (``Assertion failed: !_io_error (stream_engine_base.cpp)``: the PING is answered
through a connection already marked failed). The guard's byte bounds take the high-water
mark's place.

Byte accounting needs TCP (``TCP_INFO``); on ipc endpoints only the connection counts apply.

Thread invariant: used only by the owning process's serving thread.
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from dataflow.server.peerlog import RateLimitedLog

GUARD_MS = 20  # ms between checks of a process's connections while it has any
TCPI_BYTES_RECEIVED = 128  # offset of the u64 tcpi_bytes_received in Linux's struct tcp_info
TCP_INFO_LEN = 136
ZMTP_ALLOWANCE = 4096  # greeting, READY command and the like
FRAME_OVERHEAD = 9  # most ZMTP framing bytes per frame
HEARTBEAT_BYTES_PER_S = 16  # a peer's ZMTP PINGs (9 bytes a second), never delivered
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
KEEPALIVE_INTERVAL_S = 1
UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def client_socket_options(sock: zmq.Socket, timeout_s: float) -> None:
    """Set the options every client-facing socket of a server has.

    No receive high-water mark (see the module docstring: the guard bounds what libzmq
    holds), no ZMTP heartbeats (libzmq's heartbeat timer writes to connections the same way),
    and instead kernel TCP keepalive and ``TCP_USER_TIMEOUT``: a connection whose host
    vanished, or whose peer stopped reading while data waits for it, is closed by the kernel
    after ``timeout_s`` seconds, and what libzmq queued for it is freed.
    """
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, math.ceil(timeout_s / 2)))
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, max(1, math.ceil(timeout_s / 2)))
    sock.setsockopt(zmq.TCP_MAXRT, int(timeout_s * 1000))


OLD_ZMTP = ("messages of this peer carry no connection metadata: it speaks ZMTP 1.0 or 2.0, "
            "and this server accepts ZMTP 3.0 or later only")


def message_fd(frame: zmq.Frame) -> int | None:
    """The descriptor of the connection a received message came on, or None when the message
    has no metadata: libzmq attaches none to the messages of a ZMTP 1.0 or 2.0 peer (no
    client of ours speaks those; the guard cuts such a connection by its bytes)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except zmq.ZMQError:
        return None


def address_of(frame: zmq.Frame) -> str:
    """The peer address of the connection a received message came on: its IP address (tcp),
    or ``uid:<uid>`` of the local user (ipc). Only for a message :func:`message_fd` found
    metadata on."""
    return normal_address(str(frame.get("Peer-Address")))


def normal_address(raw: str) -> str:
    """One key per peer address: IPv4-mapped IPv6 addresses as IPv4, and an ipc peer's
    ``localhost:<uid>:<gid>:<pid>`` (libzmq's spelling) as its user."""
    if raw.startswith("localhost:"):
        return "uid:" + raw.split(":")[1]
    return raw.removeprefix("::ffff:")


def _fd_address(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        _, uid, _ = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 UCRED.size))
        return f"uid:{uid}"
    return normal_address(sock.getpeername()[0])


def _with_fd(fd: int, how: str) -> bytes | str | None:
    """``TCP_INFO`` of socket ``fd`` (``how == "info"``), its peer address (``"peer"``), or
    shut it down (``"cut"``).

    The descriptor belongs to libzmq: it is borrowed, never closed here.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if how == "info":
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
        if how == "peer":
            return _fd_address(sock)
        sock.shutdown(socket.SHUT_RDWR)
        return None
    except OSError:
        return None
    finally:
        sock.detach()


def over_limits(held: Mapping[int, int], limit: int, total_limit: int) -> list[tuple[int, str]]:
    """Which connections to cut, and why, given the bytes each holds beyond its allowance.

    Each connection holding more than ``limit``, then, while the rest together hold more than
    ``total_limit``, the one holding the most. Pure.
    """
    cut = [(fd, f"it holds {n} bytes not yet received as whole messages (limit {limit})")
           for fd, n in held.items() if n > limit]
    rest = sorted(((n, fd) for fd, n in held.items() if 0 < n <= limit), reverse=True)
    total = sum(n for n, _ in rest)
    for n, fd in rest:
        if total <= total_limit:
            break
        cut.append((fd, f"all connections hold {total} bytes not yet received as whole "
                        f"messages (limit {total_limit}), this one {n}, the most"))
        total -= n
    return cut


@dataclass
class _Conn:
    opened: float
    address: str
    delivered: int = 0


class InboundGuard:
    """Cuts client connections that hold too many undelivered bytes or exceed the budgets.

    Args:
        router: the client-facing ROUTER (monitored from now on).
        limit: bytes a connection may hold undelivered (``--max-inbound-bytes``).
        total_limit: bytes all connections together may hold undelivered.
        max_connections: connections at once.
        per_address: connections at once from one peer address.
        tcp: whether ``router`` is bound to a tcp endpoint (byte accounting works).
        counters: STATS counters (``connections_cut`` is counted).
        peer_log: where cuts are logged.
        limit_name: what sets ``limit``, for the log.
        total_name: what sets ``total_limit``, for the log.

    Attributes:
        monitor: the socket monitor's PAIR socket; poll it so that a new connection wakes the
            caller (an unfinished message never makes ``router`` readable).
    """

    def __init__(self, router: zmq.Socket, limit: int, max_connections: int, *, tcp: bool,
                 counters: dict[str, int], peer_log: RateLimitedLog,
                 total_limit: int | None = None, per_address: int | None = None,
                 limit_name: str = "--max-inbound-bytes",
                 total_name: str = "--max-inbound-total") -> None:
        self.monitor = router.get_monitor_socket(EVENTS)
        self._limit_name = limit_name
        self._total_name = total_name
        self._router = router
        self._limit = limit
        self._total_limit = limit if total_limit is None else total_limit
        self._max = max_connections
        self._per_address = max_connections if per_address is None else per_address
        self._tcp = tcp
        self._counters = counters
        self._log = peer_log
        self._conns: dict[int, _Conn] = {}
        self._by_address: dict[str, int] = {}
        self._next_scan = -math.inf

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
        """Track connections opened and closed (cutting those beyond the budgets as they are
        accepted); cut those over a byte bound.

        The bytes of the connections are looked at once per :data:`GUARD_MS` at most (a
        ``TCP_INFO`` per connection; a busy serving loop calls this far more often), so what
        libzmq can read before a connection is cut is what it reads in that time: the
        owner's loop calls this at least that often while there are connections.
        """
        self._events(now)
        if not self._tcp or now < self._next_scan:
            return
        self._next_scan = now + GUARD_MS / 1000
        held = {}
        for fd, conn in self._conns.items():
            info = _with_fd(fd, "info")
            if not isinstance(info, bytes) or len(info) < TCP_INFO_LEN:
                continue
            received = struct.unpack_from("<Q", info, TCPI_BYTES_RECEIVED)[0]
            allowance = ZMTP_ALLOWANCE + HEARTBEAT_BYTES_PER_S * (now - conn.opened)
            held[fd] = received - conn.delivered - int(allowance)
        for fd, why in over_limits(held, self._limit, self._total_limit):
            name = self._total_name if why.startswith("all") else self._limit_name
            self._cut(fd, f"{why} ({name})")

    def _events(self, now: float) -> None:
        while cast(int, self.monitor.get(zmq.EVENTS)) & zmq.POLLIN:  # a whole event waits
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            fd = int(event["value"])
            if event["event"] != zmq.EVENT_ACCEPTED:
                self._forget(fd)
                continue
            self._forget(fd)  # a descriptor number reused before its close was reported
            peer = _with_fd(fd, "peer")
            address = peer if isinstance(peer, str) else "?"
            if len(self._conns) >= self._max:
                self._cut(fd, f"{len(self._conns)} connections are open, the most allowed "
                              "(2 x --max-sessions + 64)")
            elif self._by_address.get(address, 0) >= self._per_address:
                self._cut(fd, f"{address} has {self._per_address} connections open, the most "
                              "one address may (2 x --max-sessions-per-address + 16)")
            else:
                self._conns[fd] = _Conn(now, address)
                self._by_address[address] = self._by_address.get(address, 0) + 1

    def _forget(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is not None:
            left = self._by_address[conn.address] - 1
            if left:
                self._by_address[conn.address] = left
            else:
                del self._by_address[conn.address]

    def _cut(self, fd: int, why: str) -> None:
        self._counters["connections_cut"] += 1
        self._forget(fd)
        self._log.warning("client connection (fd %d) cut: %s", fd, why)
        _with_fd(fd, "cut")
