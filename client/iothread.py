"""The client's background I/O thread: a thin poll loop over every ZeroMQ socket of a loader.

Per server, one control DEALER (HELLO, REQUEST, HEARTBEAT, BYE) to the server's endpoint, with
a routing id that is stable for the DataLoader's life (so a reconnect after a network cut finds
the server's session for this client again), and one data DEALER to each of its reader
processes (routing id: the session token from INDEX), on which BATCH and ERROR replies arrive
(:mod:`dataflow.client.links`: ZMTP heartbeats and socket monitors whose connect / disconnect
events feed the scheduler's liveness rules). The loop only moves bytes; the decisions are made
by pure parts it drives:

* :class:`~dataflow.client.inbox.Inbox`: what each reply and error means;
* :class:`~dataflow.client.joins.Joins`: every server's join (HELLO / INDEX / data
  connections), at the start and later; the loader starts when the first server joined;
* :class:`~dataflow.client.scheduler.Scheduler`: which batch to request from which server,
  credits, depth, heartbeats, joins, liveness, failover and late requests; it holds every
  server's endpoint;
* :class:`~dataflow.client.reorder.Reorder`: replies back into stream order;
* :class:`~dataflow.client.handoff.Handoff`: what the consumer wants read in, batches and
  failures out;
* :class:`~dataflow.client.membership.Membership` (servers named by a DNS name or a file):
  when to look the servers up again (on the :class:`~dataflow.client.discovery.Watcher`'s
  thread) and which join or leave.

Thread invariant: sockets, the sink, the scheduler and the reorder buffer are touched only by
this thread; the consumer reaches it only through the :class:`Handoff`.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Sequence

import zmq

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink, Received
from dataflow.client.discovery import Lookup, Watcher
from dataflow.client.handoff import Handoff
from dataflow.client.inbox import Inbox
from dataflow.client.joins import Joins
from dataflow.client.links import MONITOR_MS, Links, context
from dataflow.client.membership import Membership
from dataflow.client.scheduler import CONTROL, Scheduler, State
from dataflow.client.shmring import ShmRings, cuda_register
from dataflow.errors import InternalError
from dataflow.security import ClientCurve
from dataflow.shm import Geometry

log = logging.getLogger("dataflow.client")

HEARTBEAT_S = 1.0
SILENT_S = 3.0
BYE_LINGER_MS = 100


class IOThread(threading.Thread):
    """Background I/O of one DataLoader.

    Args:
        endpoints: server endpoints.
        hello: the HELLO said to every server (credits asked of each; this client's
            description; the columns its batches hold).
        prefetch: requests kept outstanding per server, or one per reader of a server with
            more readers (the scheduler's ``prefetch``).
        timeout: seconds until a first server joined, seconds a join may take (it is then
            tried again later), and seconds an epoch may wait without any usable server,
            before :class:`~dataflow.errors.ServerUnavailable` (not for a join).
        grace: seconds a server may be disconnected or silent before it is lost.
        sink: where batches are received.
        curve: CURVE keys applied to every socket (None: clear text); a refused handshake
            raises :class:`~dataflow.errors.ServerUnavailable` at once.
        find: looks the servers up again (a DNS name or a file), or None (a static list).
        resolve_interval: seconds between lookups with ``find``.
        request_timeout: seconds a request may go unanswered before its batch is asked of
            another server, or fails (:meth:`Scheduler.late`).
        io_threads: ZeroMQ I/O threads of this loader's own context (terminated when the
            thread ends, or by :meth:`stop` when it never ran).
        shm: slots of the shared-memory segment offered to each server
            (:mod:`dataflow.client.shmring`), or None: TCP frames only.
        group: the most batches a request carries, the reply's bytes they are sized to (None:
            always that many), and those of a reply landing in shared memory (None: the same):
            the scheduler's ``group``, ``group_bytes`` and ``shared_bytes``.
    """

    def __init__(self, endpoints: Sequence[str], hello: wire.Hello, prefetch: int,
                 timeout: float,
                 grace: float, sink: HostSink | CudaSink, curve: ClientCurve | None = None,
                 find: Lookup | None = None, resolve_interval: float = 10.0,
                 request_timeout: float = math.inf, io_threads: int = 1,
                 shm: Geometry | None = None,
                 group: tuple[int, int | None, int | None] = (1, None, None)) -> None:
        if hello.batch_size is None:
            raise InternalError("a loader's HELLO names its batch_size")
        batch_size = hello.batch_size
        super().__init__(name="dataflow-client-io", daemon=True)
        self._timeout = timeout
        self._request_timeout = request_timeout
        self._sink = sink
        self._routing_id = secrets.token_hex(8).encode()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.handoff: Handoff[Received] = Handoff(self._wake)
        self._scheduler = Scheduler(endpoints, timeout=timeout, heartbeat_s=HEARTBEAT_S,
                                    silent_s=SILENT_S, grace=grace, now=time.monotonic(),
                                    request_timeout=request_timeout, group=group[0],
                                    group_bytes=group[1], shared_bytes=group[2],
                                    prefetch=prefetch)
        self._control: dict[int, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._watch_at = 0.0  # when the monitors are read next (Links.changes)
        self._ctx: zmq.Context = context(io_threads)
        self._links = Links(self._ctx, self._poller, curve,
                            self._scheduler.endpoint)
        self._data = self._links.data
        self._shm = ShmRings(hello, prefetch, shm, self.handoff.count,
                             register=cuda_register if isinstance(sink, CudaSink) else None)
        self._joins = Joins(self._shm, self._scheduler, self.handoff, self._links,
                            self._control)
        self._inbox = Inbox(self._scheduler, self.handoff, self._joins, self._links, sink,
                            self._shm, batch_size)
        self._watcher = None if find is None else Watcher(find, self._wake)
        self._resolve_interval = resolve_interval
        self._membership: Membership | None = None

    # -- consumer side --------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def stop(self, join_timeout: float = 5.0) -> None:
        """Stop the thread (it says BYE to the servers and closes its sockets); a consumer
        waiting in the hand-off raises LoaderClosedError at once. Idempotent; any thread."""
        self.handoff.close()
        if self._wake_w < 0:
            return
        if self.is_alive():
            self._wake()
            if threading.current_thread() is self:
                # the garbage collector ran a loader's finalizer on this thread (a loader in
                # a reference cycle): the loop ends at its next poll (its wake pipe stays
                # open: a stop() from another thread may still write to it, and closes it)
                return
            self.join(join_timeout)
        if not self.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
            if self.ident is None:  # never started: no socket was opened in the context
                self._ctx.term()

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            listed = [self._scheduler.endpoint(i) for i in range(self._scheduler.count)]
            for server, endpoint in enumerate(listed):
                self._control[server] = self._links.open(server, CONTROL, self._routing_id,
                                                         endpoint)
            self._poller.register(self._wake_r, zmq.POLLIN)
            if self._watcher is not None:
                self._membership = Membership(listed, interval=self._resolve_interval,
                                              now=time.monotonic())
                self._watcher.start()
            self._serve()
        except Exception as e:
            self.handoff.fail(e)
        finally:
            self._close()

    def _poll(self, seconds: float) -> tuple[dict, bool]:
        """Poll once, at most MONITOR_MS (connections' changes, :meth:`Links.changes`, and what
        the consumer wants read are handled here); returns the events and whether to stop."""
        events = dict(self._poller.poll(int(min(seconds * 1000, MONITOR_MS)) + 1))
        now = time.monotonic()
        watch = now >= self._watch_at
        if watch:
            self._watch_at = now + MONITOR_MS / 1000
        for server, link, up in self._links.changes(events, watch):
            if not up:
                log.info("%s: %s connection down", self._scheduler.endpoint(server),
                         "control" if link == CONTROL else f"reader {link}")
            self._scheduler.link(server, link, up, time.monotonic())
        if self._wake_r in events:
            os.read(self._wake_r, 4096)
            self._inbox.follow(self.handoff.wanted())
        return events, self.handoff.stopping

    def _serve(self) -> None:
        while True:
            now = time.monotonic()
            wait = self._discover(now)
            for server in self._scheduler.hellos_due(now):
                self._joins.hello(server, now)
            self._request(now)
            # after the requests: a credit a reply just gave back first takes a batch asked
            # again (a batch waiting for it is not late), and those found late now go at once
            if self._late(now):
                self._request(now)
            events, stop = self._poll(min(wait, self._scheduler.next_deadline(now)))
            if stop:
                return
            for server, sock in self._control.items():
                if events.get(sock):
                    self._inbox.receive_all(sock, server, -1)
            for sock in [s for s in events if s in self._data]:
                if sock in self._data:  # not closed by a message read before
                    server, reader = self._data[sock]
                    self._inbox.receive_all(sock, server, reader)
            now = time.monotonic()
            for server in self._scheduler.heartbeats_due(now):
                try:
                    self._control[server].send_multipart(wire.encode(wire.Heartbeat()),
                                                         flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
            for server, joining in self._scheduler.check(now):
                self._joins.drop_data(server)
                if joining:
                    self._joins.expired(server)
                    continue
                log.warning("%s: lost (no usable connection for the grace period); its "
                            "batches go to the other servers", self._scheduler.endpoint(server))
                self.handoff.count("servers_lost")

    def _late(self, now: float) -> bool:
        """Apply the request timeout; returns whether a batch was found late."""
        found = self._scheduler.late(now)
        for late in found:
            self._inbox.late(late, request_timeout=self._request_timeout)
        return bool(found)

    # -- discovery ------------------------------------------------------------------------------

    def _discover(self, now: float) -> float:
        """Start a lookup when one is due and apply a finished one's joins and leaves;
        returns the seconds until the next lookup is due."""
        members, watcher = self._membership, self._watcher
        if members is None or watcher is None:
            return float("inf")
        if members.lookup_due(now):
            watcher.ask()
        result = watcher.result()
        if result is not None:
            found, error = result
            if found is None:
                log.warning("server lookup failed (servers unchanged): %s", error)
            changes = members.found(now, found, self._is_lost)
            for endpoint in changes.leaves:
                self._leave(endpoint, now)
            for endpoint in changes.joins:
                self._join(endpoint, now)
        return members.deadline(now)

    def _is_lost(self, endpoint: str) -> bool:
        server = self._scheduler.find(endpoint)
        return server is None or self._scheduler.state(server) is State.DOWN

    def _join(self, endpoint: str, now: float) -> None:
        server = self._scheduler.add(endpoint, now)
        self._control[server] = self._links.open(server, CONTROL, self._routing_id, endpoint)
        log.warning("%s: found by discovery; joining", endpoint)

    def _leave(self, endpoint: str, now: float) -> None:
        server = self._scheduler.find(endpoint)
        if server is None:
            return
        self._scheduler.retire(server, now)
        self._joins.drop_data(server)
        sock = self._control.pop(server)
        try:
            sock.send_multipart(wire.encode(wire.Bye()), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._links.close(sock, BYE_LINGER_MS)
        self.handoff.count("left")
        log.warning("%s: no longer found by discovery; left (its batches go to the other "
                    "servers)", endpoint)

    def _request(self, now: float) -> None:
        gen = self._scheduler.gen
        if gen is None:
            return
        taken = self.handoff.taken(gen)
        while True:
            for slot in self._scheduler.assignments(taken, now):
                request = self._shm.lend(slot.server, slot.request())
                self._control[slot.server].send_multipart(wire.encode(request),
                                                          flags=zmq.NOBLOCK)
                if slot.retry:
                    self.handoff.count("rerequested")
            at = self._scheduler.unblocked_at(taken)
            if at is None:
                return
            # Ask to be woken by the take that gets there; a take since the first look is seen
            # here, so no wake-up is missed between the two.
            fresh = self.handoff.taken(gen, wake_at=at)
            if fresh < at:
                return
            taken = fresh

    def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        for sock in self._control.values():
            try:
                sock.send_multipart(wire.encode(wire.Bye()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self._links.close(sock, BYE_LINGER_MS)
        for sock in list(self._data):
            self._links.close(sock, 0)
        self._inbox.close()
        self._sink.close()
        self._shm.close()
        # Every socket was closed above (the BYEs linger BYE_LINGER_MS at most); one left open
        # by an error on the way is closed at once rather than hanging the term.
        self._ctx.destroy(linger=0)
