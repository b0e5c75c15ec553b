"""The loader server's frontend: routes client requests to workers and accounts for credits.

The frontend never reads data and never carries batches: readers send replies straight to
clients over their own data sockets (see :mod:`server.worker`). It owns two ROUTER sockets:

* ``router`` (client-facing, bound to ``--bind``), with ``ROUTER_MANDATORY`` so a full or gone
  peer is reported (``EAGAIN`` / ``EHOSTUNREACH``) instead of silently dropped; it carries
  HELLO/INDEX, REQUEST, HEARTBEAT, STATS and the frontend's own ERRORs;
* ``backend`` (bound to a private ``ipc://`` path), to which the worker processes connect.

Flow control is credit based: a client may keep at most ``credits`` requests outstanding
(queued, at a worker, or not yet handed to ZeroMQ by the worker, which says SENT just before
it does); more are refused with an ERROR. Every client's replies queued in a worker's data
socket are therefore bounded by its credits (the data sockets' high-water mark is above the
largest grant, so a reader never meets a full queue). A frontend ERROR refused by a client's
full queue waits in that client's ``pending`` list and is retried; the loop never blocks on one
client. Memory is bounded by ``workers x worker_queue x batch`` plus
``clients x credits x batch``.

Thread invariant: every method runs on the one thread that calls :meth:`serve`.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import zmq

from dataflow import wire
from dataflow.errors import ProtocolError
from dataflow.index import DatasetIndex
from dataflow.server.config import ServerConfig
from dataflow.server.framing import recv_bounded
from dataflow.server.pool import Task, WorkerPool
from dataflow.server.sessions import Session, Sessions
from dataflow.server.worker import READY, SENT

log = logging.getLogger("dataflow.server")

MAX_CLIENT_FRAMES = 3
MAX_INBOUND_FRAME = 32 * 1024 * 1024
MAX_BATCH_SAMPLES = 1 << 22
DRAIN = 256
HOUSEKEEPING_S = 0.25
ZMTP_HEARTBEAT_MS = 1000
CREDIT_SLACK = 2
MIN_ZMTP_TIMEOUT_S = 10.0

COUNTERS = ("malformed", "refused", "dropped_sends", "requests", "replies", "bytes_sent",
            "clients_expired", "clients_probed")


class Frontend:
    """Request routing, flow control and client bookkeeping of one loader server.

    Args:
        config: the server's settings.
        index: the dataset served.
        pool: the started worker pool.
        ctx: the process's ZeroMQ context.
        backend: ipc:// endpoint the workers connect to.
    """

    def __init__(self, config: ServerConfig, index: DatasetIndex, pool: WorkerPool,
                 ctx: zmq.Context, backend: str) -> None:
        self._config = config
        self._index = index
        self._index_json = index.to_json()
        self._sizes = np.asarray(index.sizes, dtype=np.int64)
        self._pool = pool
        self._sessions = Sessions()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.backend = ctx.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.LINGER, 0)
        self.backend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.backend.bind(backend)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 2 * config.max_credits + 16)
        self.router.setsockopt(zmq.RCVHWM, 4096)
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_INBOUND_FRAME)
        self.router.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
        # A killed client's connection closes at once; this timeout only catches a vanished
        # host, so it never drops a live client whose machine is briefly overloaded.
        self.router.setsockopt(zmq.HEARTBEAT_TIMEOUT,
                               int(max(config.client_ttl, MIN_ZMTP_TIMEOUT_S) * 1000))
        self.router.bind(config.zmq_bind)
        self.endpoint: str = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()

    # -- lifecycle ------------------------------------------------------------------------------

    def wait_ready(self, timeout: float, stop: Callable[[], bool]) -> None:
        """Wait until every worker reported READY.

        Raises:
            RuntimeError: a worker died first or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while not self._pool.all_ready and not stop():
            if self.backend.poll(100):
                frames = self.backend.recv_multipart()
                if len(frames) == 3 and frames[1] == READY:
                    self._pool.mark_ready(frames[0], frames[2].decode())
            dead = self._pool.reap(respawn=False)
            if dead:
                w, code = dead[0]
                raise RuntimeError(f"worker pid {w.process.pid} exited with code {code} "
                                   "during startup (see its log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout:.0f} s")

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        self.router.close(linger=0)
        self.backend.close(linger=0)

    def serve(self, stop: Callable[[], bool]) -> None:
        """Route messages until ``stop()`` is true (checked at least every 200 ms)."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        next_housekeeping = time.monotonic()
        while not stop():
            pending = self._sessions.pending_sends()
            events = dict(poller.poll(20 if pending else 200))
            if self.backend in events:
                self._drain(self.backend, self._on_worker)
            if self.router in events:
                self._drain(self.router, self._on_client)
            if pending:
                self._retry_pending()
            self._dispatch()
            now = time.monotonic()
            if now >= next_housekeeping:
                self._expire(now)
                self._reap()
                next_housekeeping = now + HOUSEKEEPING_S

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Callable[[zmq.Socket], None]) -> None:
        for _ in range(DRAIN):
            try:
                handle(sock)
            except zmq.Again:
                return

    # -- sending --------------------------------------------------------------------------------

    def _send(self, identity: bytes, frames: Sequence) -> str:
        """Send to a client without blocking: ``"ok"``, ``"full"`` or ``"gone"``."""
        try:
            self.router.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
            return "ok"
        except zmq.Again:
            return "full"
        except zmq.ZMQError as e:
            if e.errno == errno.EHOSTUNREACH:
                return "gone"
            raise

    def _reply(self, identity: bytes, msg: wire.Message) -> None:
        """Send a small control message; dropped (and counted) if the client cannot take it."""
        if self._send(identity, wire.encode(msg)) != "ok":
            self.counters["dropped_sends"] += 1

    def _error(self, identity: bytes, req_id: int, kind: str, message: str) -> None:
        self._reply(identity, wire.ErrorMsg(req_id, kind, message))

    def _deliver(self, s: Session, req_id: int, frames: list, nbytes: int, *,
                 credit: bool = True) -> None:
        """Hand a reply to ``s`` or park it in ``s.pending`` when its queue is full.

        ``credit``: the reply returns the request's credit (False when it already came back).
        """
        if s.pending:
            s.pending.append((req_id, frames, nbytes, credit))
            s.pending_bytes += nbytes
            return
        result = self._send(s.identity, frames)
        if result == "ok":
            if credit:
                self._delivered(s, req_id, nbytes)
        elif result == "full":
            s.pending.append((req_id, frames, nbytes, credit))
            s.pending_bytes += nbytes
        else:
            self._drop_session(s, "gone")

    def _delivered(self, s: Session, req_id: int, nbytes: int) -> None:
        s.outstanding -= 1
        s.active.discard(req_id)
        self.counters["replies"] += 1
        self.counters["bytes_sent"] += nbytes

    def _retry_pending(self) -> None:
        for s in self._sessions:
            while s.pending:
                req_id, frames, nbytes, credit = s.pending[0]
                result = self._send(s.identity, frames)
                if result == "full":
                    break
                if result == "gone":
                    self._drop_session(s, "gone")
                    break
                s.pending.popleft()
                s.pending_bytes -= nbytes
                if credit:
                    self._delivered(s, req_id, nbytes)

    def _drop_session(self, s: Session, why: str) -> None:
        self._sessions.close(s.identity)
        lost = len(s.pending)
        self.counters["dropped_sends"] += lost
        log.info("client %s (%s): session freed (%s); %d queued request(s) and %d reply(ies) "
                 "dropped", s.identity.hex(), s.name, why, len(s.queued), lost)

    # -- workers --------------------------------------------------------------------------------

    def _on_worker(self, sock: zmq.Socket) -> None:
        frames = sock.recv_multipart(zmq.NOBLOCK)
        identity = frames[0]
        if len(frames) == 3 and frames[1] == READY:
            self._pool.mark_ready(identity, frames[2].decode())
            return
        client, req, status, info = frames[1:]
        req_id = int.from_bytes(req, "little")
        worker = self._pool.get(identity)
        if worker is not None:
            worker.tasks.pop((client, req_id), None)
        s = self._sessions.get(client)
        if status == SENT:
            if s is None:
                self.counters["dropped_sends"] += 1
            else:
                self._delivered(s, req_id, int.from_bytes(info, "little"))
            return
        self.counters["dropped_sends"] += 1
        if s is not None:
            frames = wire.encode(wire.ErrorMsg(req_id, "Undeliverable", info.decode()))
            self._deliver(s, req_id, frames, 0, credit=False)

    def _dispatch(self) -> None:
        while True:
            worker = self._pool.least_loaded()
            if worker is None:
                return
            nxt = self._sessions.next_request()
            if nxt is None:
                return
            s, req_id, ranges = nxt
            task = Task(s.identity, req_id, ranges)
            try:
                self.backend.send_multipart(
                    [worker.identity, s.identity, s.token, req_id.to_bytes(8, "little"),
                     ranges], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                worker.ready = False
                self._fail(task, "WorkerUnavailable",
                           f"worker {worker.identity.decode()} cannot take tasks")
                continue
            worker.tasks[(s.identity, req_id)] = task

    def _fail(self, task: Task, kind: str, message: str) -> None:
        s = self._sessions.get(task.client)
        if s is None:
            return
        frames = wire.encode(wire.ErrorMsg(task.req_id, kind, message))
        self._deliver(s, task.req_id, frames, sum(len(f) for f in frames))

    def _reap(self) -> None:
        for worker, code in self._pool.reap(respawn=True):
            for task in worker.tasks.values():
                ranges = np.frombuffer(task.ranges, dtype=np.int64).reshape(-1, 3).tolist()
                self._fail(task, "WorkerDied",
                           f"worker process {worker.process.pid} exited with code {code} while "
                           f"reading ranges {ranges[:8]} of "
                           f"{[self._index.shards[r[0]] for r in ranges[:8]]}")

    # -- clients --------------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        """Free the sessions of clients that are silent *and* whose connection is gone.

        Silence alone is not proof of death: a client's Python threads can be held up for
        seconds by things it does not control (a foreign finalizer run by the garbage
        collector on its I/O thread, a debugger, a long GIL-holding call) while its
        connection, kept by ZeroMQ's own threads and ZMTP heartbeats, is healthy. A silent
        client is probed with a HEARTBEAT (``ROUTER_MANDATORY``): ``EHOSTUNREACH`` means its
        connection is closed, so its state is freed; a probe that is queued (or refused by a
        full queue) means it is alive, so its silence clock restarts.
        """
        for s in self._sessions:
            if now - s.last_seen <= self._config.client_ttl:
                continue
            if self._send(s.identity, wire.encode(wire.Heartbeat())) == "gone":
                self.counters["clients_expired"] += 1
                self._drop_session(s, f"silent for more than {self._config.client_ttl} s and "
                                      "disconnected")
            else:
                self.counters["clients_probed"] += 1
                s.last_seen = now

    def _on_client(self, sock: zmq.Socket) -> None:
        frames, extra = recv_bounded(sock, 1 + MAX_CLIENT_FRAMES)
        identity = frames[0].bytes
        try:
            if extra:
                raise ProtocolError(f"message has more than {MAX_CLIENT_FRAMES} frames")
            msg = wire.decode(frames[1:])
        except ProtocolError as e:
            self.counters["malformed"] += 1
            log.warning("malformed message from %s: %s", identity.hex(), e)
            self._error(identity, -1, "ProtocolError", str(e))
            return
        s = self._sessions.get(identity)
        if s is not None:
            s.last_seen = time.monotonic()
        if isinstance(msg, wire.Hello):
            self._on_hello(identity, msg)
        elif isinstance(msg, wire.Request):
            self._on_request(identity, s, msg, frames[2].bytes)
        elif isinstance(msg, wire.Heartbeat):
            if s is None:
                self._error(identity, -1, "UnknownClient",
                            "no session for this client (its connection was closed after "
                            f"{self._config.client_ttl} s of silence, or the server restarted)")
            else:
                self._reply(identity, wire.Heartbeat())
        elif isinstance(msg, wire.Bye):
            if s is not None:
                self._drop_session(s, "BYE")
        elif isinstance(msg, wire.Stats):
            self._reply(identity, wire.StatsReply(self.stats()))
        else:
            self.counters["malformed"] += 1
            self._error(identity, -1, "ProtocolError",
                        f"a server does not accept {wire.kind_of(msg).name} messages")

    def _on_hello(self, identity: bytes, msg: wire.Hello) -> None:
        credits = min(msg.credits, self._config.max_credits)
        self._sessions.open(identity, credits, msg.client, time.monotonic())
        log.info("client %s (%s) connected with %d credit(s)", identity.hex(), msg.client,
                 credits)
        s = self._sessions.get(identity)
        self._reply(identity, wire.Index(credits, len(self._pool), self._index_json,
                                         s.token.decode(), tuple(self._pool.endpoints)))

    def _on_request(self, identity: bytes, s: Session | None, msg: wire.Request,
                    ranges: bytes) -> None:
        if s is None:
            self.counters["refused"] += 1
            self._error(identity, msg.req_id, "UnknownClient",
                        "REQUEST before HELLO (or the session was freed): send HELLO first")
            return
        problem = self._check_ranges(np.frombuffer(ranges, dtype=np.int64).reshape(-1, 3))
        if problem is None and s.outstanding >= s.credits:
            # A reader notifies us just before it hands a reply to ZeroMQ, so the notice is
            # normally here before the client can react to the reply: read waiting notices.
            self._drain(self.backend, self._on_worker)
        if problem is None and s.outstanding >= CREDIT_SLACK * s.credits:
            # Notices and replies travel on different connections, so a client that keeps to
            # its credits can still look over them for a moment; only well beyond is refused.
            problem = (f"credit exceeded: {s.outstanding} request(s) outstanding and "
                       f"{s.credits} credit(s) granted")
        if problem is None and msg.req_id in s.active:
            problem = f"request id {msg.req_id} is already outstanding"
        if problem is not None:
            self.counters["refused"] += 1
            self._error(identity, msg.req_id, "ProtocolError", problem)
            return
        self.counters["requests"] += 1
        s.active.add(msg.req_id)
        self._sessions.enqueue(s, msg.req_id, ranges)

    def _check_ranges(self, ranges: np.ndarray) -> str | None:
        """Why ``ranges`` (int64, (n, 3)) is not a valid request, or None."""
        shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
        bad_shard = (shard < 0) | (shard >= len(self._sizes))
        if bad_shard.any():
            i = int(np.flatnonzero(bad_shard)[0])
            return f"range {i}: shard {int(shard[i])} not in [0, {len(self._sizes)})"
        size = self._sizes[shard]
        bad = (start < 0) | (stop <= start) | (stop > size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (f"range {i}: [{int(start[i])}, {int(stop[i])}) is empty or outside shard "
                    f"{self._index.shards[int(shard[i])]} of {int(size[i])} samples")
        total = int((stop - start).sum())
        if total > MAX_BATCH_SAMPLES:
            return f"request of {total} samples exceeds {MAX_BATCH_SAMPLES}"
        return None

    def stats(self) -> dict[str, int | list[int]]:
        """Counters for the STATS reply."""
        return {
            **self.counters,
            "clients": len(self._sessions),
            "queued": self._sessions.queued(),
            "in_flight": sum(len(w.tasks) for w in self._pool),
            "pending_sends": self._sessions.pending_sends(),
            "bytes_buffered": self._sessions.pending_bytes(),
            "workers": len(self._pool),
            "worker_restarts": self._pool.restarts,
            "worker_pids": self._pool.pids,
        }
