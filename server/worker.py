"""Reader worker processes: read ranges of shards, transform, encode, send to the client.

A worker is a process started with the ``spawn`` method. It has two sockets:

* a DEALER connected to the frontend's private ``ipc://`` backend (tasks and notices);
* a ROUTER *data* socket bound next to the server's client endpoint (``tcp://host:*``, or
  ``<ipc path>.w<slot>``), with ``ROUTER_MANDATORY`` and ``ROUTER_HANDOVER`` (a client that
  reconnects with its session token takes its data connection over). Each client connects one
  DEALER whose routing id is its session token to every worker; replies go straight to the
  client, never through the frontend. A replacement worker binds its predecessor's endpoint,
  so clients reconnect to it by themselves.

Messages:

* frontend <-> worker: :mod:`dataflow.wire.internal`: a TASK (session token, req_id, ranges)
  in; READY once at start, SENT just before a reply is handed to ZeroMQ (the frontend returns
  the client's credit) and LOST when a reply could not be delivered (the client's data
  connection was missing for ``UNREACHABLE_S`` seconds, or more than ``MAX_PARKED`` replies
  were waiting for it) out. Replies wait per client: one client gone away never holds up
  another's.
* worker -> client (data socket): an encoded BATCH, or an ERROR of kind READ_FAILED whose
  message starts with the exception's class name (:mod:`dataflow.wire`). A BATCH's
  ``skipped`` counts the samples of the request the readers left out as damaged
  (``--on-error skip``: the change of each reader's ``skipped`` over the task), and
  ``size + skipped`` must be the request's sample count (else an ``InternalError`` reply). A
  batch over ``--max-reply-bytes`` is answered with ``ReplyTooLarge``. Shard paths in error
  messages are relative to the dataset root.
* client -> worker (data socket): HEARTBEAT, answered with a HEARTBEAT (the client waits for
  it before sending REQUESTs, so the first reply never finds the connection missing).
  Anything else is answered with an ERROR and otherwise ignored.

Each worker keeps an LRU of open shard readers. It exits when its parent dies (checked twice a
second) or on SIGTERM; SIGINT is ignored (the parent decides).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
import zmq

from dataflow import wire
from dataflow.batch import batch_len
from dataflow.errors import InternalError, ProtocolError
from dataflow.readers import ShardReader, open_shard, read_ranges
from dataflow.security import ServerCurve, secure_server
from dataflow.server.auth import start_gatekeeper, stop_gatekeeper
from dataflow.server.framing import SendResult, recv_bounded, try_send
from dataflow.server.guard import GUARD_MS, InboundGuard
from dataflow.server.peerlog import RateLimitedLog, quote
from dataflow.server.transform import Transform, apply_transform, load_transform
from dataflow.wire import ErrorKind
from dataflow.wire.internal import Lost, Ready, Sent, Task, decode_internal, encode_internal

MAX_OPEN_SHARDS = 32
PARENT_CHECK_MS = 500
RETRY_MS = 20
UNREACHABLE_S = 5.0
MAX_PARKED = 8
MAX_DATA_INBOUND = 64 * 1024

log = logging.getLogger("dataflow.server.worker")


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker process needs (sent to the child by multiprocessing at spawn).

    Attributes:
        backend: the frontend's ipc:// endpoint.
        data_sndhwm: send high-water mark of the data socket per client (messages); above the
            most replies a client can have outstanding, so sends never meet a full queue.
        shards: shard URLs in index order.
        cache_dir: reader cache directory.
        transform: optional ``module:function``.
        on_error: reader policy for damaged samples.
        parent_pid: the server process; the worker exits when it is gone.
        log_level: logging level number.
        max_reply_bytes: most bytes of one reply's arrays.
        root: the dataset root, cut from shard paths in messages to clients.
        max_connections: client data connections kept at once.
        curve: the server's CURVE policy for the data socket (None: clear text).
    """

    backend: str
    data_sndhwm: int
    shards: tuple[str, ...]
    cache_dir: str | None
    transform: str | None
    on_error: str
    parent_pid: int
    log_level: int
    max_reply_bytes: int
    root: str
    max_connections: int
    curve: ServerCurve | None = None


