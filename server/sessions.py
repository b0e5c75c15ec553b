"""Per-client state of a loader server: sessions and the replies parked for them.

Credits are not here: :mod:`dataflow.server.ledger` owns them, keyed by the session token.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dataflow.wire import MAX_BATCH_SIZE


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
        probed: when the server last probed its connection (it had been silent).
        token: session token (32 ASCII hex bytes): the routing id of the client's data
            connections to the readers, and the key of its credit account.
        parked: replies refused by the client's full send queue, oldest first.
        parked_bytes: bytes held in ``parked``.
    """

    identity: bytes
    name: str
    credits: int
    last_seen: float
    max_samples: int = MAX_BATCH_SIZE
    columns: tuple[str, ...] | None = None
    probed: float = float("-inf")
    token: bytes = field(default_factory=lambda: secrets.token_hex(16).encode())
    parked: deque[ParkedReply] = field(default_factory=deque)
    parked_bytes: int = 0

    def park(self, reply: ParkedReply) -> None:
        self.parked.append(reply)
        self.parked_bytes += reply.nbytes

    def unpark(self) -> ParkedReply:
        """Remove and return the oldest parked reply (it was handed to ZeroMQ)."""
        reply = self.parked.popleft()
        self.parked_bytes -= reply.nbytes
        return reply


class Sessions:
    """All sessions, by routing id and by token."""

    def __init__(self) -> None:
        self._by_identity: dict[bytes, Session] = {}
        self._by_token: dict[bytes, Session] = {}

    def __len__(self) -> int:
        return len(self._by_identity)

    def __iter__(self) -> Iterator[Session]:
        """A snapshot of the sessions (safe to close sessions while iterating)."""
        return iter(list(self._by_identity.values()))

    def get(self, identity: bytes) -> Session | None:
        return self._by_identity.get(identity)

    def by_token(self, token: bytes) -> Session | None:
        return self._by_token.get(token)

    def open(self, identity: bytes, name: str, credits: int, now: float,
             max_samples: int = MAX_BATCH_SIZE,
             columns: tuple[str, ...] | None = None) -> Session:
        """The session of ``identity``: a new one, or the open one with its settings renewed.

        A HELLO on a connection that has a session keeps that session (and its token);
        requests admitted before it keep the columns they were admitted with.
        """
        s = self._by_identity.get(identity)
        if s is None:
            s = Session(identity, name, credits, now)
            self._by_identity[identity] = s
            self._by_token[s.token] = s
        s.name, s.credits, s.last_seen, s.max_samples = name, credits, now, max_samples
        s.columns = columns
        return s

    def close(self, s: Session) -> None:
        """Forget ``s`` (no-op if it is closed already)."""
        if self._by_identity.get(s.identity) is s:
            del self._by_identity[s.identity]
            del self._by_token[s.token]

    def parked(self) -> int:
        return sum(len(s.parked) for s in self._by_identity.values())

    def parked_bytes(self) -> int:
        return sum(s.parked_bytes for s in self._by_identity.values())
