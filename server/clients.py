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
from dataflow.server.config import ServerConfig
from dataflow.server.delivery import Delivery
from dataflow.server.framing import SendResult, recv_bounded
from dataflow.server.guard import OLD_ZMTP, InboundGuard, address_of, message_fd
from dataflow.server.ledger import Ledger, Refusal
from dataflow.server.peerlog import RateLimitedLog, quote
from dataflow.server.sessions import Expiry, Session, Sessions, expiry
from dataflow.subset import unmatched
from dataflow.wire import ErrorKind
from dataflow.wire.internal import Task

log = logging.getLogger("dataflow.server")

MAX_CLIENT_FRAMES = 3
MAX_STATS_UNSENT = 4  # STATS replies to one session ZeroMQ may hold unwritten


def relative_index(index: DatasetIndex) -> DatasetIndex:
    """``index`` with shard names relative to its root and no hive root (what clients see:
    no server paths).

    The fingerprint is the same (it hashes names relative to the root already).
    """
    root = len(index.root)
    return dataclasses.replace(index, shards=tuple(s[root:] for s in index.shards),
                               read=dataclasses.replace(index.read, hive_root=""))


def range_problem(ranges: np.ndarray, sizes: np.ndarray, shards: Sequence[str],
                  max_samples: int) -> str | None:
    """Why ``ranges`` (int64, (n, 3) ``(shard, start, stop)`` rows) is not a valid request of
    at most ``max_samples`` samples of shards ``shards`` of ``sizes`` samples, or None. Pure.

    Each sample may be named once: no two ranges overlap (ranges that meet are fine). A plan
    never names a sample twice in a batch, even padded (``drop_last=False`` repeats samples
    only in other ranks' batches); a request that does would make the readers read and send
    the same data any number of times.
    """
    if len(ranges) > max_samples:
        return (f"request of {len(ranges)} ranges exceeds this session's "
                f"{max_samples} samples a request")
    shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    bad_shard = (shard < 0) | (shard >= len(sizes))
    if bad_shard.any():
        i = int(np.flatnonzero(bad_shard)[0])
        return f"range {i}: shard {int(shard[i])} not in [0, {len(sizes)})"
    size = sizes[shard]
    bad = (start < 0) | (stop <= start) | (stop > size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return (f"range {i}: [{int(start[i])}, {int(stop[i])}) is empty or outside shard "
                f"{shards[int(shard[i])]} of {int(size[i])} samples")
    total = int((stop - start).sum())
    if total > max_samples:
        return (f"request of {total} samples exceeds this session's {max_samples} samples "
                "a request (its HELLO `batch_size`, else --max-request-samples)")
    order = np.lexsort((start, shard))
    overlap = (shard[order][1:] == shard[order][:-1]) & (start[order][1:] < stop[order][:-1])
    if overlap.any():
        k = int(np.flatnonzero(overlap)[0])
        i, j = sorted((int(order[k]), int(order[k + 1])))
        return (f"ranges {i} [{int(start[i])}, {int(stop[i])}) and {j} [{int(start[j])}, "
                f"{int(stop[j])}) of shard {shards[int(shard[i])]} overlap: a request names "
                "each sample at most once")
    return None


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
        self._expired = {
            Expiry.IDLE: ("sessions_idle_expired", f"nothing received for "
                          f"{config.session_idle_timeout} s (--session-idle-timeout)"),
            Expiry.UNATTACHED: ("sessions_unattached_expired", "no data connection to a reader "
                                f"within {config.session_start_timeout} s of its HELLO "
                                "(--session-start-timeout)"),
            Expiry.UNUSED: ("sessions_unused_expired", "no REQUEST within "
                            f"{config.session_idle_timeout} s of its HELLO "
                            "(--session-idle-timeout)"),
        }

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
        """Answer STATS, unless ``MAX_STATS_UNSENT`` STATS replies to ``s`` are not written
        yet: a reply can be tens of KB (``skipped_per_shard``), and a peer that asks without
        reading must not make the server queue many. (A client that waits for each reply has
        at most one unwritten: its tracker is marked by pyzmq's release thread a moment after
        ZeroMQ let go of it.)"""
        while s.stats_sent and s.stats_sent[0].done:
            s.stats_sent.popleft()
        if len(s.stats_sent) >= MAX_STATS_UNSENT:
            self._counters["refused"] += 1
            self._delivery.error(s.identity, -1, ErrorKind.PROTOCOL,
                                 f"STATS while {MAX_STATS_UNSENT} STATS replies wait unread")
            return
        tracker = self._delivery.send_tracked(s.identity,
                                              wire.encode(wire.StatsReply(self._stats())))
        if tracker is None:
            self._counters["dropped_sends"] += 1
        else:
            s.stats_sent.append(tracker)

    def _hello_problem(self, msg: wire.Hello) -> str | None:
        """Why HELLO ``msg`` is refused (counted as a refused request), or None."""
        cap = self._config.max_request_samples
        if msg.batch_size is not None and msg.batch_size > cap:
            return (f"HELLO `batch_size` {msg.batch_size} exceeds this server's "
                    f"--max-request-samples {cap}")
        unknown = unmatched(msg.columns or (), self._fields)
        if unknown:
            return (f"HELLO `columns` names field(s) {unknown} this server does not serve; it "
                    f"serves {self._fields}")
        return None

    def _busy(self, address: str) -> str | None:
        """Why a new session of ``address`` is refused as busy, or None."""
        if len(self._sessions) >= self._config.max_sessions:
            self._counters["sessions_refused"] += 1
            return (f"this server holds its maximum of {len(self._sessions)} sessions "
                    "(--max-sessions); use another server or retry later")
        held = self._sessions.of_address(address)
        if held >= self._config.address_sessions:
            self._counters["address_sessions_refused"] += 1
            return (f"this server holds {held} sessions of this client's address, the most one "
                    "address may (--max-sessions-per-address); use another server or retry "
                    "later")
        return None

    def _on_hello(self, identity: bytes, s: Session | None, msg: wire.Hello,
                  now: float, address: str) -> None:
        problem = self._hello_problem(msg)
        if problem is not None:
            self._counters["refused"] += 1
            self._peer_log.warning("HELLO from %s (%s) refused: %s", identity.hex()[:64],
                                   quote(msg.client), quote(problem, 400))
            self._delivery.error(identity, -1, ErrorKind.PROTOCOL, problem)
            return
        busy = None if s is not None else self._busy(address)
        if busy is not None:
            self._peer_log.warning("HELLO from %s (%s, %s) refused: %s", identity.hex()[:64],
                                   quote(msg.client), quote(address), busy)
            self._delivery.error(identity, -1, ErrorKind.SERVER_BUSY, busy)
            return
        max_samples = msg.batch_size or self._config.max_request_samples
        credits = min(msg.credits, self._config.max_credits,
                      max(1, self._config.max_window_samples // max_samples))
        s = self._sessions.open(identity, msg.client, credits, now, max_samples=max_samples,
                                columns=msg.columns, address=address)
        self._ledger.open(s.token, credits, owner=identity, address=s.address)
        log.info("client %s (%s, %s) connected with %d credit(s), at most %d sample(s) a "
                 "request, columns %s", identity.hex()[:64], quote(msg.client),
                 quote(s.address), credits, s.max_samples,
                 "all" if msg.columns is None else quote(", ".join(msg.columns), 400))
        workers, endpoints = self._server_info()
        frames = wire.encode(wire.Index(credits, workers, self._index_json, s.token.decode(),
                                        tuple(endpoints), self._config.transform or ""))
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
            if self._ledger.at_credits(s.token) or not s.attached:
                # A reader notifies us just before it hands a reply to ZeroMQ, and before it
                # answers a data connection's first HEARTBEAT, so the notice is normally here
                # before the client can react to the reply: read them.
                self._read_notices()
            outcome = self._ledger.admit(Task(s.token, msg.req_id, msg.ranges, msg.tag,
                                              s.columns))
            if isinstance(outcome, Refusal):
                problem = outcome.message
        if problem is not None:
            self._counters["refused"] += 1
            self._delivery.error(identity, msg.req_id, ErrorKind.PROTOCOL, problem)
            return
        s.requested = True
        self._counters["requests"] += 1

    def expire(self, now: float) -> None:
        """Free the sessions :func:`~dataflow.server.sessions.expiry` says are over (telling
        them why), and those of clients silent for ``--client-ttl`` seconds whose connection
        is gone.

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
        ttl = self._config.client_ttl
        for s in self._sessions:
            due = expiry(s, now, ttl=ttl, idle=self._config.session_idle_timeout,
                         start=self._config.session_start_timeout)
            if due is Expiry.PROBE:
                if self._delivery.send(s.identity, wire.Heartbeat()) is SendResult.GONE:
                    self._counters["clients_expired"] += 1
                    self._delivery.drop(s, f"silent for more than {ttl} s and disconnected")
                else:
                    self._counters["clients_probed"] += 1
                    s.probed = now
            elif due is not None:
                counter, why = self._expired[due]
                self._counters[counter] += 1
                self._delivery.error(s.identity, -1, ErrorKind.UNKNOWN_CLIENT,
                                     f"session freed: {why}; send HELLO to start again")
                self._delivery.drop(s, why)

    def notify_stopping(self) -> None:
        """Tell every session the server is stopping (ERROR ServerStopping, ``req_id`` -1)."""
        for s in self._sessions:
            self._delivery.error(s.identity, -1, ErrorKind.SERVER_STOPPING,
                                 "the server is stopping; requests outstanding here will not "
                                 "be answered")
