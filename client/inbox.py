"""What the client's I/O thread does with each message a server sends.

BATCH replies are received into the sink, checked against their request and handed over in
stream order; request errors either re-queue the batch or raise; session errors lose the server
(its batches go to the others). Messages of a server that is joining go to its join
(:mod:`dataflow.client.joins`); once it joined, the hand-off makes room for its credits and
admits it (the first one starts the loader: :meth:`Handoff.admitted`). Decisions are the
scheduler's (:mod:`dataflow.client.scheduler`); this is the glue between it and the sockets.

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Received
from dataflow.client.handoff import Failed, Handoff
from dataflow.client.joins import Joins
from dataflow.client.links import Links
from dataflow.client.receive import drain, receive_batch, receive_header
from dataflow.client.reorder import Reorder
from dataflow.client.scheduler import Late, Scheduler, State
from dataflow.client.shmring import ShmRings, receive_shared
from dataflow.client.stream import Demand
from dataflow.errors import ProtocolError, RemoteError, RequestTimeout
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.client")

DRAIN_PER_WAKE = 64
# Replies to these request errors are not the request's answer: the batch goes elsewhere.
SERVER_GONE = (ErrorKind.SERVER_STOPPING, ErrorKind.UNKNOWN_CLIENT)


def batch_bytes(msg: wire.BatchMsg, batch_size: int) -> int:
    """The bytes of a whole batch of ``batch_size`` samples, by reply ``msg`` (of one sample
    or more): its bytes a sample, whatever its samples (a short last batch, samples left out,
    several batches), so a short reply does not size the depth for too many batches."""
    return wire.BatchLayout.of(msg).nbytes * batch_size // msg.size


class Inbox:
    """What one loader's I/O thread does with the servers' messages. Servers are known by
    their numbers; their endpoints are the scheduler's."""

    def __init__(self, scheduler: Scheduler, handoff: Handoff[Received], joins: Joins,
                 links: Links, sink: HostSink | CudaSink, shm: ShmRings,
                 batch_size: int) -> None:
        self._scheduler = scheduler
        self._batch_size = batch_size
        self._handoff = handoff
        self._joins = joins
        self._data = links.data
        self._sink = sink
        self._shm = shm
        self._reorder: Reorder[Received | Failed] = Reorder(0, 0)

    def _endpoint(self, server: int) -> str:
        return self._scheduler.endpoint(server)

    def follow(self, demand: Demand) -> None:
        """Fetch what the consumer wants read now; batches of an older generation held for
        reordering are dropped."""
        if self._scheduler.follow(demand):
            self._reorder.clear()
            self._reorder = Reorder(demand.first, self._scheduler.depth)

    def close(self) -> None:
        """Release the batches held for reordering."""
        self._reorder.clear()

    def receive_all(self, sock: zmq.Socket, server: int, reader: int) -> None:
        """Handle the messages waiting on ``sock`` (the poll found it readable), up to
        :data:`DRAIN_PER_WAKE` of them; asking ZeroMQ whether another one waits is cheaper
        than a receive that raises ``zmq.Again``."""
        for _ in range(DRAIN_PER_WAKE):
            msg = receive_header(sock, self._endpoint(server))
            if msg is None:
                return
            self._on_message(sock, server, reader, msg)
            if reader >= 0 and sock not in self._data:
                return  # closed: its server was lost while its messages were read
            if not sock.poll(0, zmq.POLLIN):
                return

    # -- messages -------------------------------------------------------------------------------

    def _on_message(self, sock: zmq.Socket, server: int, reader: int,
                    msg: wire.Message) -> None:
        """A message from ``server`` (``reader`` -1: its control connection)."""
        now = time.monotonic()
        state = self._scheduler.state(server)
        if isinstance(msg, wire.BatchMsg):
            self._on_batch(sock, server, msg, now)
        elif (isinstance(msg, wire.ErrorMsg) and msg.req_id >= 0
              and msg.kind not in SERVER_GONE):
            self._on_request_error(server, msg, now)
        elif state is State.JOINING:
            index = self._joins.on_message(server, reader, msg, now)
            if index is not None:
                self._grow()
                self._handoff.admitted(self._endpoint(server), index)
        elif isinstance(msg, wire.Heartbeat):
            self._scheduler.heard(server, now)
        elif isinstance(msg, wire.Index) and state is State.DOWN:
            log.debug("%s: INDEX after its join was given up (ignored)", self._endpoint(server))
        elif isinstance(msg, wire.Index):
            self._on_index_again(server, msg, now)
        elif isinstance(msg, wire.ErrorMsg):
            self._on_server_error(server, msg, now)
        else:
            raise ProtocolError(f"{self._endpoint(server)}: unexpected "
                                f"{wire.kind_of(msg).name} message")

    def _on_index_again(self, server: int, msg: wire.Index, now: float) -> None:
        """An INDEX from a joined server: the answer to a HELLO of an earlier, given-up join
        (the same session: nothing to do), or a new session (this one is gone: join again)."""
        if msg.session != self._joins.session(server):
            self._lose(server, now, "it answered with a new session", hello=True)

    def _on_batch(self, sock: zmq.Socket, server: int, msg: wire.BatchMsg, now: float) -> None:
        endpoint = self._endpoint(server)
        reply = self._scheduler.on_reply(server, msg.req_id, now)
        if reply is None:
            self._shm.answered(server, msg.req_id)
            drain(sock)
            return
        slot = reply.slot
        try:
            slot.check_size(endpoint, msg)
            shared = self._shm.take(server, msg, endpoint)
        except ProtocolError:
            drain(sock)
            raise
        if shared is None:
            batches = receive_batch(sock, endpoint, msg, self._sink)
        else:
            batches = receive_shared(sock, endpoint, msg, *shared, self._sink,
                                     self._handoff.count)
        lefts = slot.left_out(msg)
        if msg.skipped:
            self._handoff.count("skipped", msg.skipped)
        if slot.retry:
            self._handoff.count("recovered")
        if (self._scheduler.sizing and msg.size
                and self._scheduler.sized(batch_bytes(msg, self._batch_size))):
            self._grow()
        for index, ready, left in zip(slot.indexes, batches, lefts, strict=True):
            if index in reply.indexes:
                self._hand_over(slot.gen, index, replace(ready, left_out=left) if left != ()
                                else ready)

    def _on_request_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        """A request failed: its batches are requested again (undeliverable, or a request of
        several batches: each is asked alone, so an error lands on its own batch), or its
        error takes its batch's place in stream order, raised when the consumer reaches it.
        Its shared-memory slot, if it lent one, is free again (the reader is done with it)."""
        self._shm.answered(server, msg.req_id)
        reply = self._scheduler.on_reply(server, msg.req_id, now)
        if reply is None:
            return
        if msg.kind is ErrorKind.UNDELIVERABLE or reply.slot.parts:
            self._scheduler.again(reply, now)
            return
        self._hand_over(reply.slot.gen, reply.slot.index,
                        Failed(RemoteError(self._endpoint(server), msg.kind, msg.message)))

    def late(self, late: Late, *, request_timeout: float) -> None:
        """A batch got no reply within ``request_timeout``: log its request to another server,
        or put its :class:`~dataflow.errors.RequestTimeout` in its place."""
        asked = ", ".join(f"{self._endpoint(i)} (transform "
                          f"{self._joins.transform(i)}, asked {age:.1f} s ago)"
                          for i, age in late.asked)
        what = f"batch {late.tag.batch} of epoch {late.tag.epoch}"
        if not late.again:
            self._handoff.count("late")
        if not late.failed:
            log.warning("%s: no reply within request_timeout %g s from %s; asking for it "
                        "again, alone", what, request_timeout, asked)
            return
        servers = dict.fromkeys(self._endpoint(i) for i, _ in late.asked)
        if late.queued:
            text = (f"{what} (global batch index) waited over request_timeout "
                    f"{request_timeout:g} s to be asked again (its server was lost, or its "
                    f"reply undeliverable): no server it could go to answered a request "
                    f"meanwhile, {asked}")
        else:
            why = ("asked for again, alone, with no reply either" if late.again
                   else "no other server could take it")
            text = (f"no reply within request_timeout {request_timeout:g} s to {what} (global "
                    f"batch index) from {asked}; {why}")
        error = RequestTimeout(", ".join(servers), text, epoch=late.tag.epoch,
                               batch=late.tag.batch)
        self._hand_over(late.gen, late.index, Failed(error))

    def _hand_over(self, gen: int, index: int, item: Received | Failed) -> None:
        for i, due in self._reorder.add(index, item):
            self._handoff.deliver(gen, i, due)

    def _on_server_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        """An ERROR about the session, not about one request."""
        joined = self._scheduler.state(server) in (State.UP, State.SUSPECT)
        if msg.kind is ErrorKind.SERVER_STOPPING and joined:
            self._lose(server, now, f"stopping ({msg.message})", hello=False)
        elif msg.kind is ErrorKind.SERVER_STOPPING:
            self._joins.failed(server, now, RemoteError(self._endpoint(server), msg.kind,
                                                        msg.message))
        elif msg.kind is ErrorKind.UNKNOWN_CLIENT:
            if joined:
                self._lose(server, now, f"it lost this client's session ({msg.message})",
                           hello=True)
        elif not joined:
            log.debug("%s: %s after its join was given up (ignored): %s",
                      self._endpoint(server), msg.kind, msg.message)
        else:
            raise RemoteError(self._endpoint(server), msg.kind, msg.message)

    def _lose(self, server: int, now: float, why: str, *, hello: bool) -> None:
        log.warning("%s: lost: %s; its batches go to the other servers",
                    self._endpoint(server), why)
        self._scheduler.lost(server, now, hello=hello)
        self._joins.drop_data(server)
        self._handoff.count("servers_lost")

    def _grow(self) -> None:
        """The scheduler's depth may have grown (a server joined): the reorder buffer and the
        hand-off hold that many from now on."""
        self._reorder.grow(self._scheduler.depth)
        self._handoff.set_capacity(self._scheduler.depth)
