"""The client's background I/O thread: a thin poll loop over every ZeroMQ socket of a loader.

Per server, one control DEALER (HELLO, REQUEST, HEARTBEAT, BYE) to the server's endpoint and
one data DEALER to each of its reader processes (routing id: the session token from INDEX),
on which BATCH and ERROR replies arrive. The loop only moves bytes; the decisions are made by
pure parts it drives:

* :class:`~dataflow.client.handshake.Handshake`: HELLO / INDEX / data connections;
* :class:`~dataflow.client.scheduler.Scheduler`: which batch to request from which server,
  credits, window, heartbeats and liveness;
* :class:`~dataflow.client.reorder.Reorder`: replies back into plan order;
* :class:`~dataflow.client.handoff.Handoff`: commands in, batches and failures out.

Thread invariant: sockets, the sink, the scheduler and the reorder buffer are touched only by
this thread; the consumer reaches it only through the :class:`Handoff`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Ready
from dataflow.client.handoff import Handoff, StartEpoch, Stop
from dataflow.client.handshake import Handshake
from dataflow.client.receive import drain, receive_batch, receive_header
from dataflow.client.reorder import Reorder
from dataflow.client.scheduler import Scheduler
from dataflow.errors import ProtocolError, RemoteError, ServerUnavailable

HEARTBEAT_S = 1.0
MAX_POLL_MS = 250
BYE_LINGER_MS = 100
DRAIN_PER_WAKE = 64


class IOThread(threading.Thread):
    """Background I/O of one DataLoader.

    Args:
        endpoints: server endpoints.
        credits: credits asked of each server (the prefetch depth).
        timeout: seconds without progress (or without a finished handshake) before a server
            is declared unavailable.
        sink: where batches are received.
        name: client description sent in HELLO.
    """

    def __init__(self, endpoints: Sequence[str], credits: int, timeout: float,
                 sink: HostSink | CudaSink, name: str) -> None:
        super().__init__(name="dataflow-client-io", daemon=True)
        self._endpoints = list(endpoints)
        self._credits = credits
        self._timeout = timeout
        self._sink = sink
        self._client_name = name
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.handoff: Handoff[Ready] = Handoff(self._wake)
        self._scheduler = Scheduler(self._endpoints, timeout, HEARTBEAT_S)
        self._reorder: Reorder[Ready] = Reorder(0, 0)
        self._control: list[zmq.Socket] = []
        self._data: dict[zmq.Socket, tuple[int, int]] = {}
        self._poller = zmq.Poller()

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

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            ctx: zmq.Context = zmq.Context.instance()
            for endpoint in self._endpoints:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoint)
                self._control.append(sock)
                self._poller.register(sock, zmq.POLLIN)
            self._poller.register(self._wake_r, zmq.POLLIN)
            if self._handshake(ctx):
                self._serve()
        except Exception as e:
            self.handoff.fail(e)
        finally:
            self._close()

    def _poll(self, seconds: float) -> tuple[dict, bool]:
        """Poll once; returns the events and whether a Stop command arrived."""
        events = dict(self._poller.poll(int(min(seconds * 1000, MAX_POLL_MS)) + 1))
        stop = False
        if self._wake_r in events:
            os.read(self._wake_r, 4096)
            for cmd in self.handoff.commands():
                if isinstance(cmd, Stop):
                    stop = True
                elif isinstance(cmd, StartEpoch):
                    self._start_epoch(cmd)
        return events, stop

    def _handshake(self, ctx: zmq.Context) -> bool:
        """Run the handshake; False when stopped first."""
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
                        self._connect(ctx, server, msg.session.encode(), data)
            for sock, (server, reader) in self._data.items():
                if events.get(sock):
                    msg = self._header(sock, server)
                    if msg is not None:
                        hs.on_data(server, reader, msg)
        now = time.monotonic()
        for server, index in enumerate(hs.indexes):
            self._scheduler.grant(server, index.credits, now)
        self.handoff.capacity = self._scheduler.window
        self.handoff.handshake_done(hs.indexes)
        return True

    def _header(self, sock: zmq.Socket, server: int) -> wire.Message | None:
        msg = receive_header(sock, self._endpoints[server])
        if isinstance(msg, wire.BatchMsg):
            drain(sock)
            raise ProtocolError(f"{self._endpoints[server]}: BATCH before the handshake ended")
        return msg

    def _connect(self, ctx: zmq.Context, server: int, token: bytes, data: list[str]) -> None:
        """One data connection per reader of ``server``, each opened with a HEARTBEAT."""
        for reader, endpoint in enumerate(data):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, token)
            sock.connect(endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))
            self._data[sock] = (server, reader)
            self._poller.register(sock, zmq.POLLIN)

    def _serve(self) -> None:
        while True:
            now = time.monotonic()
            self._request(now)
            events, stop = self._poll(self._scheduler.next_deadline(now))
            if stop:
                return
            for server, sock in enumerate(self._control):
                if events.get(sock):
                    self._receive_all(sock, server)
            for sock, (server, _) in self._data.items():
                if events.get(sock):
                    self._receive_all(sock, server)
            now = time.monotonic()
            for server in self._scheduler.heartbeats_due(now):
                try:
                    self._control[server].send_multipart(wire.encode(wire.Heartbeat()),
                                                         flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
            self._scheduler.check(now)

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
            if not self._scheduler.window_full(taken):
                return
            # Ask to be woken by the next take; a take since the first look is seen here, so
            # no wake-up is missed between the two.
            fresh = self.handoff.taken(gen, window_full=True)
            if fresh == taken:
                return
            taken = fresh

    def _receive_all(self, sock: zmq.Socket, server: int) -> None:
        for _ in range(DRAIN_PER_WAKE):
            msg = receive_header(sock, self._endpoints[server])
            if msg is None:
                return
            self._on_message(sock, server, msg)

    def _on_message(self, sock: zmq.Socket, server: int, msg: wire.Message) -> None:
        endpoint = self._endpoints[server]
        now = time.monotonic()
        if isinstance(msg, wire.Heartbeat):
            return
        if isinstance(msg, wire.BatchMsg):
            slot = self._scheduler.on_reply(server, msg.req_id, now)
            if slot is None:
                drain(sock)
                return
            ready = receive_batch(sock, endpoint, msg, self._sink)
            for i, item in self._reorder.add(slot.index, ready):
                self.handoff.deliver(slot.gen, i, item)
            return
        if isinstance(msg, wire.ErrorMsg):
            self._on_error(server, msg, now)
            return
        raise ProtocolError(f"{endpoint}: unexpected {wire.kind_of(msg).name} message")

    def _on_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        endpoint = self._endpoints[server]
        if msg.kind == wire.ErrorKind.UNKNOWN_CLIENT:
            raise ServerUnavailable(
                endpoint, f"the server has no session for this client any more ({msg.message});"
                f" {self._scheduler.outstanding(server)} outstanding request(s) were lost. "
                "Open a new DataLoader and load_state_dict() the last state_dict() to resume")
        if msg.req_id >= 0 and self._scheduler.on_reply(server, msg.req_id, now) is None:
            return
        raise RemoteError(endpoint, str(msg.kind), msg.message)

    def _close(self) -> None:
        for sock in self._control:
            try:
                sock.send_multipart(wire.encode(wire.Bye()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            sock.close(linger=BYE_LINGER_MS)
        for sock in self._data:
            sock.close(linger=0)
        self._reorder.clear()
        self._sink.close()