class ReaderCache:
    """An LRU of open shard readers (at most ``capacity`` open at once). Not thread-safe."""

    def __init__(self, spec: WorkerSpec, capacity: int = MAX_OPEN_SHARDS) -> None:
        self._spec = spec
        self._capacity = capacity
        self._open: OrderedDict[int, ShardReader] = OrderedDict()

    def get(self, shard: int) -> ShardReader:
        reader = self._open.get(shard)
        if reader is not None:
            self._open.move_to_end(shard)
            return reader
        reader = open_shard(self._spec.shards[shard], cache_dir=self._spec.cache_dir,
                            on_error=self._spec.on_error)
        self._open[shard] = reader
        while len(self._open) > self._capacity:
            self._open.popitem(last=False)[1].close()
        return reader

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


class SkipMeter:
    """Opens readers for one task and counts the samples each shard's readers skip meanwhile.

    A reader's ``skipped`` is cumulative; the change from when the task first got it is this
    task's. A reader closed by the LRU and opened again within the task counts from zero again.
    """

    def __init__(self, readers: ReaderCache) -> None:
        self._readers = readers
        self._seen: dict[int, list[tuple[ShardReader, int]]] = {}

    def get(self, shard: int) -> ShardReader:
        reader = self._readers.get(shard)
        seen = self._seen.setdefault(shard, [])
        if not seen or seen[-1][0] is not reader:
            seen.append((reader, reader.skipped))
        return reader

    def skips(self) -> dict[int, int]:
        """Samples skipped during the task, by shard (shards with none left out)."""
        out = {shard: sum(r.skipped - before for r, before in seen)
               for shard, seen in self._seen.items()}
        return {shard: n for shard, n in out.items() if n}


@dataclass(frozen=True)
class Reply:
    """The encoded reply to one task, and what the frontend counts of it.

    Attributes:
        frames: an encoded BATCH or ERROR.
        skips: ``(shard, samples)`` left out as damaged.
        too_large: whether the batch exceeded ``--max-reply-bytes``.
    """

    frames: list[wire.Buffer]
    skips: tuple[tuple[int, int], ...] = ()
    too_large: bool = False


class ReplyTooLarge(Exception):
    """A batch exceeds ``--max-reply-bytes``."""


def serve_task(readers: ReaderCache, transform: Transform | None, spec: WorkerSpec,
               req_id: int, ranges: np.ndarray) -> Reply:
    """The reply (BATCH or ERROR) to one task; never raises for bad data."""
    meter = SkipMeter(readers)
    try:
        batch = read_ranges(meter.get, ranges)
        if transform is not None:
            batch = apply_transform(transform, spec.transform or "", batch)
        skips = meter.skips()
        skipped = sum(skips.values())
        requested = int((ranges[:, 2] - ranges[:, 1]).sum())
        if batch_len(batch) + skipped != requested:
            raise InternalError(f"batch of {batch_len(batch)} sample(s) with {skipped} skipped "
                                f"for a request of {requested}")
        msg = wire.batch_to_message(req_id, batch, skipped)
        nbytes = sum(a.nbytes for a in msg.arrays)
        if nbytes > spec.max_reply_bytes:
            raise ReplyTooLarge(f"batch of {nbytes} bytes exceeds this server's "
                                f"--max-reply-bytes {spec.max_reply_bytes}; ask for fewer "
                                "samples a request")
        return Reply(wire.encode(msg), tuple(sorted(skips.items())))
    except Exception as e:
        log.warning("request %d failed: %s: %s", req_id, type(e).__name__, e)
        text = f"{type(e).__name__}: {e}"
        if spec.root:
            text = text.replace(spec.root, "")
        return Reply(wire.encode(wire.ErrorMsg(req_id, ErrorKind.READ_FAILED, text)),
                     too_large=isinstance(e, ReplyTooLarge))


@dataclass(frozen=True)
class _Parked:
    """A reply whose client's data connection was missing; retried until ``deadline``."""

    token: bytes
    req_id: int
    frames: list
    deadline: float


