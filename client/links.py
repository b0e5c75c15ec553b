"""The ZeroMQ connections of one DataLoader, each with ZMTP heartbeats and a socket monitor.

Per server, one control DEALER and one data DEALER per reader process. Each data socket is
bound to the loader's ZeroMQ I/O thread that holds the fewest data sockets (``ZMQ_AFFINITY``):
left to libzmq, which picks the least loaded thread as it counts load when a socket connects,
two readers' connections opened together often shared one thread while the other idled (4 MiB
batches on 2 cores: 0.79 core-ms a batch on one thread against ~0.4 on each of two, and the
rate moved with where they landed: ``bench/RESULTS.md``). Every socket sends ZMTP
heartbeats (a vanished host is noticed in ``ZMTP_TIMEOUT_MS``) and has a monitor whose
connect / disconnect events :meth:`Links.changes` reports as ``(server, link, up)``, for the
scheduler's liveness rules (:mod:`dataflow.client.servers`). A monitor is polled with the
sockets while its connection is not up (an event is then awaited: the join goes on at once);
once up, apart from them, every :data:`MONITOR_MS`: a poll costs ~1.3 us a socket polled
(pyzmq builds its poll set every call), and the I/O thread polls its sockets about once a
batch.

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
MONITOR_MS = 50
"""How often the I/O thread reads the events of the monitors of connections that are up (see
the module)."""


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
        self._watch = zmq.Poller()  # the monitors of connections that are up
        self._pending: set[zmq.Socket] = set()  # the others', polled with the sockets
        self._threads: dict[zmq.Socket, int] = {}  # data socket -> its I/O thread
        # ZMQ_AFFINITY is a 64-bit mask that pyzmq takes as a signed integer: bit 63 is out
        self._io_threads = min(ctx.get(zmq.IO_THREADS), 63)
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
        if isinstance(link, int):
            thread = self._quietest()
            sock.setsockopt(zmq.AFFINITY, 1 << thread)
            self._threads[sock] = thread
        secure_client(sock, self._curve)
        monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self._monitors[monitor] = (server, link, sock)
        self._poller.register(monitor, zmq.POLLIN)
        self._pending.add(monitor)
        sock.connect(endpoint)
        self._poller.register(sock, zmq.POLLIN)
        if isinstance(link, int):
            self.data[sock] = (server, link)
        return sock

    def close(self, sock: zmq.Socket, linger: int) -> None:
        """Close ``sock`` and its monitor."""
        for monitor, (_, _, watched) in list(self._monitors.items()):
            if watched is sock:
                if monitor in self._pending:
                    self._pending.discard(monitor)
                    self._poller.unregister(monitor)
                else:
                    self._watch.unregister(monitor)
                del self._monitors[monitor]
                sock.disable_monitor()
                monitor.close(linger=0)
        self._poller.unregister(sock)
        self.data.pop(sock, None)
        self._threads.pop(sock, None)
        sock.close(linger=linger)

    def _quietest(self) -> int:
        """The I/O thread (a number below the context's ``IO_THREADS``) with the fewest open
        data sockets, the lowest on a tie."""
        held = [0] * self._io_threads
        for thread in self._threads.values():
            held[thread] += 1
        return held.index(min(held))

    def drop_data(self, server: int) -> None:
        """Close every data socket of ``server``."""
        for sock in [s for s, (srv, _) in self.data.items() if srv == server]:
            self.close(sock, 0)

    def changes(self, events: Mapping, watch: bool) -> Iterator[tuple[int, Hashable, bool]]:
        """``(server, link, up)`` for each connection a monitor saw come up or go down: the
        monitors of connections not up that the poll of ``events`` found ready, and when
        ``watch``, those of connections that are up (a poll that does not wait).

        Raises:
            ServerUnavailable: a server refused this client's CURVE handshake (naming it).
        """
        due = [m for m in self._pending if events.get(m)]
        if watch:
            due += [m for m, _ in self._watch.poll(0)]
        for monitor in due:
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
                if event not in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):
                    continue
                up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                if up == (monitor in self._pending):  # moved before the caller hears of it
                    self._move(monitor, up)
                yield server, link, up

    def _move(self, monitor: zmq.Socket, up: bool) -> None:
        """Poll ``monitor`` apart from the sockets when its connection is ``up``, else with
        them."""
        if up:
            self._pending.discard(monitor)
            self._poller.unregister(monitor)
            self._watch.register(monitor, zmq.POLLIN)
        else:
            self._watch.unregister(monitor)
            self._poller.register(monitor, zmq.POLLIN)
            self._pending.add(monitor)
