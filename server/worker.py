"""Reader worker processes: read ranges of shards, transform, encode, send back.

A worker is a process started with the ``spawn`` method. It connects a DEALER socket to the
frontend's private ``ipc://`` backend and serves tasks one at a time:

* frontend -> worker: ``[client, req_id, ranges]`` where ``req_id`` is 8 little-endian bytes
  and ``ranges`` the int64 ``(n, 3)`` (shard, start, stop) triples of one REQUEST.
* worker -> frontend: ``[client, req_id, *frames]`` where ``frames`` is an encoded BATCH or
  ERROR message (see :mod:`dataflow.wire`), ready to forward to the client untouched.
* worker -> frontend, once at start: ``[READY]``.

Each worker keeps an LRU of open shard readers. It exits when its parent dies (checked twice a
second) or on SIGTERM; SIGINT is ignored (the parent decides).
"""

from __future__ import annotations

import logging
import os
import signal
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import zmq

from dataflow import wire
from dataflow.columns import Batch, concat
from dataflow.errors import DataflowError
from dataflow.readers import ShardReader, open_shard
from server.transform import Transform, apply_transform, load_transform

READY = b"READY"
MAX_OPEN_SHARDS = 32
PARENT_CHECK_MS = 500

log = logging.getLogger("dataflow.server.worker")


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker process needs (sent to the child by multiprocessing at spawn).

    Attributes:
        backend: the frontend's ipc:// endpoint.
        shards: shard URLs in index order.
        cache_dir: reader cache directory.
        transform: optional ``module:function``.
        on_error: reader policy for damaged samples.
        parent_pid: the server process; the worker exits when it is gone.
        log_level: logging level number.
    """

    backend: str
    shards: tuple[str, ...]
    cache_dir: str | None
    transform: str | None
    on_error: str
    parent_pid: int
    log_level: int


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


def read_ranges(readers: ReaderCache, ranges: np.ndarray) -> Batch:
    """Read ``(shard, start, stop)`` rows of ``ranges`` (int64, (n, 3)) into one batch."""
    parts = []
    for shard, start, stop in ranges.tolist():
        reader = readers.get(shard)
        try:
            parts.append(reader.read(start, stop))
        except DataflowError:
            raise
        except Exception as e:
            raise DataflowError(f"{reader.url}: reading samples [{start}, {stop}) failed: "
                                f"{type(e).__name__}: {e}") from e
    return concat(parts)


def serve_task(readers: ReaderCache, transform: Transform | None, spec: WorkerSpec,
               req_id: int, ranges: np.ndarray) -> list[wire.Buffer]:
    """Encoded reply (BATCH or ERROR) to one task; never raises for bad data."""
    try:
        batch = read_ranges(readers, ranges)
        if transform is not None:
            batch = apply_transform(transform, spec.transform or "", batch)
        return wire.encode(wire.batch_to_message(req_id, batch))
    except Exception as e:
        log.warning("request %d failed: %s: %s", req_id, type(e).__name__, e)
        return wire.encode(wire.ErrorMsg(req_id, type(e).__name__, str(e)))


def run_worker(spec: WorkerSpec, identity: bytes) -> None:
    """Entry point of a worker process (the target given to multiprocessing)."""
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
    try:
        sock.send(READY)
        while True:
            if not sock.poll(PARENT_CHECK_MS):
                if os.getppid() != spec.parent_pid:
                    log.info("parent %d is gone; exiting", spec.parent_pid)
                    return
                continue
            client, req, ranges = sock.recv_multipart()
            req_id = int.from_bytes(req, "little")
            reply = serve_task(readers, transform, spec, req_id,
                               np.frombuffer(ranges, dtype=np.int64).reshape(-1, 3))
            sock.send_multipart([client, req, *reply], copy=False)
    finally:
        readers.close()
        sock.close()
        ctx.term()
