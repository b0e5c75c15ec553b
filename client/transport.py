"""The client's background I/O thread: owns every ZeroMQ socket of one DataLoader.

Per server, one control DEALER (``linger=0``) to the server's endpoint and one data DEALER to
each of its reader processes (routing id: the session token from INDEX). The thread

* says HELLO to every server, collects their INDEX replies, connects the data DEALERs and
  waits until every reader answered a HEARTBEAT on them (so replies never find them missing);
* for the current epoch, requests batches in plan order, each from the least-loaded server
  that has credit, never more than the server's granted credits outstanding per server and
  never more than ``window`` batches requested but not yet taken by the consumer;
* receives replies from the readers' data sockets (REQUESTs go to the control socket), array
  frames with ``recv_into`` straight into the buffers of a sink
  (:mod:`client.buffers`) and hands batches to the consumer strictly in plan order through a
  bounded queue (a reorder buffer holds early arrivals);
* sends a HEARTBEAT to every server once a second, and raises :class:`ServerUnavailable` for a
  server that leaves requests unanswered for ``timeout`` seconds.

Errors travel to the consumer as values in the output queue.

Thread invariant: sockets, the sink and the epoch state are touched only by the I/O thread;
the consumer talks to it through :meth:`IOThread.command` and :attr:`IOThread.out` only.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import zmq

from dataflow import wire
from dataflow.client.buffers import HostSink, Landing, Ready
from dataflow.errors import DataflowError, ProtocolError, RemoteError, ServerUnavailable
from dataflow.plan import Range

log = logging.getLogger("dataflow.client")

HEARTBEAT_S = 1.0
POLL_MS = 250
BYE_LINGER_MS = 100
SESSION_LOST = "UnknownClient"


WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")


def reachable(data_endpoint: str, server_endpoint: str) -> str:
    """The address to connect to for a reader's advertised data endpoint.

    A server bound to a wildcard address (``tcp://0.0.0.0:5555``) advertises its readers'
    endpoints with that wildcard host; the client reaches them at the host it used for the
    server itself.
    """
    scheme, _, rest = data_endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or host not in WILDCARD_HOSTS:
        return data_endpoint
    server_host = server_endpoint.partition("://")[2].rpartition(":")[0]
    return f"tcp://{server_host}:{port}"


@dataclass(frozen=True)
class Item:
    """One entry of the output queue.

    Attributes:
        gen: the epoch generation it belongs to (stale generations are dropped).
        index: batch index within the epoch, or -1 for HELLO results and errors.
        ready: the batch (None for errors and HELLO results).
        error: an exception to raise in the consumer, or None.
        indexes: the INDEX replies (HELLO result only).
    """

    gen: int
    index: int = -1
    ready: Ready | None = None
    error: BaseException | None = None
    indexes: tuple[wire.Index, ...] = ()


@dataclass
class _Server:
    endpoint: str
    sock: zmq.Socket
    data: list[zmq.Socket] = field(default_factory=list)
    credits: int = 0
    outstanding: dict[int, int] = field(default_factory=dict)
    last_progress: float = 0.0
    last_heartbeat: float = 0.0


@dataclass
class _Epoch:
    gen: int
    batches: Sequence[Sequence[Range]]
    first: int
    next_request: int
    next_emit: int
    early: dict[int, Ready] = field(default_factory=dict)
    failed: bool = False


class IOThread(threading.Thread):
    """Background I/O of one DataLoader.

    Args:
        endpoints: server endpoints.
        credits: requests asked per server (the prefetch depth).
        timeout: seconds without progress after which a server is declared unavailable.
        sink: where batches are received (:class:`HostSink` or :class:`CudaSink`).
        name: client description sent in HELLO.
    """

    def __init__(self, endpoints: Sequence[str], credits: int, timeout: float,
                 sink: HostSink, name: str) -> None:
        super().__init__(name="dataflow-client-io", daemon=True)
        self._endpoints = list(endpoints)
        self._credits = credits
        self._timeout = timeout
        self._sink = sink
        self._client_name = name
        self.window = credits * len(self._endpoints)
        # At most `window` items of the current epoch, `window` stale ones of an abandoned
        # epoch, and a few HELLO results / errors.
        self.out: queue.Queue[Item] = queue.Queue(maxsize=2 * self.window + 8)
        self.taken = 0
        self._commands: queue.Queue[tuple] = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._servers: list[_Server] = []
        self._epoch: _Epoch | None = None
        self._req_ids = 0
        self._stopping = False

    # -- consumer side --------------------------------------------------------------------------

    def command(self, *cmd: object) -> None:
        """Queue a command (``("epoch", gen, batches, first)`` or ``("stop",)``) and wake."""
        self._commands.put(cmd)
        self.wake()

    def wake(self) -> None:
        """Wake the I/O thread (thread-safe, never blocks)."""
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def stop(self, join_timeout: float = 5.0) -> None:
        """Stop the thread (it says BYE to the servers and closes its sockets); idempotent."""
        if self._wake_w < 0:
            return
        if self.is_alive():
            self.command("stop")
            self.join(join_timeout)
        if not self.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    # -- thread ---------------------------------------------------------------------------------

    def run(self) -> None:
        ctx = zmq.Context.instance()
        poller = zmq.Poller()
        try:
            for ep in self._endpoints:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(ep)
                self._servers.append(_Server(ep, sock))
                poller.register(sock, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            self._hello(poller)
            while not self._stopping:
                self._request()
                events = dict(poller.poll(POLL_MS))
                if self._wake_r in events:
                    os.read(self._wake_r, 4096)
                    self._drain_commands()
                for s in self._servers:
                    for sock in (s.sock, *s.data):
                        if events.get(sock):
                            self._receive_all(s, sock)
                self._heartbeat()
        except Exception as e:
            self._fail(e)
        finally:
            self._close()

    def _fail(self, e: BaseException) -> None:
        if not isinstance(e, DataflowError):
            err = DataflowError(f"client I/O thread failed: {type(e).__name__}: {e}")
            err.__cause__ = e
            e = err
        gen = self._epoch.gen if self._epoch is not None else 0
        if self._epoch is not None:
            self._epoch.failed = True
        self._put(Item(gen, error=e))

    def _put(self, item: Item) -> None:
        try:
            self.out.put_nowait(item)
        except queue.Full:
            log.error("output queue full; dropping %s", item)

    def _close(self) -> None:
        for s in self._servers:
            try:
                s.sock.send_multipart(wire.encode(wire.Bye()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            s.sock.close(linger=BYE_LINGER_MS)
            for sock in s.data:
                sock.close(linger=0)
        self._sink.close()

    def _hello(self, poller: zmq.Poller) -> None:
        hello = wire.encode(wire.Hello(self._credits, self._client_name))
        for s in self._servers:
            s.sock.send_multipart(hello)
        deadline = time.monotonic() + self._timeout
        indexes: dict[str, wire.Index] = {}
        while len(indexes) < len(self._servers):
            events = self._poll_until(poller, deadline, lambda: ServerUnavailable(
                ", ".join(s.endpoint for s in self._servers if s.endpoint not in indexes),
                f"no answer to HELLO within {self._timeout} s"))
            if events is None:
                return
            for s in self._servers:
                if events.get(s.sock):
                    msg = wire.decode(s.sock.recv_multipart())
                    if isinstance(msg, wire.ErrorMsg):
                        raise RemoteError(s.endpoint, msg.kind, msg.message)
                    if not isinstance(msg, wire.Index):
                        raise ProtocolError(f"{s.endpoint}: expected INDEX, got "
                                            f"{wire.kind_of(msg).name}")
                    s.credits = msg.credits
                    indexes[s.endpoint] = msg
                    self._attach(s, msg, poller)
        self._await_attached(poller, deadline)
        now = time.monotonic()
        for s in self._servers:
            s.last_heartbeat = now
        self._put(Item(0, indexes=tuple(indexes[s.endpoint] for s in self._servers)))

    def _attach(self, s: _Server, index: wire.Index, poller: zmq.Poller) -> None:
        """Connect a data DEALER to each reader of ``s`` and say HEARTBEAT on it."""
        if not index.data or not index.session:
            raise ProtocolError(f"{s.endpoint}: INDEX names no reader data endpoints")
        ctx = zmq.Context.instance()
        for advertised in index.data:
            endpoint = reachable(advertised, s.endpoint)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, index.session.encode())
            sock.connect(endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))
            s.data.append(sock)
            poller.register(sock, zmq.POLLIN)

    def _await_attached(self, poller: zmq.Poller, deadline: float) -> None:
        """Wait for every reader's HEARTBEAT answer on its data connection."""
        waiting = {sock: s for s in self._servers for sock in s.data}
        while waiting:
            events = self._poll_until(poller, deadline, lambda: ServerUnavailable(
                ", ".join(sorted({s.endpoint for s in waiting.values()})),
                f"{len(waiting)} reader data connection(s) not answered within "
                f"{self._timeout} s"))
            if events is None:
                return
            for sock in [k for k in waiting if events.get(k)]:
                s = waiting.pop(sock)
                msg = wire.decode(sock.recv_multipart())
                if isinstance(msg, wire.ErrorMsg):
                    raise RemoteError(s.endpoint, msg.kind, msg.message)
                if not isinstance(msg, wire.Heartbeat):
                    raise ProtocolError(f"{s.endpoint}: expected HEARTBEAT on a data "
                                        f"connection, got {wire.kind_of(msg).name}")

    def _poll_until(self, poller: zmq.Poller, deadline: float,
                    late: Callable[[], ServerUnavailable]) -> dict | None:
        """One poll bounded by ``deadline``: the events, or None once asked to stop.

        Raises:
            ServerUnavailable: ``late()``, when ``deadline`` has passed.
        """
        left = deadline - time.monotonic()
        if left <= 0:
            raise late()
        events = dict(poller.poll(int(min(left * 1000, POLL_MS)) + 1))
        if self._wake_r in events:
            os.read(self._wake_r, 4096)
            self._drain_commands()
            if self._stopping:
                return None
        return events

    def _drain_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "stop":
                self._stopping = True
            elif cmd[0] == "epoch":
                _, gen, batches, first = cmd
                self._epoch = _Epoch(gen, batches, first, first, first)

    def _request(self) -> None:
        ep = self._epoch
        if ep is None or ep.failed:
            return
        now = time.monotonic()
        while ep.next_request < ep.first + len(ep.batches):
            if ep.next_request - ep.first - self.taken >= self.window:
                return
            free = [s for s in self._servers if len(s.outstanding) < s.credits]
            if not free:
                return
            s = min(free, key=lambda x: len(x.outstanding))
            ranges = ep.batches[ep.next_request - ep.first]
            self._req_ids += 1
            s.sock.send_multipart(wire.encode(wire.Request(self._req_ids, tuple(ranges))),
                                  flags=zmq.NOBLOCK)
            if not s.outstanding:
                s.last_progress = now
            s.outstanding[self._req_ids] = (ep.gen << 32) | ep.next_request
            ep.next_request += 1

    def _heartbeat(self) -> None:
        now = time.monotonic()
        for s in self._servers:
            if now - s.last_heartbeat >= HEARTBEAT_S:
                s.last_heartbeat = now
                try:
                    s.sock.send_multipart(wire.encode(wire.Heartbeat()), flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
            if s.outstanding and now - s.last_progress > self._timeout:
                raise ServerUnavailable(s.endpoint, f"no reply to {len(s.outstanding)} "
                                        f"request(s) for {self._timeout} s")

    # -- receiving ------------------------------------------------------------------------------

    def _receive_all(self, s: _Server, sock: zmq.Socket) -> None:
        for _ in range(64):
            try:
                header = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._receive(s, sock, header)

    @staticmethod
    def _drain_frames(sock: zmq.Socket) -> int:
        n = 0
        while sock.getsockopt(zmq.RCVMORE):
            sock.recv(copy=False)
            n += 1
        return n

    def _receive(self, s: _Server, sock: zmq.Socket, header: bytes) -> None:
        try:
            msg = wire.decode_header(header)
        except ProtocolError as e:
            self._drain_frames(sock)
            raise ProtocolError(f"{s.endpoint}: {e}") from e
        if isinstance(msg, wire.Heartbeat):
            self._drain_frames(sock)
            return
        if isinstance(msg, wire.ErrorMsg):
            self._drain_frames(sock)
            self._on_error(s, msg)
            return
        if not isinstance(msg, wire.BatchMsg):
            extra = self._drain_frames(sock)
            raise ProtocolError(f"{s.endpoint}: unexpected {wire.kind_of(msg).name} message "
                                f"({extra} buffer frame(s))")
        key = s.outstanding.pop(msg.req_id, None)
        if key is None:
            self._drain_frames(sock)
            raise ProtocolError(f"{s.endpoint}: BATCH for unknown request {msg.req_id}")
        s.last_progress = time.monotonic()
        ep = self._epoch
        if ep is None or key >> 32 != ep.gen or ep.failed:
            self._drain_frames(sock)
            return
        ready = self._land(s, sock, msg)
        index = key & 0xFFFFFFFF
        ep.early[index] = ready
        while ep.next_emit in ep.early:
            self._put(Item(ep.gen, ep.next_emit, ready=ep.early.pop(ep.next_emit)))
            ep.next_emit += 1

    def _land(self, s: _Server, sock: zmq.Socket, msg: wire.BatchMsg) -> Ready:
        """Receive the array frames of ``msg`` into a sink buffer and finish the batch."""
        landing: Landing = self._sink.land(msg)
        for spec, off in zip(msg.arrays, landing.offsets, strict=True):
            pos = off
            for n in wire.chunk_sizes(spec.nbytes):
                if not sock.getsockopt(zmq.RCVMORE):
                    raise ProtocolError(f"{s.endpoint}: BATCH {msg.req_id} ended before array "
                                        f"{spec.name!r} was complete")
                got = sock.recv_into(landing.array[pos : pos + n])
                if got != n:
                    self._drain_frames(sock)
                    raise ProtocolError(f"{s.endpoint}: BATCH {msg.req_id} array {spec.name!r}: "
                                        f"frame of {got} bytes, expected {n}")
                pos += n
        extra = self._drain_frames(sock)
        if extra:
            raise ProtocolError(f"{s.endpoint}: BATCH {msg.req_id} has {extra} extra frame(s)")
        where = {a.name: (a, off) for a, off in zip(msg.arrays, landing.offsets, strict=True)}
        for name, _ in msg.ragged:
            values = where[name][0]
            offs, start = where[name + wire.OFFSETS_SUFFIX]
            offsets = landing.array[start : start + offs.nbytes].view(np.int64)
            try:
                wire.check_offsets(name, offsets, values.shape[0])
            except ProtocolError as e:
                raise ProtocolError(f"{s.endpoint}: {e}") from e
        return self._sink.finish(landing, msg)

    def _on_error(self, s: _Server, msg: wire.ErrorMsg) -> None:
        if msg.kind == SESSION_LOST:
            raise ServerUnavailable(
                s.endpoint, f"the server has no session for this client any more ({msg.message});"
                f" {len(s.outstanding)} outstanding request(s) were lost. Open a new DataLoader "
                "and load_state_dict() the last state_dict() to resume")
        key = s.outstanding.pop(msg.req_id, None) if msg.req_id >= 0 else None
        s.last_progress = time.monotonic()
        ep = self._epoch
        if msg.req_id >= 0 and (key is None or ep is None or key >> 32 != ep.gen):
            if key is None:
                raise ProtocolError(f"{s.endpoint}: ERROR for unknown request {msg.req_id}: "
                                    f"{msg.kind}: {msg.message}")
            return
        raise RemoteError(s.endpoint, msg.kind, msg.message)
