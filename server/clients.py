"""The frontend's handling of client messages: HELLO, REQUEST, HEARTBEAT, BYE, STATS.

Only a peer with a session gets more than a refusal: a REQUEST without one is refused from its
header alone (its ranges are never decoded), STATS without one gets UnknownClient, and HELLO
beyond ``--max-sessions``, or beyond ``--max-sessions-per-address`` from one peer address,
gets ServerBusy. A session is granted at most ``--max-window-samples`` samples of credits (its
credits x its request size, at least one credit). A REQUEST may name at most its session's
``max_samples`` samples (the HELLO's ``batch_size``, else ``--max-request-samples``), and each
sample at most once (no two ranges overlap: a plan never repeats a sample within a batch). A
session's requests go to readers only once a reader saw its data connection; one that attached
none within ``--session-start-timeout``, or sent no REQUEST within ``--session-idle-timeout``
of its HELLO, is freed and told why. A HELLO whose ``columns`` name a field the dataset does
not serve is refused, naming it; a session's columns go with each of its requests to the
readers. Every INDEX reply shares one buffer of the index JSON (a peer sending HELLOs without
reading the replies makes the server queue small headers, not copies of the index). Peer text
reaches the log only quoted (:func:`~dataflow.server.peerlog.quote`) and rate-limited.

The decisions are pure functions and objects this module only calls: what a HELLO and a
REQUEST's ranges may be (:mod:`~dataflow.server.admission`), a request's credits
(:mod:`~dataflow.server.ledger`) and when a session ends (:mod:`~dataflow.server.sessions`).

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import zmq

from dataflow import wire
from dataflow.errors import ProtocolError
from dataflow.index import DatasetIndex
from dataflow.server.admission import Refused, admit_hello, ahead_problem, range_problem
from dataflow.server.config import ServerConfig
from dataflow.server.delivery import Delivery
from dataflow.server.framing import SendResult, recv_bounded
from dataflow.server.guard import OLD_ZMTP, InboundGuard, address_of, message_fd
from dataflow.server.ledger import Ledger, Refusal
from dataflow.server.peerlog import RateLimitedLog, quote
from dataflow.server.sessions import Expiry, Session, Sessions, Timeouts
from dataflow.server.shmserve import prove, slot_problem
from dataflow.wire import ErrorKind
from dataflow.wire.internal import Task

log = logging.getLogger("dataflow.server")

MAX_CLIENT_FRAMES = 3
MAX_STATS_UNSENT = 4  # STATS replies to one session ZeroMQ may hold unwritten
EXPIRED = {Expiry.IDLE: "sessions_idle_expired", Expiry.UNATTACHED: "sessions_unattached_expired",
           Expiry.UNUSED: "sessions_unused_expired"}  # the STATS counter of each


def relative_index(index: DatasetIndex) -> DatasetIndex:
    """``index`` with shard names relative to its root and no hive root (what clients see:
    no server paths).

    The fingerprint is the same (it hashes names relative to the root already).
    """
    root = len(index.root)
    return dataclasses.replace(index, shards=tuple(s[root:] for s in index.shards),
                               read=dataclasses.replace(index.read, hive_root=""))


class ClientHandler:
    """Answers client messages on the client-facing ROUTER and expires dead clients.

    Args:
        config: the server's settings.
        index: the dataset served.
        sessions: all sessions.
        ledger: their credit accounts.
        delivery: sends to clients.
        counters: the frontend's STATS counters (updated in place).
        guard: the connection guard (told each message's size).
        peer_log: rate-limited log of what peers do wrong.
        server_info: ``() -> (workers, data endpoints)`` for INDEX replies.
        stats: ``() -> counters`` for STATS replies.
        read_notices: reads the readers' waiting notices (before a credit check).
    """

    def __init__(self, config: ServerConfig, index: DatasetIndex, sessions: Sessions,
                 ledger: Ledger, delivery: Delivery, counters: dict[str, int], *,
                 guard: InboundGuard, peer_log: RateLimitedLog,
                 server_info: Callable[[], tuple[int, Sequence[str]]],
                 stats: Callable[[], Mapping[str, int | list[int]]],
                 read_notices: Callable[[], None]) -> None:
        self._config = config
        self._index = relative_index(index)
        self._index_json = self._index.to_json()
        self._index_body = self._index_json.encode("utf-8")
        self._fields = [f.name for f in index.schema]
        self._sizes = np.asarray(index.sizes, dtype=np.int64)
        self._sessions = sessions
        self._ledger = ledger
        self._delivery = delivery
        self._counters = counters
        self._server_info = server_info
        self._stats = stats
        self._read_notices = read_notices
        self._guard = guard
        self._peer_log = peer_log
        self._timeouts = Timeouts(config.client_ttl, config.session_idle_timeout,
                                  config.session_start_timeout)

    def _unknown(self, identity: bytes, req_id: int, what: str) -> None:
        self._delivery.error(
            identity, req_id, ErrorKind.UNKNOWN_CLIENT,
            f"no session for this client ({what} before HELLO, or the session was freed: "
            f"{self._config.client_ttl} s of silence with the connection closed, "
            f"{self._config.session_idle_timeout} s of silence, or the server restarted); "
            "send HELLO first")

    def on_message(self, sock: zmq.Socket, now: float) -> None:
        """Receive and answer one client message.

        Raises:
            zmq.Again: no message is waiting.
        """
        inbound = recv_bounded(sock, 1 + MAX_CLIENT_FRAMES)
        frames = inbound.frames
        identity = frames[0].bytes
        fd = message_fd(frames[0])
        if fd is not None:
            self._guard.delivered(fd, inbound.nbytes, inbound.count)
        s = self._sessions.get(identity)
        try:
            if fd is None:
                raise ProtocolError(OLD_ZMTP)
            if inbound.extra:
                raise ProtocolError(f"message has more than {MAX_CLIENT_FRAMES} frames")
            if len(frames) < 2:
                raise ProtocolError("empty message")
            head = wire.parse_header(frames[1])
            if s is None and isinstance(head.msg, wire.Request):
                self._counters["refused"] += 1
                self._unknown(identity, head.msg.req_id, "REQUEST")
                return
            msg = head.message(frames[2:])
        except ProtocolError as e:
            self._counters["malformed"] += 1
            self._peer_log.warning("malformed message from %s: %s", identity.hex()[:64],
                                   quote(str(e), 400))
            self._delivery.error(identity, -1, ErrorKind.PROTOCOL, str(e))
            return
        if s is not None:
            s.last_seen = now
        if isinstance(msg, wire.Hello):
            self._on_hello(identity, s, msg, now, address_of(frames[0]))
        elif isinstance(msg, wire.Request):
            self._on_request(identity, s, msg)
        elif isinstance(msg, wire.Heartbeat):
            if s is None:
                self._unknown(identity, -1, "HEARTBEAT")
            else:
                self._delivery.reply(identity, wire.Heartbeat())
        elif isinstance(msg, wire.Bye):
            if s is not None:
                self._delivery.drop(s, "BYE")
        elif isinstance(msg, wire.Stats):
            if s is None:
                self._unknown(identity, -1, "STATS")
            else:
                self._on_stats(s)
        else:
            self._counters["malformed"] += 1
            self._delivery.error(identity, -1, ErrorKind.PROTOCOL,
                                 f"a server does not accept {wire.kind_of(msg).name} messages")

    def _on_stats(self, s: Session) -> None:
        """Answer STATS, or let it wait while ``MAX_STATS_UNSENT`` STATS replies to ``s`` are
        not written yet, and refuse one more meanwhile: a reply can be tens of KB
        (``skipped_per_shard``), and a peer that asks without reading must not make the server
        queue many. A client that waits for each reply is never refused: a reply it read is
        known written only once pyzmq's release thread marks its tracker, which can lag behind
        a busy frontend, so its next STATS may wait (:meth:`answer_waiting`), never fail."""
        if self._stats_room(s):
            self._send_stats(s)
        elif not s.stats_waiting:
            s.stats_waiting = True
        else:
            self._counters["refused"] += 1
            self._delivery.error(s.identity, -1, ErrorKind.PROTOCOL,
                                 f"STATS while {MAX_STATS_UNSENT} STATS replies wait unread "
                                 "and another STATS waits")

    def answer_waiting(self) -> None:
        """Answer the STATS that waited for earlier replies to be written (:meth:`_on_stats`)."""
        for s in self._sessions:
            if s.stats_waiting and self._stats_room(s):
                s.stats_waiting = False
                self._send_stats(s)

    @staticmethod
    def _stats_room(s: Session) -> bool:
        while s.stats_sent and s.stats_sent[0].done:
            s.stats_sent.popleft()
        return len(s.stats_sent) < MAX_STATS_UNSENT

    def _send_stats(self, s: Session) -> None:
        tracker = self._delivery.send_tracked(s.identity,
                                              wire.encode(wire.StatsReply(self._stats())))
        if tracker is None:
            self._counters["dropped_sends"] += 1
        else:
            s.stats_sent.append(tracker)

    def _on_hello(self, identity: bytes, s: Session | None, msg: wire.Hello,
                  now: float, address: str) -> None:
        outcome = admit_hello(msg, self._config, self._fields, renewing=s is not None,
                              sessions=len(self._sessions),
                              of_address=self._sessions.of_address(address))
        if isinstance(outcome, Refused):
            self._counters[outcome.counter] += 1
            self._peer_log.warning("HELLO from %s (%s, %s) refused: %s", identity.hex()[:64],
                                   quote(msg.client), quote(address), quote(outcome.message, 400))
            self._delivery.error(identity, -1, outcome.kind, outcome.message)
            return
        s = self._sessions.open(identity, msg.client, outcome.credits, now,
                                max_samples=outcome.max_samples, columns=msg.columns,
                                address=address)
        offer = msg.shm
        if offer is not None and any(o is not s and o.shm is not None and o.shm.name == offer.name
                                     for o in self._sessions):
            # One segment, one session: replies of two sessions written into the same slots
            # would overwrite each other's batches.
            self._peer_log.warning("client %s (%s) offered shared-memory segment %s, which "
                                   "another session uses: TCP frames", identity.hex()[:64],
                                   quote(msg.client), quote(offer.name))
            offer = None
        s.shm, proof = prove(offer, self._config.shared_memory, identity.hex()[:64])
        self._counters["shm_sessions"] += s.shm is not None
        self._ledger.open(s.token, outcome.credits, owner=identity, address=s.address)
        log.info("client %s (%s, %s) connected with %d credit(s), at most %d sample(s) a "
                 "request, columns %s", identity.hex()[:64], quote(msg.client),
                 quote(s.address), outcome.credits, s.max_samples,
                 "all" if msg.columns is None else quote(", ".join(msg.columns), 400))
        workers, endpoints = self._server_info()
        frames = wire.encode(wire.Index(outcome.credits, workers, self._index_json,
                                        s.token.decode(), tuple(endpoints),
                                        self._config.transform or "", proof,
                                        outcome.group, self._config.cache_plan_window))
        frames[-1] = self._index_body  # the same bytes, shared by every INDEX queued
        if self._delivery.send_frames(identity, frames) is not SendResult.OK:
            self._counters["dropped_sends"] += 1

    def _on_request(self, identity: bytes, s: Session | None, msg: wire.Request) -> None:
        if s is None:
            self._counters["refused"] += 1
            self._delivery.error(identity, msg.req_id, ErrorKind.UNKNOWN_CLIENT,
                                 "REQUEST before HELLO (or the session was freed): send HELLO "
                                 "first")
            return
        problem = range_problem(msg.ranges, self._sizes, self._index.shards, s.max_samples)
        if problem is None:
            problem = slot_problem(msg.slot, s.shm)
        if problem is None:
            problem = ahead_problem(msg.ahead, self._sizes, self._index.shards,
                                    self._config.cache_plan_window)
        if problem is None:
            if self._ledger.at_credits(s.token) or not s.attached:
                # A reader notifies us just before it hands a reply to ZeroMQ, and before it
                # answers a data connection's first HEARTBEAT, so the notice is normally here
                # before the client can react to the reply: read them.
                self._read_notices()
            outcome = self._ledger.admit(Task(s.token, msg.req_id, msg.ranges, msg.tag,
                                              s.columns, shm=s.shm if msg.slot >= 0 else None,
                                              slot=msg.slot, parts=msg.parts,
                                              ahead=msg.ahead))
            if isinstance(outcome, Refusal):
                problem = outcome.message
        if problem is not None:
            self._counters["refused"] += 1
            self._delivery.error(identity, msg.req_id, ErrorKind.PROTOCOL, problem)
            return
        self._delivery.latency.start(s.token, msg.req_id)
        s.requested = True
        self._counters["requests"] += 1
        if len(msg.ahead):
            self._counters["cache_announced"] += int((msg.ahead[:, 2] - msg.ahead[:, 1]).sum())

    def expire(self, now: float) -> None:
        """Free the sessions :meth:`~dataflow.server.sessions.Timeouts.due` says are over
        (telling them why), and those of clients silent for ``--client-ttl`` seconds whose
        connection is gone.

        Silence alone is not proof of death: a client's Python threads can be held up for
        seconds by things it does not control (a foreign finalizer run by the garbage
        collector on its I/O thread, a debugger, a long GIL-holding call) while its
        connection, kept by ZeroMQ's own threads and the kernel's TCP keepalive, is healthy. A
        silent client is probed with a HEARTBEAT (``ROUTER_MANDATORY``): GONE means its
        connection is closed, so its state is freed; a probe that is queued (or refused by a
        full queue) means it is alive, so it is probed again ``--client-ttl`` seconds later. A
        live client sends a HEARTBEAT every second, so only a peer that holds a session
        without using it reaches the idle timeout.
        """
        for s in self._sessions:
            due = self._timeouts.due(s, now)
            if due is Expiry.PROBE:
                if self._delivery.send(s.identity, wire.Heartbeat()) is SendResult.GONE:
                    self._counters["clients_expired"] += 1
                    self._delivery.drop(s, self._timeouts.why(due))
                else:
                    self._counters["clients_probed"] += 1
                    s.probed = now
            elif due is not None:
                why = self._timeouts.why(due)
                self._counters[EXPIRED[due]] += 1
                self._delivery.error(s.identity, -1, ErrorKind.UNKNOWN_CLIENT,
                                     f"session freed: {why}; send HELLO to start again")
                self._delivery.drop(s, why)

    def notify_stopping(self) -> None:
        """Tell every session the server is stopping (ERROR ServerStopping, ``req_id`` -1)."""
        for s in self._sessions:
            self._delivery.error(s.identity, -1, ErrorKind.SERVER_STOPPING,
                                 "the server is stopping; requests outstanding here will not "
                                 "be answered")
