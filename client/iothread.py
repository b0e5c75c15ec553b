"""The client's background I/O thread: a thin poll loop over every ZeroMQ socket of a loader.

Per server, one control DEALER (HELLO, REQUEST, HEARTBEAT, BYE) to the server's endpoint, with
a routing id that is stable for the DataLoader's life (so a reconnect after a network cut finds
the server's session for this client again), and one data DEALER to each of its reader
processes (routing id: the session token from INDEX), on which BATCH and ERROR replies arrive.
Every socket sends ZMTP heartbeats (a vanished host is noticed in ``ZMTP_TIMEOUT_MS``) and has
a socket monitor whose connect / disconnect events feed the scheduler's liveness rules. The
loop only moves bytes; the decisions are made by pure parts it drives:

* :class:`~dataflow.client.handshake.Handshake` / :class:`~dataflow.client.handshake.Join`:
  HELLO / INDEX / data connections, at start and when a lost server joins again;
* :class:`~dataflow.client.scheduler.Scheduler`: which batch to request from which server,
  credits, window, heartbeats, liveness and failover;
* :class:`~dataflow.client.reorder.Reorder`: replies back into plan order;
* :class:`~dataflow.client.handoff.Handoff`: commands in, batches and failures out.

Thread invariant: sockets, the sink, the scheduler and the reorder buffer are touched only by
this thread; the consumer reaches it only through the :class:`Handoff`.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Hashable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Ready
from dataflow.client.handoff import Handoff, StartEpoch, Stop
from dataflow.client.handshake import Handshake, Join
from dataflow.client.receive import drain, receive_batch, receive_header
from dataflow.client.reorder import Reorder
from dataflow.client.scheduler import CONTROL, Scheduler, State
from dataflow.errors import DatasetMismatchError, ProtocolError, RemoteError
from dataflow.index import DatasetIndex
from dataflow.security import HANDSHAKE_FAILURES, ClientCurve, handshake_failure, secure_client
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.client")

HEARTBEAT_S = 1.0
SILENT_S = 3.0
ZMTP_HEARTBEAT_MS = 1000
ZMTP_TIMEOUT_MS = 3000
MAX_POLL_MS = 250
BYE_LINGER_MS = 100
DRAIN_PER_WAKE = 64
MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILURES
# Replies to these request errors are not the request's answer: the batch goes elsewhere.
SERVER_GONE = (ErrorKind.SERVER_STOPPING, ErrorKind.UNKNOWN_CLIENT)


class IOThread(threading.Thread):
    """Background I/O of one DataLoader.

    Args:
        endpoints: server endpoints.
        credits: credits asked of each server (the prefetch depth).
        timeout: seconds the first handshake, a join, or an epoch without any usable server
            may take before :class:`~dataflow.errors.ServerUnavailable`.
        grace: seconds a server may be disconnected or silent before it is lost.
        sink: where batches are received.
        name: client description sent in HELLO.
        curve: CURVE keys applied to every socket (None: clear text); a refused handshake
            raises :class:`~dataflow.errors.ServerUnavailable` at once.
    """

    def __init__(self, endpoints: Sequence[str], credits: int, timeout: float, grace: float,
                 sink: HostSink | CudaSink, name: str, curve: ClientCurve | None = None) -> None:
        super().__init__(name="dataflow-client-io", daemon=True)
        self._endpoints = list(endpoints)
        self._credits = credits
        self._timeout = timeout
        self._sink = sink
        self._client_name = name
        self._curve = curve
        self._routing_id = secrets.token_hex(8).encode()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.handoff: Handoff[Ready] = Handoff(self._wake)
        self._scheduler = Scheduler(self._endpoints, timeout=timeout, heartbeat_s=HEARTBEAT_S,
                                    silent_s=SILENT_S, grace=grace)
        self._reorder: Reorder[Ready] = Reorder(0, 0)
        self._control: list[zmq.Socket] = []
        self._data: dict[zmq.Socket, tuple[int, int]] = {}
        self._monitors: dict[zmq.Socket, tuple[int, Hashable, zmq.Socket]] = {}
        self._joins: dict[int, Join] = {}
        self._fingerprint = ""
        self._poller = zmq.Poller()
        self._ctx: zmq.Context = zmq.Context.instance()

    # -- consumer side --------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def stop(self, join_timeout: float = 5.0) -> None:
        """Stop the thread (it says BYE to the servers and closes its sockets); idempotent."""
        if self._wake_w < 0:
            return
        if self.is_alive():
            self.handoff.command(Stop())
            self.join(join_timeout)
        if not self.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    # -- sockets --------------------------------------------------------------------------------

    def _socket(self, server: int, link: Hashable, routing_id: bytes, endpoint: str) -> zmq.Socket:
        """A DEALER with ZMTP heartbeats and a monitor, connected to ``endpoint``."""
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_TIMEOUT_MS)
        secure_client(sock, self._curve)
        monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self._monitors[monitor] = (server, link, sock)
        self._poller.register(monitor, zmq.POLLIN)
        sock.connect(endpoint)
        self._poller.register(sock, zmq.POLLIN)
        return sock

    def _close_socket(self, sock: zmq.Socket, linger: int) -> None:
        for monitor, (_, _, watched) in list(self._monitors.items()):
            if watched is sock:
                self._poller.unregister(monitor)
                del self._monitors[monitor]
                sock.disable_monitor()
                monitor.close(linger=0)
        self._poller.unregister(sock)
        sock.close(linger=linger)

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        server, link, _ = self._monitors[monitor]
        while True:
            try:
                note = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            event = note["event"]
            refused = handshake_failure(event, note["value"], self._endpoints[server])
            if refused is not None:
                raise refused
            up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if not up and event != zmq.EVENT_DISCONNECTED:
                continue
            if not up:
                log.info("%s: %s connection down", self._endpoints[server],
                         "control" if link == CONTROL else f"reader {link}")
            self._scheduler.link(server, link, up, time.monotonic())

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            for server, endpoint in enumerate(self._endpoints):
                self._control.append(self._socket(server, CONTROL, self._routing_id, endpoint))
            self._poller.register(self._wake_r, zmq.POLLIN)
            if self._handshake():
                self._serve()
        except Exception as e:
            self.handoff.fail(e)
        finally:
            self._close()

    def _poll(self, seconds: float) -> tuple[dict, bool]:
        """Poll once (monitor events are handled here); returns the events and whether a Stop
        command arrived."""
        events = dict(self._poller.poll(int(min(seconds * 1000, MAX_POLL_MS)) + 1))
        for monitor in [m for m in self._monitors if events.get(m)]:
            self._on_monitor(monitor)
        stop = False
        if self._wake_r in events:
            os.read(self._wake_r, 4096)
            for cmd in self.handoff.commands():
                if isinstance(cmd, Stop):
                    stop = True
                elif isinstance(cmd, StartEpoch):
                    self._start_epoch(cmd)
        return events, stop

    def _handshake(self) -> bool:
        """Run the first handshake; False when stopped first."""
        hs = Handshake(self._endpoints, time.monotonic() + self._timeout, self._timeout)
        hello = wire.encode(wire.Hello(self._credits, self._client_name))
        for sock in self._control:
            sock.send_multipart(hello)
        while not hs.done:
            hs.check(time.monotonic())
            events, stop = self._poll(hs.left(time.monotonic()))
            if stop:
                return False
            for server, sock in enumerate(self._control):
                if events.get(sock):
                    msg = self._header(sock, server)
                    if msg is not None:
                        data = hs.on_control(server, msg)
                        assert isinstance(msg, wire.Index)
                        self._connect(server, msg.session.encode(), data)
            for sock, (server, reader) in self._data.items():
                if events.get(sock):
                    msg = self._header(sock, server)
                    if msg is not None:
                        hs.on_data(server, reader, msg)
        now = time.monotonic()
        for server, index in enumerate(hs.indexes):
            self._scheduler.grant(server, index.credits, now)
        self._fingerprint = DatasetIndex.from_json(hs.indexes[0].index_json).fingerprint
        self.handoff.capacity = self._scheduler.window
        self.handoff.handshake_done(hs.indexes)
        return True

    def _header(self, sock: zmq.Socket, server: int) -> wire.Message | None:
        msg = receive_header(sock, self._endpoints[server])
        if isinstance(msg, wire.BatchMsg):
            drain(sock)
            raise ProtocolError(f"{self._endpoints[server]}: BATCH before the handshake ended")
        return msg

    def _connect(self, server: int, token: bytes, data: list[str]) -> None:
        """One data connection per reader of ``server``, each opened with a HEARTBEAT."""
        for reader, endpoint in enumerate(data):
            sock = self._socket(server, reader, token, endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))
            self._data[sock] = (server, reader)

    def _drop_data(self, server: int) -> None:
        """Close the data connections of a lost server (and forget its join attempt)."""
        for sock in [s for s, (srv, _) in self._data.items() if srv == server]:
            del self._data[sock]
            self._close_socket(sock, 0)
        self._joins.pop(server, None)

    def _serve(self) -> None:
        while True:
            now = time.monotonic()
            for server in self._scheduler.hellos_due(now):
                self._hello(server, now)
            self._request(now)
            events, stop = self._poll(self._scheduler.next_deadline(now))
            if stop:
                return
            for server, sock in enumerate(self._control):
                if events.get(sock):
                    self._receive_all(sock, server, -1)
            for sock, (server, reader) in list(self._data.items()):
                if events.get(sock) and sock in self._data:
                    self._receive_all(sock, server, reader)
            now = time.monotonic()
            for server in self._scheduler.heartbeats_due(now):
                try:
                    self._control[server].send_multipart(wire.encode(wire.Heartbeat()),
                                                         flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
            for server in self._scheduler.check(now):
                log.warning("%s: lost (no usable connection for the grace period, or its join "
                            "timed out); its batches go to the other servers",
                            self._endpoints[server])
                self._drop_data(server)
                self.handoff.count("servers_lost")

    def _start_epoch(self, cmd: StartEpoch) -> None:
        self._scheduler.start_epoch(cmd.gen, cmd.batches, cmd.first)
        self._reorder.clear()
        self._reorder = Reorder(cmd.first, self._scheduler.window)

    def _request(self, now: float) -> None:
        gen = self._scheduler.gen
        if gen is None:
            return
        taken = self.handoff.taken(gen, window_full=False)
        while True:
            for a in self._scheduler.assignments(taken, now):
                req = wire.Request(a.req_id, a.ranges)
                self._control[a.server].send_multipart(wire.encode(req), flags=zmq.NOBLOCK)
                if a.retry:
                    self.handoff.count("rerequested")
            if not self._scheduler.window_full(taken):
                return
            # Ask to be woken by the next take; a take since the first look is seen here, so
            # no wake-up is missed between the two.
            fresh = self.handoff.taken(gen, window_full=True)
            if fresh == taken:
                return
            taken = fresh

    def _receive_all(self, sock: zmq.Socket, server: int, reader: int) -> None:
        for _ in range(DRAIN_PER_WAKE):
            if sock not in self._data and reader >= 0:
                return  # closed: its server was lost while its messages were read
            msg = receive_header(sock, self._endpoints[server])
            if msg is None:
                return
            self._on_message(sock, server, reader, msg)

    # -- messages -------------------------------------------------------------------------------

    def _on_message(self, sock: zmq.Socket, server: int, reader: int,
                    msg: wire.Message) -> None:
        """A message from ``server`` (``reader`` -1: its control connection)."""
        now = time.monotonic()
        if isinstance(msg, wire.BatchMsg):
            self._on_batch(sock, server, msg, now)
        elif (isinstance(msg, wire.ErrorMsg) and msg.req_id >= 0
              and msg.kind not in SERVER_GONE):
            self._on_request_error(server, msg, now)
        elif self._scheduler.state(server) is State.JOINING:
            self._on_join(server, reader, msg, now)
        elif isinstance(msg, wire.ErrorMsg):
            self._on_server_error(server, msg, now)
        elif isinstance(msg, wire.Heartbeat):
            self._scheduler.heard(server, now)
        else:
            raise ProtocolError(f"{self._endpoints[server]}: unexpected "
                                f"{wire.kind_of(msg).name} message")

    def _on_batch(self, sock: zmq.Socket, server: int, msg: wire.BatchMsg, now: float) -> None:
        endpoint = self._endpoints[server]
        slot = self._scheduler.on_reply(server, msg.req_id, now)
        if slot is None:
            drain(sock)
            return
        try:
            slot.check_size(endpoint, msg.req_id, msg.size, msg.skipped)
        except ProtocolError:
            drain(sock)
            raise
        ready = receive_batch(sock, endpoint, msg, self._sink)
        if msg.skipped:
            self.handoff.count("skipped", msg.skipped)
        if slot.retry:
            self.handoff.count("recovered")
        for i, item in self._reorder.add(slot.index, ready):
            self.handoff.deliver(slot.gen, i, item)

    def _on_request_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        if msg.kind is ErrorKind.UNDELIVERABLE:
            self._scheduler.undelivered(server, msg.req_id, now)
        elif self._scheduler.on_reply(server, msg.req_id, now) is not None:
            raise RemoteError(self._endpoints[server], str(msg.kind), msg.message)

    def _on_server_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        """An ERROR about the session, not about one request."""
        if msg.kind is ErrorKind.SERVER_STOPPING:
            self._lose(server, now, f"stopping ({msg.message})", hello=False)
        elif msg.kind is ErrorKind.UNKNOWN_CLIENT:
            if self._scheduler.state(server) in (State.UP, State.SUSPECT):
                self._lose(server, now, f"it lost this client's session ({msg.message})",
                           hello=True)
        else:
            raise RemoteError(self._endpoints[server], str(msg.kind), msg.message)

    def _lose(self, server: int, now: float, why: str, *, hello: bool) -> None:
        log.warning("%s: lost: %s; its batches go to the other servers",
                    self._endpoints[server], why)
        self._scheduler.lost(server, now, hello=hello)
        self._drop_data(server)
        self.handoff.count("servers_lost")

    # -- joining again --------------------------------------------------------------------------

    def _hello(self, server: int, now: float) -> None:
        """Ask a lost server to join again (its connection is up)."""
        self._drop_data(server)
        self._joins[server] = Join(self._endpoints[server], self._fingerprint)
        try:
            self._control[server].send_multipart(
                wire.encode(wire.Hello(self._credits, self._client_name)), flags=zmq.NOBLOCK)
        except zmq.Again:
            self._scheduler.join_failed(server, now, retry=True)

    def _on_join(self, server: int, reader: int, msg: wire.Message, now: float) -> None:
        join = self._joins[server]
        if isinstance(msg, wire.Heartbeat) and reader < 0:
            return  # answers to heartbeats sent before it was lost
        if isinstance(msg, wire.ErrorMsg) and msg.kind is ErrorKind.UNKNOWN_CLIENT:
            return
        if isinstance(msg, wire.ErrorMsg) and msg.kind is ErrorKind.SERVER_STOPPING:
            self._lose(server, now, f"stopping ({msg.message})", hello=False)
            return
        try:
            if reader < 0:
                data = join.on_control(msg)
                assert isinstance(msg, wire.Index)
                self._connect(server, msg.session.encode(), data)
            else:
                join.on_data(reader, msg)
        except (DatasetMismatchError, ProtocolError, RemoteError) as e:
            log.error("%s: stays out: %s", self._endpoints[server], e)
            self._drop_data(server)
            self._scheduler.join_failed(server, now,
                                        retry=not isinstance(e, DatasetMismatchError))
            return
        if join.done and join.index is not None:
            self._scheduler.grant(server, join.index.credits, now)
            self._joins.pop(server)
            self.handoff.count("rejoined")
            log.warning("%s: joined again with %d credit(s)", self._endpoints[server],
                        join.index.credits)

    def _close(self) -> None:
        for sock in self._control:
            try:
                sock.send_multipart(wire.encode(wire.Bye()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self._close_socket(sock, BYE_LINGER_MS)
        for sock in list(self._data):
            self._close_socket(sock, 0)
        self._reorder.clear()
        self._sink.close()
