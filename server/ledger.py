"""Credits of a loader server's sessions: the one owner of "how many requests are out".

Pure bookkeeping: no sockets, no clock. Each session (keyed by its session token, never by a
ZeroMQ routing id) has an account: credits granted, the ids of its outstanding requests
(accepted, and whose reply was not handed to ZeroMQ yet) and its queue of requests waiting for
a reader. Requests are dispatched round-robin over the accounts with queued requests, one per
account in turn.

Rule: a client may have up to ``CREDIT_SLACK x credits`` requests outstanding. A reader sends
its SENT notice (which settles a request) on the frontend's connection just before it hands
the reply to the client's data connection; the two travel on different connections, so a
client that keeps to its credits can still look over them for a moment. Beyond that a request
is refused. Per client, replies held in a reader's send queue are therefore at most
``CREDIT_SLACK x credits``.

Settling an id that has nothing outstanding is not an error: it happens when the session was
closed (BYE, expiry) before the reader's notice came, or when a reader's notice comes after
its death already failed the request. :meth:`Ledger.settle` returns False then; the caller
counts it.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from dataflow.errors import InternalError

CREDIT_SLACK = 2


class RefusalReason(Enum):
    """Why :meth:`Ledger.admit` refused a request."""

    OVER_CREDITS = "over credits"
    DUPLICATE_ID = "duplicate request id"


@dataclass(frozen=True)
class Admitted:
    """The request is queued; ``outstanding`` counts it."""

    outstanding: int


@dataclass(frozen=True)
class Refusal:
    """The request is refused; ``message`` says why in words for the client."""

    reason: RefusalReason
    message: str


@dataclass(frozen=True)
class Dispatch:
    """The next request to hand to a reader.

    Attributes:
        key: the session's token.
        req_id: the request's id.
        ranges: int64 (n, 3) ``(shard, start, stop)`` rows.
    """

    key: bytes
    req_id: int
    ranges: np.ndarray


@dataclass(eq=False)
class _Account:
    key: bytes
    credits: int
    active: set[int] = field(default_factory=set)
    queued: deque[tuple[int, np.ndarray]] = field(default_factory=deque)
    closed: bool = False


class Ledger:
    """Credit accounts of all sessions, and fair round-robin dispatch over them."""

    def __init__(self, slack: int = CREDIT_SLACK) -> None:
        self._slack = slack
        self._accounts: dict[bytes, _Account] = {}
        self._turns: deque[_Account] = deque()

    def __contains__(self, key: bytes) -> bool:
        return key in self._accounts

    def open(self, key: bytes, credits: int) -> None:
        """Open the account of session ``key``, or set its credits if it is open."""
        acct = self._accounts.get(key)
        if acct is None:
            self._accounts[key] = _Account(key, credits)
        else:
            acct.credits = credits

    def close(self, key: bytes) -> int:
        """Close the account of ``key`` (no-op if closed); returns the queued requests dropped.

        Its outstanding requests are forgotten: later settles of them return False.
        """
        acct = self._accounts.pop(key, None)
        if acct is None:
            return 0
        acct.closed = True
        return len(acct.queued)

    def _get(self, key: bytes) -> _Account:
        acct = self._accounts.get(key)
        if acct is None:
            raise InternalError(f"no credit account for session {key!r}")
        return acct

    def outstanding(self, key: bytes) -> int:
        """Requests of ``key`` accepted and not settled yet."""
        return len(self._get(key).active)

    def at_credits(self, key: bytes) -> bool:
        """Whether ``key`` has at least its credits outstanding (notices may be waiting)."""
        acct = self._get(key)
        return len(acct.active) >= acct.credits

    def admit(self, key: bytes, req_id: int, ranges: np.ndarray) -> Admitted | Refusal:
        """Accept request ``req_id`` of session ``key`` into its queue, or refuse it.

        Raises:
            InternalError: ``key`` has no open account.
        """
        acct = self._get(key)
        if req_id in acct.active:
            return Refusal(RefusalReason.DUPLICATE_ID,
                           f"request id {req_id} is already outstanding")
        if len(acct.active) >= self._slack * acct.credits:
            return Refusal(RefusalReason.OVER_CREDITS,
                           f"credit exceeded: {len(acct.active)} request(s) outstanding and "
                           f"{acct.credits} credit(s) granted")
        if not acct.queued:
            self._turns.append(acct)
        acct.queued.append((req_id, ranges))
        acct.active.add(req_id)
        return Admitted(len(acct.active))

    def settle(self, key: bytes, req_id: int) -> bool:
        """Return the credit of request ``req_id`` of session ``key`` (its reply was sent).

        Returns:
            False when nothing was outstanding under that id (closed session, or settled
            already); see the module docstring.
        """
        acct = self._accounts.get(key)
        if acct is None or req_id not in acct.active:
            return False
        acct.active.discard(req_id)
        return True

    def next_request(self) -> Dispatch | None:
        """The next request to dispatch, one per session in turn; None when none is queued."""
        while self._turns:
            acct = self._turns.popleft()
            if acct.closed or not acct.queued:
                continue
            req_id, ranges = acct.queued.popleft()
            if acct.queued:
                self._turns.append(acct)
            return Dispatch(acct.key, req_id, ranges)
        return None

    def queued(self) -> int:
        """Requests waiting for a reader, over all sessions."""
        return sum(len(a.queued) for a in self._accounts.values())
