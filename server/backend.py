"""The frontend's side of its reader processes: start-up, tasks, notices, deaths.

Frontend and readers speak :mod:`dataflow.wire.internal` over a private ``ipc://`` ROUTER
(``backend``), readers connected as DEALERs with their pool identity as routing id.

Reads are stateless, so the tasks a dead reader held go back to the front of their sessions'
queues and are served by the other readers or its replacement; a task whose readers died
``MAX_ATTEMPTS`` times is answered with WorkerDied instead (a poison request must not kill
readers forever).

The readers' SENT and DONE notices count the reply bytes they hold unsent
(:class:`~dataflow.server.unsent.Unsent`); while those are at their limit, no request is
handed to a reader, nor one of an address at its share. ATTACHED notices mark a session's
data connection seen, which lets its requests be dispatched.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from dataflow.errors import InternalError, ProtocolError, ServerStartError
from dataflow.index import DatasetIndex
from dataflow.server.delivery import Delivery
from dataflow.server.framing import NOBLOCK, recv_parts, send_parts
from dataflow.server.ledger import Ledger
from dataflow.server.pool import WorkerPool
from dataflow.server.sessions import Sessions
from dataflow.server.unsent import Unsent
from dataflow.wire import ErrorKind
from dataflow.wire.internal import (
    Attached,
    Done,
    Forget,
    Internal,
    Lost,
    Sent,
    Started,
    decode_internal,
    encode_internal,
)

log = logging.getLogger("dataflow.server")

DRAIN = 256
MAX_ATTEMPTS = 3


class WorkerHandler:
    """Hands queued requests to readers and turns their notices into settled credits.

    Args:
        backend: the ROUTER the readers connect to.
        pool: the worker pool.
        ledger: the sessions' credit accounts.
        delivery: sends to clients.
        counters: the frontend's STATS counters (updated in place).
        index: the dataset served (for error messages; the samples it lost to damage start
            ``skipped_per_shard`` and the ``skipped_samples`` counter).
        sessions: all sessions (marked attached).
        unsent: reply bytes the readers hold unsent.

    Attributes:
        skipped_per_shard: samples left out as damaged, by shard number: those the index
            lost when it was built, then those left out of replies.
        cache_bytes: bytes each reader's decoded-sample cache held, in memory and on disk, at
            its last SENT that used it, by reader identity (a reader that exited is dropped
            with its cache).
    """

    def __init__(self, backend: zmq.Socket, pool: WorkerPool, ledger: Ledger,
                 delivery: Delivery, counters: dict[str, int], index: DatasetIndex,
                 sessions: Sessions, unsent: Unsent) -> None:
        self._backend = backend
        self._pool = pool
        self._ledger = ledger
        self._delivery = delivery
        self._counters = counters
        self._index = index
        self._sessions = sessions
        self._unsent = unsent
        # Samples lost when the index was built count from the start; reads add theirs.
        self.skipped_per_shard = {i: n for i, n in enumerate(index.skipped) if n}
        counters["skipped_samples"] += index.lost
        self.cache_bytes: dict[bytes, tuple[int, int]] = {}

    def _recv(self) -> tuple[bytes, Internal]:
        frames = recv_parts(self._backend, NOBLOCK)
        try:
            return frames[0], decode_internal(frames[1:])
        except ProtocolError as e:
            raise InternalError(f"reader {frames[0]!r} sent a malformed message: {e}") from e

    def wait_ready(self, timeout: float, stop: Callable[[], bool]) -> None:
        """Wait until every worker reported STARTED.

        Raises:
            ServerStartError: a worker died first or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while not self._pool.all_ready and not stop():
            if self._backend.poll(100):
                identity, msg = self._recv()
                if isinstance(msg, Started):
                    self._pool.started(identity, msg.endpoint)
            dead = self._pool.reap(respawn=False)
            if dead:
                w, code = dead[0]
                raise ServerStartError(f"worker pid {w.process.pid} exited with code {code} "
                                       "during startup (see its log above)")
            if time.monotonic() > deadline:
                raise ServerStartError(f"workers not ready after {timeout:.0f} s")

    def read_notices(self) -> None:
        """Handle the readers' waiting messages (at most a bounded number)."""
        for _ in range(DRAIN):
            try:
                identity, msg = self._recv()
            except zmq.Again:
                return
            self._on_notice(identity, msg)

    def _on_notice(self, identity: bytes, msg: Internal) -> None:
        if isinstance(msg, Started):
            self._pool.started(identity, msg.endpoint)
            return
        if isinstance(msg, Attached):
            s = self._sessions.by_token(msg.token)
            if s is not None and self._ledger.attach(msg.token):
                s.attached = True
            return
        worker = self._pool.get(identity)
        if isinstance(msg, Done):
            if worker is not None:  # a reaped reader's bytes were dropped with it
                self._unsent.release(identity, msg.token, msg.nbytes)
            return
        if not isinstance(msg, Sent | Lost):
            raise InternalError(f"reader {identity!r} sent a {type(msg).__name__}")
        if worker is not None:
            worker.tasks.pop((msg.token, msg.req_id), None)
        if isinstance(msg, Sent):
            if worker is not None:
                self._unsent.add(identity, msg.token, self._ledger.address(msg.token) or "",
                                 msg.nbytes)
            for shard, n in msg.skips:
                self.skipped_per_shard[shard] = self.skipped_per_shard.get(shard, 0) + n
                self._counters["skipped_samples"] += n
            self._counters["replies_too_large"] += msg.too_large
            self._counters["cache_hits"] += msg.cache_hits
            self._counters["cache_misses"] += msg.cache_misses
            self._counters["cache_evictions"] += msg.cache_evictions
            self._counters["cache_disk_hits"] += msg.cache_disk_hits
            self._counters["cache_disk_evictions"] += msg.cache_disk_evictions
            if worker is not None and msg.cache_hits + msg.cache_disk_hits + msg.cache_misses:
                self.cache_bytes[identity] = (msg.cache_bytes, msg.cache_disk_bytes)
            self._delivery.settle(msg.token, msg.req_id, msg.nbytes, msg.samples)
            return
        self._counters["dropped_sends"] += 1
        self._delivery.fail(msg.token, msg.req_id, ErrorKind.UNDELIVERABLE, msg.why,
                            settles=False)

    def forget(self, token: bytes) -> None:
        """Tell every reader session ``token`` is freed (FORGET, so it drops the session's
        announced window); a reader that cannot take it now is skipped (a window is a hint,
        and one left behind is displaced by newer sessions')."""
        frames = encode_internal(Forget(token))
        for worker in self._pool:
            if worker.ready:
                try:
                    send_parts(self._backend, [worker.identity, *frames], NOBLOCK)
                except zmq.ZMQError:
                    log.debug("reader %s did not take FORGET", worker.identity.hex())

    def dispatch(self) -> None:
        """Hand queued requests, fairly over attached sessions, to readers with room, while
        the readers' unsent bytes allow (see the module docstring)."""
        while not self._unsent.full():
            worker = self._pool.least_loaded(self._unsent.of_reader)
            if worker is None:
                return
            task = self._ledger.next_request(self._unsent.blocked)
            if task is None:
                return
            try:
                send_parts(self._backend, [worker.identity, *encode_internal(task)], NOBLOCK)
            except zmq.ZMQError:
                # The reader is gone (its connection closed before the pool reaped it): the
                # task never reached it, so it goes back first in its queue for another
                # reader or the replacement, counted as an attempt as a reader death is.
                worker.ready = False
                if self._ledger.requeue(task):
                    self._counters["tasks_requeued"] += 1
                continue
            worker.tasks[(task.token, task.req_id)] = task

    def reap(self) -> None:
        """Replace dead readers; queue the requests they held again (or fail them, see the
        module docstring)."""
        for worker, code in self._pool.reap(respawn=True):
            self._unsent.drop_reader(worker.identity)
            self.cache_bytes.pop(worker.identity, None)
            for task in worker.tasks.values():
                if task.attempts + 1 < MAX_ATTEMPTS:
                    if self._ledger.requeue(task):
                        self._counters["tasks_requeued"] += 1
                    continue
                rows = task.ranges[:8].tolist()
                root = len(self._index.root)
                self._delivery.fail(
                    task.token, task.req_id, ErrorKind.WORKER_DIED,
                    f"{MAX_ATTEMPTS} reader processes exited while reading ranges {rows} of "
                    f"{[self._index.shards[r[0]][root:] for r in rows]} (the last one, pid "
                    f"{worker.process.pid}, with code {code})", settles=True)