class DataSender:
    """Sends replies on the data socket and notices to the frontend. Not thread-safe.

    Attributes:
        parked: per client data connection (session token), replies that could not be handed
            to ZeroMQ yet, oldest first; only tokens with parked replies are keys.
    """

    def __init__(self, data: zmq.Socket, control: zmq.Socket) -> None:
        self._data = data
        self._control = control
        self.parked: dict[bytes, deque[_Parked]] = {}

    def send(self, token: bytes, req_id: int, reply: Reply) -> None:
        """Notify the frontend, then hand the reply to ZeroMQ (parked if the client is away)."""
        frames = reply.frames
        nbytes = sum(memoryview(f).nbytes for f in frames)
        self._control.send_multipart(encode_internal(
            Sent(token, req_id, nbytes, reply.skips, int(reply.too_large))))
        waiting = self.parked.get(token)
        if waiting is None and try_send(self._data, token, frames) is SendResult.OK:
            return
        waiting = self.parked.setdefault(token, deque())
        waiting.append(_Parked(token, req_id, frames, time.monotonic() + UNREACHABLE_S))
        while len(waiting) > MAX_PARKED:
            self._lost(waiting.popleft(), f"more than {MAX_PARKED} replies were waiting for "
                                          "the client's data connection")

    def retry(self) -> None:
        """Retry each client's parked replies in order; give up on those past their deadline."""
        now = time.monotonic()
        for token, waiting in list(self.parked.items()):
            while waiting:
                p = waiting[0]
                if try_send(self._data, token, p.frames) is SendResult.OK:
                    waiting.popleft()
                elif now > p.deadline:
                    waiting.popleft()
                    self._lost(p, f"the client's data connection to this reader was missing "
                                  f"for {UNREACHABLE_S} s")
                else:
                    break
            if not waiting:
                del self.parked[token]

    def _lost(self, p: _Parked, why: str) -> None:
        log.warning("reply to request %d dropped: %s", p.req_id, why)
        self._control.send_multipart(encode_internal(Lost(p.token, p.req_id, why)))


def answer_data(sock: zmq.Socket, guard: InboundGuard, peer_log: RateLimitedLog) -> None:
    """Answer one message from a client's data connection (HEARTBEAT -> HEARTBEAT)."""
    inbound = recv_bounded(sock, 2)
    frames = inbound.frames
    peer = frames[0].bytes
    guard.delivered(frames[0].get(zmq.SRCFD), inbound.nbytes, inbound.count)
    try:
        if inbound.extra or len(frames) != 2:
            raise ProtocolError("a data connection accepts only HEARTBEAT messages")
        msg = wire.decode(frames[1:])
        if not isinstance(msg, wire.Heartbeat):
            raise ProtocolError(f"a data connection accepts only HEARTBEAT messages. Found: "
                                f"{wire.kind_of(msg).name}")
        reply = wire.encode(wire.Heartbeat())
    except ProtocolError as e:
        peer_log.warning("malformed message on the data socket from %s: %s", peer.hex()[:64],
                         quote(str(e), 400))
        reply = wire.encode(wire.ErrorMsg(-1, ErrorKind.PROTOCOL, str(e)))
    try_send(sock, peer, reply)  # a peer that is gone or not reading loses its answer


def run_worker(spec: WorkerSpec, identity: bytes, data_bind: str) -> None:
    """Entry point of a worker process (the target given to multiprocessing).

    Args:
        spec: what every worker needs.
        identity: this worker's routing id at the frontend.
        data_bind: endpoint to bind the data socket to (a concrete one for a replacement).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level,
                        format="%(asctime)s %(levelname)s worker[%(process)d] %(message)s")
    transform = load_transform(spec.transform) if spec.transform else None
    readers = ReaderCache(spec)
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
    secure_server(data, spec.curve)
    gate = start_gatekeeper(ctx, spec.curve)
    sender = DataSender(data, sock)
    peer_log = RateLimitedLog(log)
    guard = InboundGuard(data, MAX_DATA_INBOUND, spec.max_connections,
                         tcp=data_bind.startswith("tcp://"), counters={"connections_cut": 0},
                         peer_log=peer_log, limit_name="a data connection's limit")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(data, zmq.POLLIN)
    poller.register(guard.monitor, zmq.POLLIN)
    try:
        data.bind(data_bind)
        sock.send_multipart(encode_internal(Ready(data.getsockopt_string(zmq.LAST_ENDPOINT))))
        while True:
            busy = bool(sender.parked) or len(guard) > 0
            events = dict(poller.poll(min(RETRY_MS, GUARD_MS) if busy else PARENT_CHECK_MS))
            guard.check(time.monotonic())
            peer_log.tick()
            if sender.parked:
                sender.retry()
            if data in events:
                answer_data(data, guard, peer_log)
            if sock not in events:
                if os.getppid() != spec.parent_pid:
                    log.info("parent %d is gone; exiting", spec.parent_pid)
                    return
                continue
            task = decode_internal(sock.recv_multipart())
            if not isinstance(task, Task):
                raise InternalError(f"the frontend sent a {type(task).__name__}")
            reply = serve_task(readers, transform, spec, task.req_id, task.ranges)
            sender.send(task.token, task.req_id, reply)
    finally:
        readers.close()
        guard.close()
        sock.close()
        data.close()
        stop_gatekeeper(gate)
        ctx.term()
