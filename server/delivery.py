"""Sending to clients over the frontend's client-facing ROUTER, never blocking on one client.

The ROUTER has ``ROUTER_MANDATORY``: a full peer queue or a gone peer is reported instead of
the message silently dropped. A message that settles a request (an ERROR the frontend makes in
place of a reply) waits in its session's parked replies when the client's queue is full, and
is retried in order; small control messages (INDEX, HEARTBEAT, STATS_REPLY, refusals) are
dropped and counted instead.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from dataflow import wire
from dataflow.server.framing import MAX_ERROR_TEXT, SendResult, try_send, try_send_tracked
from dataflow.server.latency import Latency
from dataflow.server.ledger import Ledger
from dataflow.server.peerlog import quote
from dataflow.server.sessions import ParkedReply, Session, Sessions

log = logging.getLogger("dataflow.server")


class Delivery:
    """The frontend's sends to clients, and the end of a session.

    Args:
        router: the client-facing ROUTER.
        sessions: all sessions.
        ledger: their credit accounts.
        counters: the frontend's STATS counters (updated in place).

    Attributes:
        latency: how long each admitted request took until its reply was handed over.
    """

    def __init__(self, router: zmq.Socket, sessions: Sessions, ledger: Ledger,
                 counters: dict[str, int]) -> None:
        self._router = router
        self._sessions = sessions
        self._ledger = ledger
        self._counters = counters
        self.latency = Latency(time.monotonic)
        self.on_drop: Callable[[bytes], None] | None = None

    def send(self, identity: bytes, msg: wire.Message) -> SendResult:
        """Send a message without blocking or parking it."""
        return self.send_frames(identity, wire.encode(msg))

    def send_frames(self, identity: bytes, frames: list) -> SendResult:
        """Send an encoded message without blocking or parking it."""
        return try_send(self._router, identity, frames)

    def send_tracked(self, identity: bytes, frames: list) -> zmq.MessageTracker | None:
        """Send an encoded message without blocking or parking it; a tracker that tells when
        ZeroMQ let go of it, or None when it was not handed over."""
        return try_send_tracked(self._router, identity, frames)

    def reply(self, identity: bytes, msg: wire.Message) -> None:
        """Send a small control message; dropped (and counted) if the client cannot take it."""
        if self.send(identity, msg) is not SendResult.OK:
            self._counters["dropped_sends"] += 1

    def error(self, identity: bytes, req_id: int, kind: wire.ErrorKind, message: str) -> None:
        """Send an ERROR (its text cut to ``MAX_ERROR_TEXT``) like :meth:`reply`."""
        self.reply(identity, wire.ErrorMsg(req_id, kind, message[:MAX_ERROR_TEXT]))

    def fail(self, token: bytes, req_id: int, kind: wire.ErrorKind, message: str, *,
             settles: bool) -> None:
        """Answer request ``req_id`` of session ``token`` with an ERROR (if it is open)."""
        s = self._sessions.by_token(token)
        if s is None:
            return
        frames = tuple(wire.encode(wire.ErrorMsg(req_id, kind, message)))
        self._send_parked(s, ParkedReply(req_id, frames, sum(len(f) for f in frames), settles))

    def retry(self) -> None:
        """Retry every session's parked replies in order."""
        for s in self._sessions:
            if s.parked:
                self._send_parked(s)

    def _send_parked(self, s: Session, reply: ParkedReply | None = None) -> None:
        """Hand ``s`` its parked replies, then ``reply``, in order, while its queue takes them
        (:meth:`~dataflow.server.sessions.Parked.send`); a gone client's session is freed."""
        handed, gone = s.parked.send(lambda frames: try_send(self._router, s.identity, frames),
                                     reply)
        for r in handed:
            if r.settles:
                self.settle(s.token, r.req_id, r.nbytes)
        if gone:
            self.drop(s, "gone")

    def settle(self, token: bytes, req_id: int, nbytes: int, samples: int = 0) -> None:
        """The reply (``nbytes``, ``samples`` in its batch) to request ``req_id`` of session
        ``token`` was handed over."""
        if token not in self._ledger:
            self._ledger.settle(token, req_id)  # a closed session's: its connection is freed
            self._counters["dropped_sends"] += 1
        elif self._ledger.settle(token, req_id):
            self.latency.finish(token, req_id)
            self._counters["replies"] += 1
            self._counters["bytes_sent"] += nbytes
            self._counters["samples_sent"] += samples
        else:
            self._counters["stale_notices"] += 1

    def drop(self, s: Session, why: str) -> None:
        """Free session ``s``: its account, queued requests and parked replies (and tell
        :attr:`on_drop` its token, if set)."""
        self._sessions.close(s)
        if self.on_drop is not None:
            self.on_drop(s.token)
        self.latency.forget(s.token)
        queued = self._ledger.close(s.token)
        parked = s.parked.clear()
        self._counters["dropped_sends"] += parked
        log.info("client %s (%s): session freed (%s); %d queued request(s) and %d reply(ies) "
                 "dropped", s.identity.hex()[:64], quote(s.name), why, queued, parked)
