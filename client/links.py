"""The ZeroMQ connections of one DataLoader, each with ZMTP heartbeats and a socket monitor.

Per server, one control DEALER and one data DEALER per reader process. Every socket sends ZMTP
heartbeats (a vanished host is noticed in ``ZMTP_TIMEOUT_MS``) and has a monitor whose
connect / disconnect events :meth:`Links.changes` reports as ``(server, link, up)``, for the
scheduler's liveness rules (:mod:`dataflow.client.servers`).

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping

import zmq
from zmq.utils.monitor import recv_monitor_message

from dataflow.client.descriptors import reserve
from dataflow.security import HANDSHAKE_FAILURES, ClientCurve, handshake_failure, secure_client

ZMTP_HEARTBEAT_MS = 1000
ZMTP_TIMEOUT_MS = 3000
MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILURES


def context(io_threads: int) -> zmq.Context:
    """A loader's ZeroMQ context, for as many connections as its open-file limit allows:
    libzmq's default of 1,023 sockets a context held only ~340 connections (each a socket, its
    monitor and libzmq's end of the monitor), so a loader joined to 16 servers of 24 readers
    failed with "Too many open files" whatever the limit; raised to libzmq's own limit (its
    table of sockets costs 12 bytes a slot)."""
    ctx = zmq.Context(io_threads=io_threads)
    ctx.set(zmq.MAX_SOCKETS, ctx.get(zmq.SOCKET_LIMIT))
    return ctx


class Links:
    """Opens, watches and closes the sockets of one loader, registered on ``poller``, each under
    the CURVE policy ``curve`` (None: clear text); ``endpoint`` names a server by its number
    (for messages).

    Attributes:
        data: each open data socket -> ``(server, reader)``.
    """

    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, curve: ClientCurve | None,
                 endpoint: Callable[[int], str]) -> None:
        self._endpoint = endpoint
        self._ctx = ctx
        self._poller = poller
        self._curve = curve
        self._monitors: dict[zmq.Socket, tuple[int, Hashable, zmq.Socket]] = {}
        self.data: dict[zmq.Socket, tuple[int, int]] = {}

    def open(self, server: int, link: Hashable, routing_id: bytes, endpoint: str) -> zmq.Socket:
        """A DEALER with ZMTP heartbeats and a monitor, connected to ``endpoint``; a data
        socket when ``link`` is a reader number.

        Raises:
            ConfigError: the open-file hard limit leaves no room for the connection
                (:func:`~dataflow.client.descriptors.reserve` raises the soft limit else).
        """
        reserve(1)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
        if endpoint.startswith("tcp://["):  # an IPv6 address (a name's AAAA record)
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_TIMEOUT_MS)
        secure_client(sock, self._curve)
        monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self._monitors[monitor] = (server, link, sock)
        self._poller.register(monitor, zmq.POLLIN)
        sock.connect(endpoint)
        self._poller.register(sock, zmq.POLLIN)
        if isinstance(link, int):
            self.data[sock] = (server, link)
        return sock

    def close(self, sock: zmq.Socket, linger: int) -> None:
        """Close ``sock`` and its monitor."""
        for monitor, (_, _, watched) in list(self._monitors.items()):
            if watched is sock:
                self._poller.unregister(monitor)
                del self._monitors[monitor]
                sock.disable_monitor()
                monitor.close(linger=0)
        self._poller.unregister(sock)
        self.data.pop(sock, None)
        sock.close(linger=linger)

    def drop_data(self, server: int) -> None:
        """Close every data socket of ``server``."""
        for sock in [s for s, (srv, _) in self.data.items() if srv == server]:
            self.close(sock, 0)

    def changes(self, events: Mapping) -> Iterator[tuple[int, Hashable, bool]]:
        """``(server, link, up)`` for each connection a polled monitor saw come up or go
        down.

        Raises:
            ServerUnavailable: a server refused this client's CURVE handshake (naming it).
        """
        for monitor in [m for m in self._monitors if events.get(m)]:
            server, link, _ = self._monitors[monitor]
            while True:
                try:
                    note = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                event = note["event"]
                refused = handshake_failure(event, note["value"], self._endpoint(server))
                if refused is not None:
                    raise refused
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    yield server, link, True
                elif event == zmq.EVENT_DISCONNECTED:
                    yield server, link, False
