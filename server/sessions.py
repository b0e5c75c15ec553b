"""Per-client state of a loader server and fair round-robin over clients.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Session:
    """One connected client.

    Attributes:
        identity: the client's ZeroMQ routing id.
        token: session token (32 ASCII hex bytes), the routing id of the client's data
            connections to the readers.
        credits: requests it may keep outstanding.
        name: its self-description (for logs).
        last_seen: ``time.monotonic()`` of its last message.
        queued: accepted requests waiting for a worker: ``(req_id, ranges bytes)``.
        outstanding: accepted requests whose reply has not been handed to ZeroMQ yet.
        active: ids of the outstanding requests.
        pending: ``(req_id, frames, nbytes, credit)`` replies refused by the client's full send
            queue, retried later.
        pending_bytes: bytes held in ``pending``.
    """

    identity: bytes
    credits: int
    name: str
    last_seen: float
    token: bytes = field(default_factory=lambda: secrets.token_hex(16).encode())
    queued: deque[tuple[int, bytes]] = field(default_factory=deque)
    outstanding: int = 0
    active: set[int] = field(default_factory=set)
    pending: deque[tuple[int, list, int, bool]] = field(default_factory=deque)
    pending_bytes: int = 0


class Sessions:
    """All sessions plus the round-robin order of those with queued requests."""

    def __init__(self) -> None:
        self._by_id: dict[bytes, Session] = {}
        self._turns: deque[bytes] = deque()

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        """A snapshot of the sessions (safe to close sessions while iterating)."""
        return iter(list(self._by_id.values()))

    def get(self, identity: bytes) -> Session | None:
        return self._by_id.get(identity)

    def open(self, identity: bytes, credits: int, name: str, now: float) -> Session:
        """Create the session of ``identity`` or update its credits."""
        s = self._by_id.get(identity)
        if s is None:
            s = self._by_id[identity] = Session(identity, credits, name, now)
        s.credits, s.name, s.last_seen = credits, name, now
        return s

    def close(self, identity: bytes) -> Session | None:
        """Forget ``identity``; returns its session (its queued work is dropped)."""
        return self._by_id.pop(identity, None)

    def enqueue(self, s: Session, req_id: int, ranges: bytes) -> None:
        if not s.queued:
            self._turns.append(s.identity)
        s.queued.append((req_id, ranges))
        s.outstanding += 1

    def next_request(self) -> tuple[Session, int, bytes] | None:
        """The next request to dispatch, one per client in turn."""
        while self._turns:
            identity = self._turns.popleft()
            s = self._by_id.get(identity)
            if s is None or not s.queued:
                continue
            req_id, ranges = s.queued.popleft()
            if s.queued:
                self._turns.append(identity)
            return s, req_id, ranges
        return None

    def queued(self) -> int:
        return sum(len(s.queued) for s in self._by_id.values())

    def pending_bytes(self) -> int:
        return sum(s.pending_bytes for s in self._by_id.values())

    def pending_sends(self) -> int:
        return sum(len(s.pending) for s in self._by_id.values())
