"""The loader server's frontend: routes client requests to readers and accounts for credits.

The frontend never reads data and never carries batches: readers send replies straight to
clients over their own data sockets (see :mod:`dataflow.server.worker`). It owns two ROUTER
sockets:

* ``router`` (client-facing, bound to ``--bind``), with ``ROUTER_MANDATORY`` so a full or gone
  peer is reported instead of silently dropped, and ``ROUTER_HANDOVER`` so a client that
  reconnects with the same routing id takes its session over; it carries HELLO/INDEX,
  REQUEST, HEARTBEAT, STATS and the frontend's own ERRORs. It is bound first, before any
  reader starts, so a taken port fails the start at once. It sends no ZMTP heartbeats and
  has no receive high-water mark (:func:`~dataflow.server.guard.client_socket_options`:
  either lets a peer abort libzmq 4.3.5); an :class:`~dataflow.server.guard.InboundGuard`
  bounds what each of its connections, and all of them, can make libzmq hold, and how many
  there are;
* ``backend`` (bound to a private abstract-namespace ``ipc://@...`` name: no file to leave
  behind), to which the reader processes connect.

Its parts: :class:`~dataflow.server.clients.ClientHandler` (client messages, expiry),
:class:`~dataflow.server.backend.WorkerHandler` (tasks, reader notices, reader deaths),
:class:`~dataflow.server.ledger.Ledger` (credits: the one owner), and
:class:`~dataflow.server.delivery.Delivery` (sends to clients, parked replies). :meth:`serve`
is the poll loop driving them.

Flow control is credit based: a client may keep up to ``2 x credits`` requests outstanding
(queued, at a reader, or not yet handed to ZeroMQ by the reader, which says SENT just before it
does; see :mod:`~dataflow.server.ledger` for why 2x), and one peer address at most
``--max-sessions-per-address`` times that; more are refused with an ERROR. The readers' data
sockets have a high-water mark above the largest such count, so a reader never meets a full
queue. What the readers hold unsent is bounded in bytes (:mod:`~dataflow.server.unsent`):
requests wait while it is at ``--max-unsent-bytes`` or their address's share. The "Memory"
paragraph of docs/architecture.md gives the bound of the server's memory as a formula of its
flags.

Thread invariant: every method runs on the one thread that calls :meth:`serve`.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Sequence

import zmq

from dataflow.errors import ServerStartError
from dataflow.index import DatasetIndex
from dataflow.security import secure_server
from dataflow.server.auth import start_gatekeeper, stop_gatekeeper
from dataflow.server.backend import WorkerHandler
from dataflow.server.clients import ClientHandler
from dataflow.server.config import ServerConfig
from dataflow.server.delivery import Delivery
from dataflow.server.guard import GUARD_MS, InboundGuard, client_socket_options
from dataflow.server.ledger import CREDIT_SLACK, Ledger
from dataflow.server.metrics import SessionUse, Snapshot
from dataflow.server.peerlog import RateLimitedLog
from dataflow.server.pool import WorkerPool
from dataflow.server.sessions import Sessions
from dataflow.server.unsent import Unsent
from dataflow.wire import MAX_COUNTER_LIST

log = logging.getLogger("dataflow.server")

DRAIN = 256
HOUSEKEEPING_S = 0.25
STOPPING_LINGER_MS = 1000

COUNTERS = ("malformed", "refused", "dropped_sends", "stale_notices", "requests", "replies",
            "bytes_sent", "clients_expired", "clients_probed", "sessions_refused",
            "address_sessions_refused", "sessions_idle_expired", "sessions_unattached_expired",
            "sessions_unused_expired", "connections_cut", "tasks_requeued", "replies_too_large",
            "skipped_samples", "samples_sent", "shm_sessions", "cache_hits", "cache_misses",
            "cache_evictions", "cache_disk_hits", "cache_disk_evictions", "cache_announced")


def _bind(sock: zmq.Socket, endpoint: str, what: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        hint = " (another process listens there)" if e.errno == errno.EADDRINUSE else ""
        raise ServerStartError(f"cannot bind the {what} socket to {endpoint}: {e}{hint}") from e


class Frontend:
    """Request routing, flow control and client bookkeeping of one loader server.

    Args:
        config: the server's settings.
        index: the dataset served.
        pool: the started worker pool.
        ctx: the process's ZeroMQ context.
        backend: ipc:// endpoint the workers connect to.
        publish: called with a fresh :meth:`snapshot` at every housekeeping tick (metrics).

    Raises:
        ServerStartError: an endpoint cannot be bound (e.g. the port is taken).
    """

    def __init__(self, config: ServerConfig, index: DatasetIndex, pool: WorkerPool,
                 ctx: zmq.Context, backend: str,
                 publish: Callable[[Snapshot], None] | None = None) -> None:
        self._pool = pool
        self._index = index
        self._publish = publish
        self._sessions = Sessions()
        self._ledger = Ledger(address_cap=config.address_sessions * CREDIT_SLACK
                              * config.max_credits)
        self._unsent = Unsent(config.max_unsent_bytes, config.address_unsent_bytes)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._peer_log = RateLimitedLog(log)
        self.router = ctx.socket(zmq.ROUTER)
        self.backend = ctx.socket(zmq.ROUTER)
        for sock in (self.router, self.backend):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        secure_server(self.router, config.curve)
        self._gate = start_gatekeeper(ctx, config.curve)
        self.router.setsockopt(zmq.SNDHWM, config.peer_queue)
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_inbound_bytes)
        client_socket_options(self.router, config.tcp_timeout_s)
        self._guard = InboundGuard(self.router, config.max_inbound_bytes,
                                   config.max_connections, tcp=config.bind.startswith("tcp://"),
                                   counters=self.counters, peer_log=self._peer_log,
                                   total_limit=config.max_inbound_total,
                                   per_address=config.address_connections)
        try:
            _bind(self.router, config.zmq_bind, "client-facing")
            _bind(self.backend, backend, "reader backend")
        except ServerStartError:
            self.close()
            raise
        self.endpoint: str = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._delivery = Delivery(self.router, self._sessions, self._ledger, self.counters)
        self._workers = WorkerHandler(self.backend, pool, self._ledger, self._delivery,
                                      self.counters, index, self._sessions, self._unsent)
        if config.cache_plan_window:
            self._delivery.on_drop = self._workers.forget
        self._clients = ClientHandler(config, index, self._sessions, self._ledger,
                                      self._delivery, self.counters, guard=self._guard,
                                      peer_log=self._peer_log, server_info=self._server_info,
                                      stats=self.stats, read_notices=self._workers.read_notices)

    def _server_info(self) -> tuple[int, Sequence[str]]:
        return len(self._pool), [e for e in self._pool.endpoints if e is not None]

    def wait_ready(self, timeout: float, stop: Callable[[], bool]) -> None:
        """Wait until every worker reported STARTED.

        Raises:
            ServerStartError: a worker died first or ``timeout`` seconds passed.
        """
        self._workers.wait_ready(timeout, stop)

    def close(self, linger_ms: int = 0) -> None:
        """Close both sockets (idempotent); the client-facing one sends what it holds for up
        to ``linger_ms`` ms."""
        self._guard.close()
        self.router.close(linger=linger_ms)
        self.backend.close(linger=0)
        stop_gatekeeper(self._gate)

    def stopping(self) -> None:
        """Tell every session the server is stopping; :meth:`close` with a linger sends it."""
        self._clients.notify_stopping()
        log.info("told %d session(s) the server is stopping", len(self._sessions))

    def serve(self, stop: Callable[[], bool]) -> None:
        """Route messages until ``stop()`` is true (checked at least every 200 ms)."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        poller.register(self._guard.monitor, zmq.POLLIN)
        next_housekeeping = time.monotonic()
        while not stop():
            parked = self._sessions.parked()
            events = dict(poller.poll(GUARD_MS if parked or len(self._guard) else 200))
            if self.backend in events:
                self._workers.read_notices()
            if self.router in events:
                self._read_clients()
            if parked:
                self._delivery.retry()
            self._workers.dispatch()
            now = time.monotonic()
            self._guard.check(now)
            if now >= next_housekeeping:
                self._clients.expire(now)
                self._clients.answer_waiting()
                self._workers.reap()
                self._workers.dispatch()
                self._peer_log.tick()
                if self._publish is not None:
                    self._publish(self.snapshot())
                next_housekeeping = now + HOUSEKEEPING_S

    def _read_clients(self) -> None:
        for _ in range(DRAIN):
            try:
                self._clients.on_message(self.router, time.monotonic())
            except zmq.Again:
                return

    def stats(self) -> dict[str, int | list[int]]:
        """Counters for the STATS reply (no process ids, paths or peer names).

        ``skipped_per_shard`` is a flat ``[shard, samples, shard, samples, ...]`` list of the
        shards with skipped samples (at most 2,048 shards, the most skipped first).
        """
        per_shard = sorted(self._workers.skipped_per_shard.items(), key=lambda p: -p[1])
        return {
            **self.counters,
            "clients": len(self._sessions),
            "connections": len(self._guard),
            "draining_sessions": self._ledger.draining(),
            "queued": self._ledger.queued(),
            "in_flight": sum(len(w.tasks) for w in self._pool),
            "pending_sends": self._sessions.parked(),
            "bytes_buffered": self._sessions.parked_bytes(),
            "unsent_bytes": self._unsent.total,
            "cache_bytes": sum(m for m, _ in self._workers.cache_bytes.values()),
            "cache_disk_bytes": sum(d for _, d in self._workers.cache_bytes.values()),
            "workers": len(self._pool),
            "worker_restarts": self._pool.restarts,
            "log_lines_suppressed": self._peer_log.suppressed,
            "auth_refused": self._gate.refused if self._gate is not None else 0,
            "skipped_per_shard": [x for pair in per_shard[: MAX_COUNTER_LIST // 2]
                                  for x in pair],
        }

    def snapshot(self) -> Snapshot:
        """What ``/metrics`` shows now (see :mod:`dataflow.server.metrics`)."""
        root = len(self._index.root)
        return Snapshot(
            stats={k: v for k, v in self.stats().items() if isinstance(v, int)},
            skipped=tuple((self._index.shards[shard][root:], n)
                          for shard, n in sorted(self._workers.skipped_per_shard.items())),
            sessions=tuple(SessionUse(s.name, s.credits, self._ledger.outstanding(s.token)
                                      if s.token in self._ledger else 0)
                           for s in self._sessions),
            latency=self._delivery.latency.histogram(), made=time.monotonic(),
            readers=self._pool.size, readers_ready=self._pool.ready_count)
