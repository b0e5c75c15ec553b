"""Per-client state of a loader server: sessions, the replies parked for them, and when a
session is freed.

Credits are not here: :mod:`dataflow.server.ledger` owns them, keyed by the session token.
:meth:`Timeouts.due` decides, from a session's times alone, whether it is freed (and why) or
its connection probed; the frontend does the I/O.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dataflow.server.framing import SendResult
from dataflow.wire import MAX_BATCH_SIZE, ShmOffer


@dataclass(frozen=True)
class ParkedReply:
    """A message for a client that its full send queue refused; retried in order.

    Attributes:
        req_id: the request it answers (-1 for none).
        frames: the encoded message.
        nbytes: bytes of ``frames``.
        settles: handing it to ZeroMQ returns the request's credit (False when the credit came
            back already, e.g. an Undeliverable ERROR after the reader's SENT notice).
    """

    req_id: int
    frames: tuple[Any, ...]
    nbytes: int
    settles: bool


class Parked:
    """A client's messages that its full send queue refused (ZeroMQ's ``EAGAIN``), oldest
    first, retried in order: a new one never overtakes them. Pure: the caller passes the send.

    Attributes:
        nbytes: bytes held.
    """

    def __init__(self) -> None:
        self._replies: deque[ParkedReply] = deque()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._replies)

    def send(self, send: Callable[[tuple[Any, ...]], SendResult],
             reply: ParkedReply | None = None) -> tuple[list[ParkedReply], bool]:
        """Park ``reply`` (None: none new) behind the others, then hand them to ``send`` in
        order until it says FULL or GONE.

        Returns:
            The replies handed over, in order, and whether the client is gone (GONE).
        """
        if reply is not None:
            self._replies.append(reply)
            self.nbytes += reply.nbytes
        handed: list[ParkedReply] = []
        while self._replies:
            result = send(self._replies[0].frames)
            if result is not SendResult.OK:
                return handed, result is SendResult.GONE
            handed.append(self._replies.popleft())
            self.nbytes -= handed[-1].nbytes
        return handed, False

    def clear(self) -> int:
        """Drop every parked reply; returns how many there were."""
        dropped = len(self._replies)
        self._replies.clear()
        self.nbytes = 0
        return dropped


@dataclass(eq=False)
class Session:
    """One connected client.

    Attributes:
        identity: the client's ZeroMQ routing id at the frontend.
        name: its self-description (for logs).
        credits: credits granted.
        last_seen: time of its last message (the caller's clock, seconds).
        max_samples: most samples one of its REQUESTs may name.
        columns: the fields its batches keep (its HELLO's ``columns``), or None: all.
        address: the peer address of its connection (:func:`~dataflow.server.guard.address_of`).
        opened: when its first HELLO came.
        attached: whether a reader saw its data connection.
        requested: whether it sent a REQUEST that was admitted.
        probed: when the server last probed its connection (it had been silent).
        stats_sent: trackers (``zmq.MessageTracker``) of the STATS replies sent to it, oldest
            first (those known written are dropped as STATS come).
        stats_waiting: a STATS of it waits until fewer of its STATS replies are unwritten.
        token: session token (32 ASCII hex bytes): the routing id of the client's data
            connections to the readers, and the key of its credit account.
        parked: replies refused by the client's full send queue.
        shm: the shared-memory segment its last HELLO offered and this server proved it can
            open (its REQUESTs may lend slots of it), or None.
    """

    identity: bytes
    name: str
    credits: int
    last_seen: float
    max_samples: int = MAX_BATCH_SIZE
    columns: tuple[str, ...] | None = None
    address: str = ""
    opened: float = 0.0
    attached: bool = False
    requested: bool = False
    probed: float = float("-inf")
    stats_sent: deque[Any] = field(default_factory=deque)
    stats_waiting: bool = False
    token: bytes = field(default_factory=lambda: secrets.token_hex(16).encode())
    parked: Parked = field(default_factory=Parked)
    shm: ShmOffer | None = None


class Expiry(Enum):
    """What :meth:`Timeouts.due` decided for a session."""

    IDLE = "idle"  # nothing received for the idle timeout
    UNATTACHED = "unattached"  # no data connection within the start timeout
    UNUSED = "unused"  # no REQUEST within the idle timeout of its HELLO
    PROBE = "probe"  # silent past the ttl: probe its connection (freed if it is gone)


@dataclass(frozen=True)
class Timeouts:
    """When a session ends (the server's flags, seconds).

    Attributes:
        ttl: ``--client-ttl``: silence after which the connection is probed.
        idle: ``--session-idle-timeout``: silence, or time without a REQUEST since the HELLO,
            after which the session is freed.
        start: ``--session-start-timeout``: time after the HELLO by which a data connection
            must be attached.
    """

    ttl: float
    idle: float
    start: float

    def due(self, s: Session, now: float) -> Expiry | None:
        """Whether session ``s`` is freed at ``now`` (and why), its connection is due a probe,
        or neither (None). Pure.

        Args:
            s: the session.
            now: the time, on the clock of ``s``'s times (seconds).
        """
        if now - s.last_seen > self.idle:
            return Expiry.IDLE
        if not s.attached and now - s.opened > self.start:
            return Expiry.UNATTACHED
        if not s.requested and now - s.opened > self.idle:
            return Expiry.UNUSED
        if now - s.last_seen > self.ttl and now - s.probed > self.ttl:
            return Expiry.PROBE
        return None

    def why(self, due: Expiry) -> str:
        """Why a session is freed for ``due`` (a probe: because it found the connection
        gone), in words for the log and the client."""
        return {
            Expiry.IDLE: f"nothing received for {self.idle} s (--session-idle-timeout)",
            Expiry.UNATTACHED: f"no data connection to a reader within {self.start} s of its "
                               "HELLO (--session-start-timeout)",
            Expiry.UNUSED: f"no REQUEST within {self.idle} s of its HELLO "
                           "(--session-idle-timeout)",
            Expiry.PROBE: f"silent for more than {self.ttl} s and disconnected",
        }[due]


class Sessions:
    """All sessions, by routing id and by token, and how many each peer address holds."""

    def __init__(self) -> None:
        self._by_identity: dict[bytes, Session] = {}
        self._by_token: dict[bytes, Session] = {}
        self._per_address: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_identity)

    def __iter__(self) -> Iterator[Session]:
        """A snapshot of the sessions (safe to close sessions while iterating)."""
        return iter(list(self._by_identity.values()))

    def get(self, identity: bytes) -> Session | None:
        return self._by_identity.get(identity)

    def by_token(self, token: bytes) -> Session | None:
        return self._by_token.get(token)

    def of_address(self, address: str) -> int:
        """Sessions open from peer ``address``."""
        return self._per_address.get(address, 0)

    def open(self, identity: bytes, name: str, credits: int, now: float,
             max_samples: int = MAX_BATCH_SIZE,
             columns: tuple[str, ...] | None = None, address: str = "") -> Session:
        """The session of ``identity``: a new one (from peer ``address``), or the open one
        with its settings renewed.

        A HELLO on a connection that has a session keeps that session (its token, address,
        and when it was opened); requests admitted before it keep the columns they were
        admitted with.
        """
        s = self._by_identity.get(identity)
        if s is None:
            s = Session(identity, name, credits, now, address=address, opened=now)
            self._by_identity[identity] = s
            self._by_token[s.token] = s
            self._per_address[address] = self._per_address.get(address, 0) + 1
        s.name, s.credits, s.last_seen, s.max_samples = name, credits, now, max_samples
        s.columns = columns
        return s

    def close(self, s: Session) -> None:
        """Forget ``s`` (no-op if it is closed already)."""
        if self._by_identity.get(s.identity) is s:
            del self._by_identity[s.identity]
            del self._by_token[s.token]
            left = self._per_address[s.address] - 1
            if left:
                self._per_address[s.address] = left
            else:
                del self._per_address[s.address]

    def parked(self) -> int:
        return sum(len(s.parked) for s in self._by_identity.values())

    def parked_bytes(self) -> int:
        return sum(s.parked.nbytes for s in self._by_identity.values())
