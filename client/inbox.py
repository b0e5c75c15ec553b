"""What the client's I/O thread does with each message a server sends, and every join.

BATCH replies are received into the sink, checked against their request and handed over in
stream order; request errors either re-queue the batch or raise; session errors lose the server
(its batches go to the others). Every server joins through the same path
(:class:`~dataflow.client.handshake.Join`): at the start, when it was busy, slow or not up
yet, when discovery found it, and again after it was lost. The first server to join decides
the dataset and starts the loader (:meth:`Handoff.admitted`); one serving another dataset
stays out, logged. A failed join is logged once per reason and tried again in the background.
Decisions are the scheduler's (:mod:`dataflow.client.scheduler`); this is the glue between it
and the sockets.

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

import logging
import time

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Received
from dataflow.client.handoff import Failed, Handoff
from dataflow.client.handshake import Join
from dataflow.client.links import Links
from dataflow.client.receive import drain, receive_batch, receive_header
from dataflow.client.reorder import Reorder
from dataflow.client.scheduler import Late, Scheduler, State
from dataflow.client.stream import Demand
from dataflow.errors import (
    DataflowError,
    DatasetMismatchError,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.client")

DRAIN_PER_WAKE = 64
# Replies to these request errors are not the request's answer: the batch goes elsewhere.
SERVER_GONE = (ErrorKind.SERVER_STOPPING, ErrorKind.UNKNOWN_CLIENT)
# A HELLO refused so is asked again later, also before the loader started.
TRANSIENT = (ErrorKind.SERVER_BUSY, ErrorKind.SERVER_STOPPING)


class Inbox:
    """What one loader's I/O thread does with the servers' messages, and their joins. Servers
    are known by their numbers; their endpoints are the scheduler's.

    Attributes:
        fingerprint: the dataset's fingerprint (set by the first join; "" until then); every
            later join must serve the same.
    """

    def __init__(self, hello: list[wire.Buffer], scheduler: Scheduler,
                 handoff: Handoff[Received], links: Links, control: dict[int, zmq.Socket],
                 sink: HostSink | CudaSink) -> None:
        self._hello = hello  # the encoded HELLO every server is sent
        self._scheduler = scheduler
        self.handoff = handoff
        self._links = links
        self._data = links.data
        self._control = control
        self._sink = sink
        self._reorder: Reorder[Received | Failed] = Reorder(0, 0)
        self._joins: dict[int, Join] = {}
        self._sessions: dict[int, str] = {}  # server -> its session token, once joined
        self._transforms: dict[int, str] = {}  # server -> its --transform ("": none)
        self._listed = scheduler.count  # servers numbered from here on were found by discovery
        self._late: set[int] = set()  # servers that join after the loader started without them
        self._said: dict[int, str] = {}  # server -> the join failure last logged (logged once)
        self.fingerprint = ""

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
            msg = receive_header(sock, self._endpoint(server))
            if msg is None:
                return
            self._on_message(sock, server, reader, msg)

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
            self._on_join(server, reader, msg, now)
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
        if msg.session != self._sessions.get(server):
            self._lose(server, now, "it answered with a new session", hello=True)

    def _on_batch(self, sock: zmq.Socket, server: int, msg: wire.BatchMsg, now: float) -> None:
        endpoint = self._endpoint(server)
        slot = self._scheduler.on_reply(server, msg.req_id, now)
        if slot is None:
            drain(sock)
            return
        try:
            slot.check_size(endpoint, msg.size, msg.skipped)
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
        its place in stream order, raised when the consumer reaches it."""
        if msg.kind is ErrorKind.UNDELIVERABLE:
            self._scheduler.undelivered(server, msg.req_id, now)
            return
        slot = self._scheduler.on_reply(server, msg.req_id, now)
        if slot is not None:
            self._hand_over(slot.gen, slot.index,
                            Failed(RemoteError(self._endpoint(server), str(msg.kind),
                                               msg.message)))

    def late(self, late: Late, *, request_timeout: float) -> None:
        """A batch got no reply within ``request_timeout``: log its request to another server,
        or put its :class:`~dataflow.errors.RequestTimeout` in its place."""
        asked = ", ".join(f"{self._endpoint(i)} (transform "
                          f"{self._transforms.get(i) or 'none'}, asked {age:.1f} s ago)"
                          for i, age in late.asked)
        what = f"batch {late.tag.batch} of epoch {late.tag.epoch}"
        if not late.again:
            self.handoff.count("late")
        if not late.failed:
            log.warning("%s: no reply within request_timeout %g s from %s; asking another "
                        "server", what, request_timeout, asked)
            return
        why = ("asked of another server too" if late.again
               else "no other server could take it")
        error = RequestTimeout(", ".join(self._endpoint(i) for i, _ in late.asked),
                               f"no reply within request_timeout {request_timeout:g} s to "
                               f"{what} (global batch index) from {asked}; {why}",
                               epoch=late.tag.epoch, batch=late.tag.batch)
        self._hand_over(late.gen, late.index, Failed(error))

    def _hand_over(self, gen: int, index: int, item: Received | Failed) -> None:
        for i, due in self._reorder.add(index, item):
            self.handoff.deliver(gen, i, due)

    def _on_server_error(self, server: int, msg: wire.ErrorMsg, now: float) -> None:
        """An ERROR about the session, not about one request."""
        joined = self._scheduler.state(server) in (State.UP, State.SUSPECT)
        if msg.kind is ErrorKind.SERVER_STOPPING and joined:
            self._lose(server, now, f"stopping ({msg.message})", hello=False)
        elif msg.kind is ErrorKind.SERVER_STOPPING:
            self._join_failed(server, now, RemoteError(self._endpoint(server), str(msg.kind),
                                                       msg.message))
        elif msg.kind is ErrorKind.UNKNOWN_CLIENT:
            if joined:
                self._lose(server, now, f"it lost this client's session ({msg.message})",
                           hello=True)
        elif not joined:
            log.debug("%s: %s after its join was given up (ignored): %s",
                      self._endpoint(server), msg.kind, msg.message)
        else:
            raise RemoteError(self._endpoint(server), str(msg.kind), msg.message)

    def _lose(self, server: int, now: float, why: str, *, hello: bool) -> None:
        log.warning("%s: lost: %s; its batches go to the other servers",
                    self._endpoint(server), why)
        self._scheduler.lost(server, now, hello=hello)
        self.drop_data(server)
        self.handoff.count("servers_lost")

    # -- joining ------------------------------------------------------------------------------

    def hello(self, server: int, now: float) -> None:
        """Ask a server that has not joined (or was lost) to join (its connection is up)."""
        self.drop_data(server)
        self._joins[server] = Join(self._endpoint(server), self.fingerprint or None)
        try:
            self._control[server].send_multipart(self._hello, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._scheduler.join_failed(server, now, retry=True,
                                        why="HELLO could not be sent (queue full)")

    def expired(self, server: int) -> None:
        """``server``'s join ran out of time (it is asked again later): log it once."""
        self._joins.pop(server, None)
        self._tell(server, "timed out", f"{self._endpoint(server)}: join timed out ("
                   f"{self._scheduler.describe(server)}); asking again in the background")

    def _on_join(self, server: int, reader: int, msg: wire.Message, now: float) -> None:
        join = self._joins[server]
        if isinstance(msg, wire.Heartbeat) and reader < 0:
            return  # a probe of a session it still holds, or answers to heartbeats sent before
        if isinstance(msg, wire.ErrorMsg) and msg.kind is ErrorKind.UNKNOWN_CLIENT:
            return
        try:
            if reader < 0:
                data = join.on_control(msg)
                if data:
                    assert isinstance(msg, wire.Index)
                    self.connect(server, msg.session.encode(), data)
                    self._scheduler.note(server, f"INDEX received, {len(data)} reader "
                                                 "connection(s) not answered yet")
            else:
                join.on_data(reader, msg)
            if join.done and self.fingerprint and join.fingerprint != self.fingerprint:
                raise DatasetMismatchError(f"{self._endpoint(server)} serves dataset "
                                           f"{join.fingerprint}, not {self.fingerprint}")
        except (DatasetMismatchError, ProtocolError, RemoteError) as e:
            self._join_failed(server, now, e)
            return
        if join.done:
            self._joined(server, join, now)

    def _join_failed(self, server: int, now: float, error: DataflowError) -> None:
        """The join of ``server`` failed: it stays out for now (for good when it serves
        another dataset, until its connection comes up anew when it is stopping), and is
        asked again later; logged once per reason.

        Raises:
            error: before any server joined, unless the server is busy or stopping: it refused
                this loader's HELLO (a ``batch_size`` over its ``--max-request-samples``, a
                column it does not serve) or broke the protocol, so the constructor fails at
                once, naming it.
        """
        endpoint = self._endpoint(server)
        kind = error.kind if isinstance(error, RemoteError) else type(error).__name__
        if not self.fingerprint and kind not in TRANSIENT:
            raise error
        said = str(error).removeprefix(f"{endpoint}: ")
        if kind == ErrorKind.SERVER_BUSY:
            why = f"busy: {said}"
            text = (f"{endpoint}: busy ({said}); it joins when it admits this client, asked "
                    "again in the background")
        elif isinstance(error, DatasetMismatchError):
            why = f"another dataset: {said}"
            text = f"{endpoint}: stays out: {error}"
        else:
            why = f"refused: {said}"
            text = f"{endpoint}: join failed ({said}); asking again in the background"
        self.drop_data(server)
        self._scheduler.join_failed(server, now, why=why[:400],
                                    retry=kind not in ("DatasetMismatchError",
                                                       ErrorKind.SERVER_STOPPING))
        self._tell(server, kind, text, error=isinstance(error, DatasetMismatchError))

    def _tell(self, server: int, reason: str, text: str, *, error: bool = False) -> None:
        """Log ``text`` about a join of ``server`` that did not succeed, once per ``reason``
        in a row (a server busy for an hour says so once)."""
        self._late.add(server)
        if self._said.get(server) == reason:
            log.debug("%s", text)
            return
        self._said[server] = reason
        (log.error if error else log.warning)("%s", text)

    def _joined(self, server: int, join: Join, now: float) -> None:
        index, endpoint = join.index, self._endpoint(server)
        assert index is not None
        first = self._scheduler.grant(server, index.credits, now)
        self._joins.pop(server)
        self._sessions[server] = index.session
        self._transforms[server] = index.transform
        self._said.pop(server, None)
        if not self.fingerprint:  # the first server: the loader starts
            self.fingerprint = join.fingerprint
            others = [i for i in range(self._scheduler.count) if i != server]
            self._late.update(i for i in others
                              if self._scheduler.state(i) not in (State.UP, State.JOINING))
            log.info("%s: joined with %d credit(s); the loader starts%s", endpoint,
                     index.credits, "".join(f"; {self._endpoint(i)}: "
                                            f"{self._scheduler.describe(i)}" for i in others))
        elif not first:
            self.handoff.count("rejoined")
            log.warning("%s: joined again with %d credit(s)", endpoint, index.credits)
        elif server in self._late or server >= self._listed:
            self.handoff.count("joined")
            log.warning("%s: joined with %d credit(s), after the loader started", endpoint,
                        index.credits)
        else:
            log.info("%s: joined with %d credit(s)", endpoint, index.credits)
        self._late.discard(server)
        self._grow()
        self.handoff.admitted(endpoint, index)

    def _grow(self) -> None:
        """The scheduler's depth may have grown (a server joined): the reorder buffer and the
        hand-off hold that many from now on."""
        self._reorder.grow(self._scheduler.depth)
        self.handoff.set_capacity(self._scheduler.depth)
