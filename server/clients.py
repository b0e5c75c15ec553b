"""The frontend's handling of client messages: HELLO, REQUEST, HEARTBEAT, BYE, STATS.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

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
from dataflow.server.ledger import Ledger, Refusal
from dataflow.server.sessions import Session, Sessions
from dataflow.wire import ErrorKind

log = logging.getLogger("dataflow.server")

MAX_CLIENT_FRAMES = 3
MAX_BATCH_SAMPLES = 1 << 22


class ClientHandler:
    """Answers client messages on the client-facing ROUTER and expires dead clients.

    Args:
        config: the server's settings.
        index: the dataset served.
        sessions: all sessions.
        ledger: their credit accounts.
        delivery: sends to clients.
        counters: the frontend's STATS counters (updated in place).
        server_info: ``() -> (workers, data endpoints)`` for INDEX replies.
        stats: ``() -> counters`` for STATS replies.
        read_notices: reads the readers' waiting notices (before a credit check).
    """

    def __init__(self, config: ServerConfig, index: DatasetIndex, sessions: Sessions,
                 ledger: Ledger, delivery: Delivery, counters: dict[str, int], *,
                 server_info: Callable[[], tuple[int, Sequence[str]]],
                 stats: Callable[[], Mapping[str, int | list[int]]],
                 read_notices: Callable[[], None]) -> None:
        self._config = config
        self._index = index
        self._index_json = index.to_json()
        self._sizes = np.asarray(index.sizes, dtype=np.int64)
        self._sessions = sessions
        self._ledger = ledger
        self._delivery = delivery
        self._counters = counters
        self._server_info = server_info
        self._stats = stats
        self._read_notices = read_notices

    def on_message(self, sock: zmq.Socket, now: float) -> None:
        """Receive and answer one client message.

        Raises:
            zmq.Again: no message is waiting.
        """
        frames, extra = recv_bounded(sock, 1 + MAX_CLIENT_FRAMES)
        identity = frames[0].bytes
        try:
            if extra:
                raise ProtocolError(f"message has more than {MAX_CLIENT_FRAMES} frames")
            msg = wire.decode(frames[1:])
        except ProtocolError as e:
            self._counters["malformed"] += 1
            log.warning("malformed message from %s: %s", identity.hex(), e)
            self._delivery.error(identity, -1, ErrorKind.PROTOCOL, str(e))
            return
        s = self._sessions.get(identity)
        if s is not None:
            s.last_seen = now
        if isinstance(msg, wire.Hello):
            self._on_hello(identity, msg, now)
        elif isinstance(msg, wire.Request):
            self._on_request(identity, s, msg)
        elif isinstance(msg, wire.Heartbeat):
            if s is None:
                self._delivery.error(
                    identity, -1, ErrorKind.UNKNOWN_CLIENT,
                    "no session for this client (its connection was closed after "
                    f"{self._config.client_ttl} s of silence, or the server restarted)")
            else:
                self._delivery.reply(identity, wire.Heartbeat())
        elif isinstance(msg, wire.Bye):
            if s is not None:
                self._delivery.drop(s, "BYE")
        elif isinstance(msg, wire.Stats):
            self._delivery.reply(identity, wire.StatsReply(self._stats()))
        else:
            self._counters["malformed"] += 1
            self._delivery.error(identity, -1, ErrorKind.PROTOCOL,
                                 f"a server does not accept {wire.kind_of(msg).name} messages")

    def _on_hello(self, identity: bytes, msg: wire.Hello, now: float) -> None:
        credits = min(msg.credits, self._config.max_credits)
        s = self._sessions.open(identity, msg.client, credits, now)
        self._ledger.open(s.token, credits)
        log.info("client %s (%s) connected with %d credit(s)", identity.hex(), msg.client,
                 credits)
        workers, endpoints = self._server_info()
        self._delivery.reply(identity, wire.Index(credits, workers, self._index_json,
                                                  s.token.decode(), tuple(endpoints)))

    def _on_request(self, identity: bytes, s: Session | None, msg: wire.Request) -> None:
        if s is None:
            self._counters["refused"] += 1
            self._delivery.error(identity, msg.req_id, ErrorKind.UNKNOWN_CLIENT,
                                 "REQUEST before HELLO (or the session was freed): send HELLO "
                                 "first")
            return
        problem = self.check_ranges(msg.ranges)
        if problem is None:
            if self._ledger.at_credits(s.token):
                # A reader notifies us just before it hands a reply to ZeroMQ, so the notice
                # is normally here before the client can react to the reply: read them.
                self._read_notices()
            outcome = self._ledger.admit(s.token, msg.req_id, msg.ranges)
            if isinstance(outcome, Refusal):
                problem = outcome.message
        if problem is not None:
            self._counters["refused"] += 1
            self._delivery.error(identity, msg.req_id, ErrorKind.PROTOCOL, problem)
            return
        self._counters["requests"] += 1

    def check_ranges(self, ranges: np.ndarray) -> str | None:
        """Why ``ranges`` (int64, (n, 3)) is not a valid request, or None."""
        shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
        bad_shard = (shard < 0) | (shard >= len(self._sizes))
        if bad_shard.any():
            i = int(np.flatnonzero(bad_shard)[0])
            return f"range {i}: shard {int(shard[i])} not in [0, {len(self._sizes)})"
        size = self._sizes[shard]
        bad = (start < 0) | (stop <= start) | (stop > size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (f"range {i}: [{int(start[i])}, {int(stop[i])}) is empty or outside shard "
                    f"{self._index.shards[int(shard[i])]} of {int(size[i])} samples")
        total = int((stop - start).sum())
        if total > MAX_BATCH_SAMPLES:
            return f"request of {total} samples exceeds {MAX_BATCH_SAMPLES}"
        return None

    def expire(self, now: float) -> None:
        """Free the sessions of clients that are silent *and* whose connection is gone.

        Silence alone is not proof of death: a client's Python threads can be held up for
        seconds by things it does not control (a foreign finalizer run by the garbage
        collector on its I/O thread, a debugger, a long GIL-holding call) while its
        connection, kept by ZeroMQ's own threads and ZMTP heartbeats, is healthy. A silent
        client is probed with a HEARTBEAT (``ROUTER_MANDATORY``): GONE means its connection is
        closed, so its state is freed; a probe that is queued (or refused by a full queue)
        means it is alive, so its silence clock restarts.
        """
        for s in self._sessions:
            if now - s.last_seen <= self._config.client_ttl:
                continue
            if self._delivery.send(s.identity, wire.Heartbeat()) is SendResult.GONE:
                self._counters["clients_expired"] += 1
                self._delivery.drop(s, f"silent for more than {self._config.client_ttl} s and "
                                       "disconnected")
            else:
                self._counters["clients_probed"] += 1
                s.last_seen = now
