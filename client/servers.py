"""What a client knows of each server's liveness, and the pure rules that change it.

A server is JOINING (HELLO sent), UP (joined and usable when it has credit), SUSPECT (joined,
but one of its connections is down — a socket monitor saw it — or a HEARTBEAT stayed
unanswered for ``silent_s``), DOWN (not joined: not connected yet, refused or failed its join,
or lost; it is asked to join when its control connection is up and its next try is due) or
GONE (discovery removed it: it is never asked again; found again later, it is a new server).
Every server starts DOWN and not connected. A SUSPECT server is UP again once every connection
is up and it was heard from since; it is lost once suspect for longer than ``grace``. A join
that takes longer than ``timeout`` fails. A failed join is tried again after a backoff
(:func:`join_backoff`: 1 s, doubling up to 30 s), or at once when the control connection comes
up anew. No clock is read here: time is passed in, so the rules are unit-tested with a fake
clock (through :class:`~dataflow.client.scheduler.Scheduler`, which owns the records and acts
on the transitions).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from dataflow.client.slots import Slot

CONTROL = "control"
JOIN_RETRY_S = 1.0  # the first wait before a failed join is tried again
JOIN_RETRY_MAX_S = 30.0  # the longest


def join_backoff(failures: int) -> float:
    """Seconds before a server whose last ``failures`` joins failed (>= 1) is asked again."""
    return min(JOIN_RETRY_MAX_S, JOIN_RETRY_S * 2.0 ** min(failures - 1, 32))


class State(Enum):
    """Where a server stands with this client."""

    JOINING = "joining"  # HELLO sent, handshake under way
    UP = "up"  # joined and usable (when it has credit)
    SUSPECT = "suspect"  # joined, but a connection is down or it is silent
    DOWN = "down"  # lost: must join again
    GONE = "gone"  # removed by discovery (:mod:`dataflow.client.membership`)


class Transition(Enum):
    """A change of state :func:`transition` found due."""

    SUSPECTED = "suspected"  # UP -> SUSPECT: its open batches go to other servers
    RECOVERED = "recovered"  # SUSPECT -> UP
    LOST = "lost"  # SUSPECT for longer than grace
    JOIN_EXPIRED = "join expired"  # JOINING for longer than timeout


@dataclass
class ServerRecord:
    """One server as this client sees it (see the module for the states)."""

    endpoint: str
    state: State = State.JOINING
    credits: int = 0  # requests it may hold at once (of those it granted)
    share: int = 0  # its prefetch at the first join: this server's part of the window
    group: int = 1  # most batches one request may carry (its INDEX's)
    shared: bool = False  # its replies land in shared memory (its last join said so)
    ahead: int = 0  # most samples one request may announce (its INDEX's)
    outstanding: dict[int, Slot] = field(default_factory=dict)  # by req_id, in the order
    # sent (the first is the oldest)
    forgotten: set[int] = field(default_factory=set)  # requests whose replies are discarded
    down_links: set[Hashable] = field(default_factory=set)
    heard: float = 0.0  # last message from the server
    link_up: float = 0.0  # last time one of its connections came up
    unanswered: float | None = None  # when the oldest unanswered HEARTBEAT was sent
    since: float = 0.0  # when the current state began
    broken: bool = False  # a connection went down while suspect
    next_heartbeat: float = 0.0
    next_hello: float = 0.0  # a lost server is asked to join again from then on
    failures: int = 0  # joins failed in a row (the backoff before the next)
    note: str = ""  # how the join under way goes, for messages (empty once joined)
    failure: str = ""  # why the last join failed, for messages (empty once joined)

    def describe(self) -> str:
        """Its state for a message: ``"down (busy: ...)"``, ``"joining (HELLO sent, no
        answer yet; last try: busy: ...)"``, ``"up"``."""
        last = self.failure if not self.note else f"last try: {self.failure}"
        details = "; ".join(part for part in (self.note, self.failure and last) if part)
        return f"{self.state.value} ({details})" if details else self.state.value

    def enter(self, state: State, now: float) -> None:
        self.state = state
        self.since = now

    def heard_from(self, now: float) -> None:
        """A message (any) arrived from the server."""
        self.heard = now
        self.unanswered = None

    def heartbeat_due(self, now: float, heartbeat_s: float) -> bool:
        """Whether a HEARTBEAT is due now (then it is due again ``heartbeat_s`` later)."""
        if self.state not in (State.UP, State.SUSPECT) or now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + heartbeat_s
        if self.unanswered is None:
            self.unanswered = now
        return True

    def hello_due(self, now: float) -> bool:
        """Whether a lost server is to be sent HELLO now (then it is JOINING)."""
        if self.state is not State.DOWN or CONTROL in self.down_links or now < self.next_hello:
            return False
        self.enter(State.JOINING, now)
        self.down_links.intersection_update({CONTROL})  # its readers are connected anew
        return True

    def link(self, link: Hashable, up: bool, now: float) -> None:
        """Connection ``link`` (:data:`CONTROL` or a reader's) went up or down; a lost
        server whose control connection comes up may join again at once."""
        if up:
            self.down_links.discard(link)
            self.link_up = now
            if link == CONTROL and self.state is State.DOWN:
                self.next_hello = now
        else:
            self.down_links.add(link)
            self.broken = True  # replies in flight on it may be gone
            if link == CONTROL and self.state is State.JOINING:
                self.note = "disconnected"


def transition(s: ServerRecord, now: float, *, silent_s: float, grace: float,
               timeout: float) -> Transition | None:
    """The change of state due for ``s`` at ``now``, if any (not applied)."""
    silent = s.unanswered is not None and now - s.unanswered > silent_s
    if s.state is State.UP and (s.down_links or s.broken or silent):
        return Transition.SUSPECTED
    if s.state is State.SUSPECT:
        if not s.down_links and s.heard > s.since and s.heard >= s.link_up:
            return Transition.RECOVERED
        if now - s.since > grace:
            return Transition.LOST
    if s.state is State.JOINING and now - s.since > timeout:
        return Transition.JOIN_EXPIRED
    return None


def deadline(s: ServerRecord, now: float, *, silent_s: float, grace: float,
             timeout: float) -> float:
    """Seconds until a heartbeat to ``s`` or a rule of :func:`transition` is due."""
    soonest = float("inf")
    if s.state in (State.UP, State.SUSPECT):
        soonest = min(soonest, s.next_heartbeat - now)
    if s.unanswered is not None and s.state is State.UP:
        soonest = min(soonest, s.unanswered + silent_s - now)
    if s.state is State.SUSPECT:
        soonest = min(soonest, s.since + grace - now)
    if s.state is State.JOINING:
        soonest = min(soonest, s.since + timeout - now)
    if s.state is State.DOWN and CONTROL not in s.down_links:
        soonest = min(soonest, s.next_hello - now)
    return soonest
