"""Credits of a loader server's sessions: the one owner of "how many requests are out".

Pure bookkeeping: no sockets, no clock. Each session (keyed by its session token, never by a
ZeroMQ routing id) has an account: credits granted, the ids of its outstanding requests
(accepted, and whose reply was not handed to ZeroMQ yet) and its queue of requests waiting for
a reader, each the :class:`~dataflow.wire.internal.Task` the reader will get. Requests are
dispatched round-robin over the accounts with queued requests, one per account in turn.

Rule: a client may have up to ``CREDIT_SLACK x credits`` requests outstanding, counted over its
*connection* (the account's ``owner``, its ZeroMQ routing id), not only its session: an
account closed (BYE, expiry) while requests of it are at a reader stays *draining* until they
settle, and they count against every new account of the same owner. So BYE + HELLO on one
connection never buys more requests at the readers. A reader sends
its SENT notice (which settles a request) on the frontend's connection just before it hands
the reply to the client's data connection; the two travel on different connections, so a
client that keeps to its credits can still look over them for a moment. Beyond that a request
is refused. Per client, replies held in a reader's send queue are therefore at most
``CREDIT_SLACK x credits``.

A peer address (the IP address of the connection, on ipc its local user) is charged too: its
accounts' outstanding requests together, open and draining, are at most ``address_cap``, so
new routing ids (new connections) from one address never buy more than that either.

An account's requests are dispatched only once it is *attached* (a reader saw the session's
data connection: :meth:`Ledger.attach`), and not while the caller says its address is
blocked (its readers hold too many unsent bytes for it): they wait in the queue, unread, and
the other accounts take their turns.

Settling an id that has nothing outstanding is not an error: it happens when the session was
closed (BYE, expiry) before the reader's notice came, or when a reader's notice comes after
its death already failed the request. :meth:`Ledger.settle` returns False then; the caller
counts it.

Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

from dataflow.errors import InternalError
from dataflow.wire.internal import Task

CREDIT_SLACK = 2
K = TypeVar("K", bytes, str)


class RefusalReason(Enum):
    """Why :meth:`Ledger.admit` refused a request."""

    OVER_CREDITS = "over credits"
    OVER_ADDRESS = "over the address's requests"
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


@dataclass(eq=False)
class _Account:
    key: bytes
    owner: bytes
    credits: int
    address: str = ""
    attached: bool = False
    active: set[int] = field(default_factory=set)
    queued: deque[Task] = field(default_factory=deque)
    closed: bool = False


def _unlink(index: dict[K, set[bytes]], group: K, key: bytes) -> None:
    keys = index.get(group)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[group]


class Ledger:
    """Credit accounts of all sessions, and fair round-robin dispatch over them.

    Args:
        slack: requests outstanding per connection, as a multiple of its credits.
        address_cap: requests outstanding per peer address (None: no cap).
    """

    def __init__(self, slack: int = CREDIT_SLACK, address_cap: int | None = None) -> None:
        self._slack = slack
        self._address_cap = address_cap
        self._accounts: dict[bytes, _Account] = {}
        self._draining: dict[bytes, _Account] = {}
        self._by_owner: dict[bytes, set[bytes]] = {}
        self._by_address: dict[str, set[bytes]] = {}
        self._turns: deque[_Account] = deque()

    def __contains__(self, key: bytes) -> bool:
        return key in self._accounts

    def open(self, key: bytes, credits: int, owner: bytes | None = None,
             address: str = "") -> None:
        """Open the account of session ``key`` for connection ``owner`` (``key`` when None)
        of peer ``address``, or set its credits if it is open."""
        acct = self._accounts.get(key)
        if acct is None:
            self._drained(self._draining.pop(key, None))
            acct = _Account(key, key if owner is None else owner, credits, address)
            self._accounts[key] = acct
            self._by_owner.setdefault(acct.owner, set()).add(key)
            self._by_address.setdefault(address, set()).add(key)
        else:
            acct.credits = credits

    def attach(self, key: bytes) -> bool:
        """Session ``key``'s data connection is attached: its requests may be dispatched.

        Returns:
            False when ``key`` has no open account (a stale or foreign notice).
        """
        acct = self._accounts.get(key)
        if acct is None:
            return False
        if not acct.attached:
            acct.attached = True
            if acct.queued:
                self._turns.append(acct)
        return True

    def address(self, key: bytes) -> str | None:
        """The peer address of the open or draining account ``key``, or None."""
        acct = self._accounts.get(key) or self._draining.get(key)
        return None if acct is None else acct.address

    def close(self, key: bytes) -> int:
        """Close the account of ``key`` (no-op if closed); returns the queued requests dropped.

        Requests at a reader keep counting against the owner until they settle (later settles
        of them return False).
        """
        acct = self._accounts.pop(key, None)
        if acct is None:
            return 0
        acct.closed = True
        dropped = len(acct.queued)
        acct.active.difference_update(d.req_id for d in acct.queued)
        acct.queued.clear()
        if acct.active:
            self._draining[key] = acct
        else:
            self._drained(acct)
        return dropped

    def _drained(self, acct: _Account | None) -> None:
        if acct is None:
            return
        _unlink(self._by_owner, acct.owner, acct.key)
        _unlink(self._by_address, acct.address, acct.key)

    def _sum(self, keys: set[bytes]) -> int:
        return sum(len((self._accounts.get(k) or self._draining[k]).active) for k in keys)

    def charged(self, key: bytes) -> int:
        """Requests outstanding over every open or draining account of ``key``'s owner."""
        return self._sum(self._by_owner[self._get(key).owner])

    def address_charged(self, address: str) -> int:
        """Requests outstanding over every open or draining account of peer ``address``."""
        return self._sum(self._by_address.get(address, set()))

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

    def admit(self, task: Task) -> Admitted | Refusal:
        """Accept ``task`` (a request of session ``task.token``) into its session's queue, or
        refuse it.

        Raises:
            InternalError: its session has no open account.
        """
        key, req_id = task.token, task.req_id
        acct = self._get(key)
        if req_id in acct.active:
            return Refusal(RefusalReason.DUPLICATE_ID,
                           f"request id {req_id} is already outstanding")
        charged = self.charged(key)
        if charged >= self._slack * acct.credits:
            return Refusal(RefusalReason.OVER_CREDITS,
                           f"credit exceeded: {charged} request(s) outstanding on this "
                           f"connection and {acct.credits} credit(s) granted")
        if self._address_cap is not None:
            by_address = self.address_charged(acct.address)
            if by_address >= self._address_cap:
                return Refusal(RefusalReason.OVER_ADDRESS,
                               f"{by_address} request(s) outstanding from this client's "
                               f"address, the most one address may have (--max-sessions-per-"
                               f"address x {self._slack} x --max-credits)")
        if not acct.queued and acct.attached:
            self._turns.append(acct)
        acct.queued.append(task)
        acct.active.add(req_id)
        return Admitted(len(acct.active))

    def requeue(self, task: Task) -> bool:
        """Put ``task`` (dispatched to a reader that died) first in its session's queue, with
        one more attempt counted.

        Returns:
            False when it has no open account or is no longer outstanding (nothing to do);
            a draining account forgets it.
        """
        acct = self._accounts.get(task.token)
        if acct is None or task.req_id not in acct.active:
            self.settle(task.token, task.req_id)
            return False
        if not acct.queued and acct.attached:
            self._turns.append(acct)
        acct.queued.appendleft(replace(task, attempts=task.attempts + 1))
        return True

    def settle(self, key: bytes, req_id: int) -> bool:
        """Return the credit of request ``req_id`` of session ``key`` (its reply was sent).

        Returns:
            False when nothing was outstanding under that id (closed session, or settled
            already); see the module docstring.
        """
        acct = self._accounts.get(key)
        if acct is None:
            draining = self._draining.get(key)
            if draining is not None:
                draining.active.discard(req_id)
                if not draining.active:
                    self._drained(self._draining.pop(key))
            return False
        if req_id not in acct.active:
            return False
        acct.active.discard(req_id)
        return True

    def next_request(self, blocked: Callable[[str], bool] | None = None) -> Task | None:
        """The next request to dispatch, one per attached session in turn, skipping sessions
        whose address ``blocked`` says is blocked; None when none may go."""
        for _ in range(len(self._turns)):
            acct = self._turns.popleft()
            if acct.closed or not acct.queued:
                continue
            if blocked is not None and blocked(acct.address):
                self._turns.append(acct)
                continue
            task = acct.queued.popleft()
            if acct.queued:
                self._turns.append(acct)
            return task
        return None

    def queued(self) -> int:
        """Requests waiting for a reader, over all sessions."""
        return sum(len(a.queued) for a in self._accounts.values())

    def draining(self) -> int:
        """Closed accounts whose requests are still at a reader."""
        return len(self._draining)
