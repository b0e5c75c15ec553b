"""Reader worker processes: serve tasks (:mod:`dataflow.server.tasks`), send replies to clients.

A worker is a process forked from the server before it creates its ZeroMQ context (the first
workers: their imports are already done) or started with the ``spawn`` method (replacements).
It has two sockets:

* a DEALER connected to the frontend's private ``ipc://`` backend (tasks and notices);
* a ROUTER *data* socket bound next to the server's client endpoint (``tcp://host:*``, or
  ``<ipc path>.w<slot>``), with ``ROUTER_MANDATORY`` and ``ROUTER_HANDOVER`` (a client that
  reconnects with its session token takes its data connection over). Each client connects one
  DEALER whose routing id is its session token to every worker; replies go straight to the
  client, never through the frontend. A replacement worker binds its predecessor's endpoint,
  so clients reconnect to it by themselves.

Messages:

* frontend <-> worker: :mod:`dataflow.wire.internal`: a TASK (session token, req_id, ranges,
  tag, the session's columns, readers that exited holding it before) in; STARTED once at
  start, SENT just before a reply is handed to ZeroMQ (the frontend returns the client's
  credit), DONE once ZeroMQ let go of a reply's bytes (the frontend counts what readers hold
  unsent: :mod:`~dataflow.server.unsent`), LOST when a reply could not be delivered (its
  client's data connection was missing too long, or too many replies waited for it:
  :mod:`~dataflow.server.sender`), and ATTACHED the first time a data connection says
  HEARTBEAT (the frontend dispatches a session's requests only once one did) out. Replies
  wait per client: one client gone away never holds up another's.
* worker -> client (data socket): an encoded BATCH, or an ERROR of kind READ_FAILED (the data
  could not be served) or INTERNAL (a bug of the server) whose message starts with the
  exception's class name (:func:`~dataflow.server.tasks.serve_task`). A BATCH's ``skipped``
  counts the samples of the request the readers left out as damaged (``--on-error skip``: the
  change of each reader's ``skipped`` over the task), and ``size + skipped`` must be the
  request's sample count (else an ``InternalError``). A batch over ``--max-reply-bytes`` is
  answered with ``ReplyTooLarge``. Shard paths in error messages are relative to the dataset
  root.
* client -> worker (data socket): HEARTBEAT, answered with a HEARTBEAT (the client waits for
  it before sending REQUESTs, so the first reply never finds the connection missing).
  Anything else is answered with an ERROR and otherwise ignored.

The data socket is client-facing: it has the options and the
:class:`~dataflow.server.guard.InboundGuard` of the frontend's, with the bounds of
:class:`DataCaps`. When a reply is handed to ZeroMQ its last frame carries a tracker, which
tells when ZeroMQ let go of the whole reply.

A worker keeps its freed batch memory for the next batch (:mod:`~dataflow.heap`). Each
worker keeps an LRU of open shard readers, and with ``--cache-memory`` and a ``Stages``
transform an LRU of decoded samples (its share of the flag:
:mod:`~dataflow.server.samplecache`). It exits when its parent dies (checked twice a second) or
on SIGTERM; SIGINT is ignored (the parent decides).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

import zmq

from dataflow import wire
from dataflow.errors import InternalError, ProtocolError
from dataflow.heap import keep_freed_memory
from dataflow.readers import lease
from dataflow.readers.guard import settle
from dataflow.readers.tar import sharedindex
from dataflow.security import secure_server
from dataflow.server.auth import start_gatekeeper, stop_gatekeeper
from dataflow.server.diskcache import DiskTier
from dataflow.server.eviction import PlanAware
from dataflow.server.framing import (
    MAX_ERROR_TEXT,
    recv_bounded,
    recv_parts,
    try_send,
)
from dataflow.server.guard import (
    GUARD_MS,
    OLD_ZMTP,
    InboundGuard,
    client_socket_options,
    message_fd,
)
from dataflow.server.peerlog import RateLimitedLog, quote
from dataflow.server.samplecache import Key, SampleCache, rows_of
from dataflow.server.sender import DataSender
from dataflow.server.shmserve import Segments
from dataflow.server.tasks import ReaderCache, ReplySizes, WorkerSpec, serve_task
from dataflow.server.transform import load_transform
from dataflow.wire import ErrorKind
from dataflow.wire.internal import (
    Forget,
    Started,
    Task,
    decode_internal,
    encode_internal,
)

PARENT_CHECK_MS = 500
SWEEP_S = 0.5  # how often mapped shared-memory segments are checked (unlinked: unmapped)
RETRY_MS = 20
MAX_DATA_INBOUND = 64 * 1024
MAX_DATA_INBOUND_TOTAL = 1024 * 1024


@dataclass(frozen=True)
class DataCaps:
    """Bounds on a reader's client data connections (from the server's flags), beyond
    :class:`~dataflow.server.tasks.WorkerSpec`'s ``max_connections``.

    Attributes:
        per_address: data connections at once from one peer address.
        tcp_timeout_s: seconds after which the kernel closes a connection whose peer vanished
            or stopped reading (:func:`~dataflow.server.guard.client_socket_options`).
    """

    per_address: int
    tcp_timeout_s: float


log = logging.getLogger("dataflow.server.worker")


def answer_data(sock: zmq.Socket, guard: InboundGuard, peer_log: RateLimitedLog,
                sender: DataSender) -> None:
    """Answer one message from a client's data connection (HEARTBEAT -> HEARTBEAT; the first
    HEARTBEAT of a connection is announced to the frontend)."""
    inbound = recv_bounded(sock, 2)
    frames = inbound.frames
    peer = frames[0].bytes
    fd = message_fd(frames[0])
    if fd is not None:
        guard.delivered(fd, inbound.nbytes, inbound.count)
    try:
        if fd is None:
            raise ProtocolError(OLD_ZMTP)
        if inbound.extra or len(frames) != 2:
            raise ProtocolError("a data connection accepts only HEARTBEAT messages")
        msg = wire.decode(frames[1:])
        if not isinstance(msg, wire.Heartbeat):
            raise ProtocolError(f"a data connection accepts only HEARTBEAT messages. Found: "
                                f"{wire.kind_of(msg).name}")
        sender.attached(peer)
        reply = wire.encode(wire.Heartbeat())
    except ProtocolError as e:
        peer_log.warning("malformed message on the data socket from %s: %s", peer.hex()[:64],
                         quote(str(e), 400))
        reply = wire.encode(wire.ErrorMsg(-1, ErrorKind.PROTOCOL, str(e)[:MAX_ERROR_TEXT]))
    try_send(sock, peer, reply)  # a peer that is gone or not reading loses its answer


def run_worker(spec: WorkerSpec, identity: bytes, data_bind: str, caps: DataCaps) -> None:
    """Entry point of a worker process (the target given to multiprocessing).

    Args:
        spec: what every worker needs.
        identity: this worker's routing id at the frontend.
        data_bind: endpoint to bind the data socket to (a concrete one for a replacement).
        caps: bounds on its client data connections.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker has the server's handler
    logging.basicConfig(level=spec.log_level, force=True,
                        format="%(asctime)s %(levelname)s worker[%(process)d] %(message)s")
    if not keep_freed_memory():
        log.debug("malloc is not glibc's: freed batch memory goes back to the kernel")
    no_leases = lease.arm()
    sharedindex.allow(spec.shared_indexes)
    if no_leases:
        log.debug("no read leases on shards (every read checked with fstat): %s", no_leases)
    transform = (load_transform(spec.transform, spec.transform_path) if spec.transform
                 else None)
    readers = ReaderCache(spec)
    cache = None
    if spec.cache_memory and transform is not None and transform.decode is not None:
        disk = (DiskTier(spec.cache_disk, spec.cache_disk_bytes) if spec.cache_disk
                else None)
        policy: PlanAware[Key] | None = (PlanAware(spec.plan_sessions, spec.cache_plan_window)
                                         if spec.cache_plan_window else None)
        cache = SampleCache(spec.cache_memory, disk, policy)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.connect(spec.backend)
    data = ctx.socket(zmq.ROUTER)
    data.setsockopt(zmq.LINGER, 0)
    data.setsockopt(zmq.ROUTER_MANDATORY, 1)
    data.setsockopt(zmq.ROUTER_HANDOVER, 1)
    data.setsockopt(zmq.SNDHWM, spec.data_sndhwm)
    data.setsockopt(zmq.MAXMSGSIZE, MAX_DATA_INBOUND)
    client_socket_options(data, caps.tcp_timeout_s)
    secure_server(data, spec.curve)
    gate = start_gatekeeper(ctx, spec.curve)
    sender = DataSender(data, sock, max_announced=spec.max_connections)
    peer_log = RateLimitedLog(log)
    guard = InboundGuard(data, MAX_DATA_INBOUND, spec.max_connections,
                         tcp=data_bind.startswith("tcp://"), counters={"connections_cut": 0},
                         peer_log=peer_log, total_limit=MAX_DATA_INBOUND_TOTAL,
                         per_address=caps.per_address, limit_name="a data connection's limit",
                         total_name="a reader's limit over its data connections")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(data, zmq.POLLIN)
    poller.register(guard.monitor, zmq.POLLIN)
    wake = lease.wakeup_fd()
    if wake is not None:  # a lease broke: let the writer go on at once
        poller.register(wake, zmq.POLLIN)
    segments = Segments()
    sizes = ReplySizes()
    swept = time.monotonic()
    try:
        data.bind(data_bind)
        sock.send_multipart(encode_internal(Started(data.getsockopt_string(zmq.LAST_ENDPOINT))))
        while True:
            busy = sender.busy or len(guard) > 0
            events = dict(poller.poll(min(RETRY_MS, GUARD_MS) if busy else PARENT_CHECK_MS))
            now = time.monotonic()
            if wake in events:
                lease.drain()
            settle()
            guard.check(now)
            peer_log.tick()
            if segments and now - swept > SWEEP_S:
                segments.sweep(now)
                swept = now
            if sender.unrouted:
                sender.retry()
            if sender.unsent:
                sender.collect()
            if data in events:
                answer_data(data, guard, peer_log, sender)
            if sock not in events:
                if os.getppid() != spec.parent_pid:
                    log.info("parent %d is gone; exiting", spec.parent_pid)
                    return
                continue
            task = decode_internal(recv_parts(sock))
            if isinstance(task, Forget):
                if cache is not None and isinstance(cache.policy, PlanAware):
                    cache.policy.forget_session(task.token)
                continue
            if not isinstance(task, Task):
                raise InternalError(f"the frontend sent a {type(task).__name__}")
            if task.attempts:
                log.warning("request %d: %d reader(s) exited holding it before; reading ranges "
                            "%s", task.req_id, task.attempts, task.ranges[:8].tolist())
            if len(task.ahead) and cache is not None and isinstance(cache.policy, PlanAware):
                cache.policy.announce(task.token, rows_of(task.ahead))
            sender.send(*serve_task(readers, transform, spec, task, segments, cache, sizes))
    finally:
        segments.close()
        readers.close()
        if cache is not None:
            cache.close()
        guard.close()
        sock.close()
        data.close()
        stop_gatekeeper(gate)
        ctx.term()
