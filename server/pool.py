"""The pool of reader worker processes, as seen from the frontend.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from dataflow.errors import ServerStartError
from dataflow.server.tasks import WorkerSpec
from dataflow.server.worker import DataCaps, run_worker
from dataflow.wire.internal import Task

log = logging.getLogger("dataflow.server.pool")

MAX_RESTARTS = 100
JOIN_TIMEOUT = 3.0


@dataclass
class Worker:
    """One worker process and the tasks it holds (at most ``worker_queue``), by
    ``(session token, req_id)``."""

    identity: bytes
    process: mp.process.BaseProcess
    slot: int
    ready: bool = False
    tasks: dict[tuple[bytes, int], Task] = field(default_factory=dict)


def least_loaded(workers: Iterable[Worker], capacity: int,
                 backlog: Callable[[bytes], int]) -> Worker | None:
    """The ready worker with room (fewer than ``capacity`` tasks) holding the fewest tasks, of
    those the one with the least ``backlog`` (reply bytes its ZeroMQ I/O thread has yet to
    write), the first on a tie; None when none has room.

    A reader is done with a task when it hands the reply to ZeroMQ, so readers serving one
    client's requests one at a time are all idle at each request: by tasks alone the first one
    took nearly every request and its I/O thread wrote nearly every byte (72-76% busy, the
    other reader's under 5%, 19 MB batches on the H100) while the other readers' sat idle."""
    best, best_key = None, (0, 0)
    for w in workers:
        if not w.ready or len(w.tasks) >= capacity:
            continue
        key = (len(w.tasks), backlog(w.identity))
        if best is None or key < best_key:
            best, best_key = w, key
    return best


class WorkerPool:
    """Starts, watches and replaces ``n`` worker processes (spawn start method).

    Worker ``slot`` binds its data socket to ``data_binds[slot]`` first; once it reported the
    concrete endpoint, a replacement binds that same endpoint, so clients keep theirs.

    Args:
        spec: what each worker needs.
        n: number of workers.
        capacity: tasks a worker may hold at once.
        data_binds: per slot, where the first worker binds its data socket.
        caps: bounds on each worker's client data connections.
    """

    def __init__(self, spec: WorkerSpec, n: int, capacity: int, data_binds: list[str],
                 caps: DataCaps) -> None:
        self._spec = spec
        self._caps = caps
        self._n = n
        self._binds = list(data_binds)
        self.endpoints: list[str | None] = [None] * n
        self.capacity = capacity
        self._ctx = mp.get_context("spawn")
        self._fork = mp.get_context("fork")
        self._workers: dict[bytes, Worker] = {}
        self._serial = 0
        self.restarts = 0

    def start(self, *, fork: bool = False) -> None:
        """Start all workers (idempotent).

        Args:
            fork: fork them from this process, whose imports they then share (milliseconds
                each), instead of spawning fresh interpreters (~0.3 s of imports each, more
                on a busy machine). Only for a caller that has no ZeroMQ context yet (its I/O
                threads would be copied mid-flight); ignored while this process runs any
                other Python thread (a fork copies the locks they hold). Replacements of
                dead workers are always spawned.
        """
        method = self._fork if fork and threading.active_count() == 1 else self._ctx
        taken = {w.slot for w in self._workers.values()}
        for slot in range(self._n):
            if slot not in taken:
                self._spawn(slot, method)

    def _spawn(self, slot: int,
               method: mp.context.SpawnContext | mp.context.ForkContext | None = None) -> None:
        self._serial += 1
        identity = b"w%d" % self._serial
        bind = self.endpoints[slot] or self._binds[slot]
        proc = (method or self._ctx).Process(target=run_worker,
                                             args=(self._spec, identity, bind, self._caps),
                                             name=f"dataflow-worker-{self._serial}",
                                             daemon=True)
        proc.start()
        self._workers[identity] = Worker(identity, proc, slot)

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._workers.values())

    def __len__(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        """Worker process ids (for the ready line and logs; never sent to clients)."""
        return [w.process.pid for w in self._workers.values() if w.process.pid is not None]

    @property
    def all_ready(self) -> bool:
        return all(w.ready for w in self._workers.values())

    @property
    def size(self) -> int:
        """Reader slots (the workers asked for)."""
        return self._n

    @property
    def ready_count(self) -> int:
        """Slots whose current worker reported STARTED (a replacement counts once it did)."""
        return sum(w.ready for w in self._workers.values())

    def started(self, identity: bytes, endpoint: str) -> None:
        """Worker ``identity`` said STARTED: it serves, with its data socket at ``endpoint``."""
        worker = self._workers.get(identity)
        if worker is not None:
            worker.ready = True
            self.endpoints[worker.slot] = endpoint

    def get(self, identity: bytes) -> Worker | None:
        return self._workers.get(identity)

    def least_loaded(self, backlog: Callable[[bytes], int]) -> Worker | None:
        """:func:`least_loaded` of this pool's workers."""
        return least_loaded(self._workers.values(), self.capacity, backlog)

    def reap(self, *, respawn: bool) -> list[tuple[Worker, int | None]]:
        """Remove dead workers (and start replacements when ``respawn``).

        Returns:
            ``(worker, exitcode)`` of each dead worker; its ``tasks`` were lost.

        Raises:
            ServerStartError: more than ``MAX_RESTARTS`` replacements were needed.
        """
        dead = [w for w in self._workers.values() if not w.process.is_alive()]
        out = []
        for w in dead:
            del self._workers[w.identity]
            out.append((w, w.process.exitcode))
            log.error("worker pid %s exited with code %s holding %d task(s)", w.process.pid,
                      w.process.exitcode, len(w.tasks))
            if respawn:
                self.restarts += 1
                if self.restarts > MAX_RESTARTS:
                    raise ServerStartError(f"workers died {self.restarts} times; giving up")
                self._spawn(w.slot)
        return out

    def close(self) -> None:
        """Terminate every worker and wait for it (kill after a grace period); idempotent."""
        for w in self._workers.values():
            if w.process.is_alive():
                w.process.terminate()
        for w in self._workers.values():
            w.process.join(JOIN_TIMEOUT)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(JOIN_TIMEOUT)
        self._workers.clear()
