"""Every server's join, at the start and later, and what a failed one means.

Every server joins through the same path (:class:`~dataflow.client.handshake.Join`: HELLO,
INDEX, a HEARTBEAT answered on every reader connection): at the start, when it was busy, slow
or not up yet, when discovery found it, and again after it was lost. The first server to join
decides the dataset and starts the loader, unless another one answered with another dataset
already (the constructor then fails: ranks could start on different datasets); one serving
another dataset later stays out, logged. A
failed join is logged once per reason and tried again in the background (the scheduler's
backoff, :mod:`dataflow.client.servers`).

Thread invariant: used by the client's I/O thread only.
"""

from __future__ import annotations

import logging

import zmq

from dataflow import wire
from dataflow.client.buffers import Received
from dataflow.client.handoff import Handoff
from dataflow.client.handshake import Join
from dataflow.client.links import Links
from dataflow.client.scheduler import Scheduler, State
from dataflow.client.shmring import ShmRings
from dataflow.errors import DataflowError, DatasetMismatchError, ProtocolError, RemoteError
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.client")

# A HELLO refused so is asked again later, also before the loader started.
TRANSIENT = (ErrorKind.SERVER_BUSY, ErrorKind.SERVER_STOPPING)


class Joins:
    """The joins of one loader's servers, known by their numbers (their endpoints are the
    scheduler's).

    Args:
        shm: the HELLO of each join (offering a fresh shared-memory segment, or plain) and
            the segments of the sessions.
        control: each server's control socket.

    Attributes:
        fingerprint: the dataset's fingerprint (set by the first join; "" until then); every
            later join must serve the same.
    """

    def __init__(self, shm: ShmRings, scheduler: Scheduler,
                 handoff: Handoff[Received], links: Links,
                 control: dict[int, zmq.Socket]) -> None:
        self._shm = shm
        self._scheduler = scheduler
        self._handoff = handoff
        self._links = links
        self._control = control
        self._joins: dict[int, Join] = {}  # server -> its join under way
        self._sessions: dict[int, str] = {}  # server -> its session token, once joined
        self._transforms: dict[int, str] = {}  # server -> its --transform ("": none)
        self._listed = scheduler.count  # servers numbered from here on were found by discovery
        self._late: set[int] = set()  # servers that join after the loader started without them
        self._said: dict[int, str] = {}  # server -> the join failure last logged (logged once)
        self.fingerprint = ""

    def _endpoint(self, server: int) -> str:
        return self._scheduler.endpoint(server)

    def session(self, server: int) -> str | None:
        """The session token ``server`` gave at its last join."""
        return self._sessions.get(server)

    def transform(self, server: int) -> str:
        """``server``'s ``--transform`` as its INDEX named it ("none" when it has none)."""
        return self._transforms.get(server) or "none"

    def drop_data(self, server: int) -> None:
        """Close the data connections of a lost server (and forget its join attempt and its
        session's shared memory)."""
        self._links.drop_data(server)
        self._joins.pop(server, None)
        self._shm.drop(server)

    def hello(self, server: int, now: float) -> None:
        """Ask a server that has not joined (or was lost) to join (its connection is up)."""
        self.drop_data(server)
        self._joins[server] = Join(self._endpoint(server), self.fingerprint or None)
        try:
            self._control[server].send_multipart(self._shm.hello(server), flags=zmq.NOBLOCK)
        except zmq.Again:
            self._scheduler.join_failed(server, now, retry=True,
                                        why="HELLO could not be sent (queue full)")

    def expired(self, server: int) -> None:
        """``server``'s join ran out of time (it is asked again later): log it once."""
        self._joins.pop(server, None)
        self._tell(server, "timed out", f"{self._endpoint(server)}: join timed out ("
                   f"{self._scheduler.describe(server)}); asking again in the background")

    def on_message(self, server: int, reader: int, msg: wire.Message,
                   now: float) -> wire.Index | None:
        """A message from ``server``, which is joining (``reader`` -1: its control
        connection).

        Returns:
            Its INDEX when it joined now (the caller makes room for its credits, then admits
            it), else None.
        """
        join = self._joins[server]
        if isinstance(msg, wire.Heartbeat) and reader < 0:
            return None  # a probe of a session it still holds, or answers to heartbeats
        if isinstance(msg, wire.ErrorMsg) and msg.kind is ErrorKind.UNKNOWN_CLIENT:
            return None
        if reader < 0 and self._shm.refused_field(server, msg):
            self.hello(server, now)  # a server that predates shared memory: without it
            return None
        try:
            if reader < 0:
                data = join.on_control(msg)
                if data:
                    assert isinstance(msg, wire.Index)
                    self._connect(server, msg.session.encode(), data)
                    self._scheduler.note(server, join.unanswered())
            else:
                join.on_data(reader, msg)
                self._scheduler.note(server, join.unanswered())
            if join.done and self.fingerprint and join.fingerprint != self.fingerprint:
                raise DatasetMismatchError(f"{self._endpoint(server)} serves dataset "
                                           f"{join.fingerprint}, not {self.fingerprint}")
        except (DatasetMismatchError, ProtocolError, RemoteError) as e:
            self.failed(server, now, e)
            return None
        return self._joined(server, join, now) if join.done else None

    def _connect(self, server: int, token: bytes, data: list[str]) -> None:
        """One data connection per reader of ``server``, each opened with a HEARTBEAT."""
        for reader, endpoint in enumerate(data):
            sock = self._links.open(server, reader, token, endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))

    def failed(self, server: int, now: float, error: DataflowError) -> None:
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

    def _agree(self, server: int, join: Join) -> None:
        """``server`` is the first to join: no other server may have answered with another
        dataset already (the ranks of a job, each starting with its first server, could
        start on different ones: unequal epochs, samples lost and read twice).

        Raises:
            DatasetMismatchError: naming both servers and their datasets.
        """
        for other, theirs in self._joins.items():
            if other != server and theirs.fingerprint and theirs.fingerprint != join.fingerprint:
                raise DatasetMismatchError(
                    f"{self._endpoint(server)} serves dataset {join.fingerprint} and "
                    f"{self._endpoint(other)} dataset {theirs.fingerprint}: one loader's "
                    "servers must serve one dataset (each rank would start with whichever "
                    "answers first). The fingerprint covers the shards' names, sizes and "
                    "mtimes (or etags) and the served schema (--columns, --nulls...): copy "
                    "shards with their times (cp -p, rsync -t) and start servers alike")

    def _joined(self, server: int, join: Join, now: float) -> wire.Index:
        index, endpoint = join.index, self._endpoint(server)
        assert index is not None
        if not self.fingerprint:
            self._agree(server, join)
        shared = self._shm.joined(server, index, endpoint)
        first = self._scheduler.grant(server, index.credits, now, readers=len(index.data),
                                      group=index.group, ahead=index.ahead, shared=shared)
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
            self._handoff.count("rejoined")
            log.warning("%s: joined again with %d credit(s)", endpoint, index.credits)
        elif server in self._late or server >= self._listed:
            self._handoff.count("joined")
            log.warning("%s: joined with %d credit(s), after the loader started", endpoint,
                        index.credits)
        else:
            log.info("%s: joined with %d credit(s)", endpoint, index.credits)
        self._late.discard(server)
        return index
