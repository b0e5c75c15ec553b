"""What the client's I/O thread does with each message a server sends, and joining again.

BATCH replies are received into the sink, checked against their request and handed over in
plan order; request errors either re-queue the batch or raise; session errors lose the server
(its batches go to the others); a lost server is asked to join again and its reader
connections made anew (:class:`~dataflow.client.handshake.Join`). Decisions are the
scheduler's (:mod:`dataflow.client.scheduler`); this is the glue between it and the sockets.

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

import logging
import time

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Ready
from dataflow.client.handoff import Extend, Failed, Handoff, Need, StartEpoch
from dataflow.client.handshake import Join
from dataflow.client.links import Links
from dataflow.client.receive import drain, receive_batch, receive_header
from dataflow.client.reorder import Reorder
from dataflow.client.scheduler import Scheduler, State
from dataflow.errors import DatasetMismatchError, ProtocolError, RemoteError
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.client")

DRAIN_PER_WAKE = 64
# Replies to these request errors are not the request's answer: the batch goes elsewhere.
SERVER_GONE = (ErrorKind.SERVER_STOPPING, ErrorKind.UNKNOWN_CLIENT)


class Dispatch:
    """Message handling of one loader's I/O thread.

    Attributes:
        fingerprint: the dataset's fingerprint (set after the first handshake); a server
            joining again must serve the same.
    """

    def __init__(self, endpoints: list[str], hello: list[wire.Buffer], scheduler: Scheduler,
                 handoff: Handoff[Ready], links: Links, control: dict[int, zmq.Socket],
                 sink: HostSink | CudaSink) -> None:
        self._endpoints = endpoints  # the I/O thread's list: it grows as servers join
        self._hello = hello  # the encoded HELLO every server is sent
        self._scheduler = scheduler
        self.handoff = handoff
        self._links = links
        self._data = links.data
        self._control = control
        self._sink = sink
        self._reorder: Reorder[Ready | Failed] = Reorder(0, 0)
        self._joins: dict[int, Join] = {}
        self.fingerprint = ""

    def start_epoch(self, cmd: StartEpoch) -> None:
        self._scheduler.start_epoch(cmd.gen, cmd.batches, cmd.first, cmd.tags)
        self._reorder.clear()
        self._reorder = Reorder(cmd.first, self._scheduler.window)
        self.handoff.set_capacity(self._scheduler.window)

    def need(self, cmd: Need) -> None:
        """The consumer began a pass read ahead: its batches are needed now."""
        self._scheduler.need(cmd.gen, cmd.end)

    def extend(self, cmd: Extend) -> None:
        """Append the loader's next pass to the current generation (if ``cmd.gen`` still is)."""
        if self._scheduler.extend_epoch(cmd.gen, cmd.batches, cmd.tags):
            self._reorder.grow(self._scheduler.window)
            self.handoff.set_capacity(self._scheduler.window)

    def close(self) -> None:
        """Release the batches held for reordering."""
        self._reorder.clear()

    def connect(self, server: int, token: bytes, data: list[str]) -> None:
        """One data connection per reader of ``server``, each opened with a HEARTBEAT."""
        for reader, endpoint in enumerate(data):
            sock = self._links.open(server, reader, token, endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))

    def drop_data(self, server: int) -> None:
        """Close the data connections of a lost server (and forget its join attempt)."""
        self._links.drop_data(server)
        self._joins.pop(server, None)

    def receive_all(self, sock: zmq.Socket, server: int, reader: int) -> None:
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
        self._hand_over(slot.gen, slot.index, ready)

    def _on_request_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        """A request failed: the batch is requested again (undeliverable), or its error takes
        its place in plan order, raised when the consumer reaches it."""
        if msg.kind is ErrorKind.UNDELIVERABLE:
            self._scheduler.undelivered(server, msg.req_id, now)
            return
        slot = self._scheduler.on_reply(server, msg.req_id, now)
        if slot is not None:
            self._hand_over(slot.gen, slot.index,
                            Failed(RemoteError(self._endpoints[server], str(msg.kind),
                                               msg.message)))

    def _hand_over(self, gen: int, index: int, item: Ready | Failed) -> None:
        for i, due in self._reorder.add(index, item):
            self.handoff.deliver(gen, i, due)

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
        self.drop_data(server)
        self.handoff.count("servers_lost")

    # -- joining again --------------------------------------------------------------------------

    def hello(self, server: int, now: float) -> None:
        """Ask a lost server to join again (its connection is up)."""
        self.drop_data(server)
        self._joins[server] = Join(self._endpoints[server], self.fingerprint)
        try:
            self._control[server].send_multipart(self._hello, flags=zmq.NOBLOCK)
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
                self.connect(server, msg.session.encode(), data)
            else:
                join.on_data(reader, msg)
        except (DatasetMismatchError, ProtocolError, RemoteError) as e:
            log.error("%s: stays out: %s", self._endpoints[server], e)
            self.drop_data(server)
            self._scheduler.join_failed(server, now,
                                        retry=not isinstance(e, DatasetMismatchError))
            return
        if join.done and join.index is not None:
            first = self._scheduler.grant(server, join.index.credits, now)
            self._joins.pop(server)
            self.handoff.count("joined" if first else "rejoined")
            log.warning("%s: joined%s with %d credit(s)", self._endpoints[server],
                        "" if first else " again", join.index.credits)
