"""A reader's sends: replies to clients on its data socket, notices to the frontend.

A reply goes to the client's data connection (routing id: its session token) just after its
SENT notice goes to the frontend. When that connection is missing (the data socket has no
route to the token: the client is reconnecting, or gone), the reply is *unrouted*: it waits,
behind the replies already waiting for that connection and never ahead of them, for at most
``UNREACHABLE_S`` seconds, and at most ``MAX_UNROUTED`` wait per connection (beyond, the
oldest is dropped); a dropped reply is reported LOST. Replies to other clients never wait
behind them. Which replies wait and which are dropped is :class:`Unrouted`'s decision (pure,
on a clock passed in); :class:`DataSender` does the I/O.

Every reply reported SENT is held until a DONE reports its bytes released: unrouted, or handed
to ZeroMQ and not yet let go of (a tracker on its last frame says when).

Thread invariant: used only by the reader's thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from dataflow.server.framing import send_parts, try_send_tracked
from dataflow.wire.internal import Attached, Done, Lost, Sent, encode_internal

UNREACHABLE_S = 5.0
MAX_UNROUTED = 8

log = logging.getLogger("dataflow.server.worker")


@dataclass(frozen=True)
class Waiting:
    """An unrouted reply: its SENT notice and frames, retried until ``deadline``."""

    sent: Sent
    frames: list
    deadline: float


class Unrouted:
    """Unrouted replies per session token, oldest first (only tokens with some are held).
    Pure: the caller passes the clock and the hand-over to ZeroMQ.

    Args:
        cap: replies that may wait for one connection.
        wait_s: seconds one reply may wait.
    """

    def __init__(self, cap: int = MAX_UNROUTED, wait_s: float = UNREACHABLE_S) -> None:
        self._cap = cap
        self._wait_s = wait_s
        self._waiting: dict[bytes, deque[Waiting]] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __contains__(self, token: bytes) -> bool:
        """Whether replies wait for the connection of ``token`` (a new one waits behind)."""
        return token in self._waiting

    def add(self, sent: Sent, frames: list, now: float) -> list[tuple[Sent, str]]:
        """Let the reply ``sent`` / ``frames`` wait; returns the replies dropped for it and why
        (the oldest of its connection's, beyond ``cap``)."""
        waiting = self._waiting.setdefault(sent.token, deque())
        waiting.append(Waiting(sent, frames, now + self._wait_s))
        dropped = []
        while len(waiting) > self._cap:
            dropped.append((waiting.popleft().sent, f"more than {self._cap} replies were "
                            "waiting for the client's data connection"))
        return dropped

    def retry(self, hand: Callable[[Waiting], bool], now: float) -> list[tuple[Sent, str]]:
        """Hand each connection's replies over in order while ``hand`` takes them (True: handed
        to ZeroMQ); returns those dropped past their deadline, and why."""
        dropped = []
        for token, waiting in list(self._waiting.items()):
            while waiting:
                if hand(waiting[0]):
                    waiting.popleft()
                elif now > waiting[0].deadline:
                    dropped.append((waiting.popleft().sent, "the client's data connection to "
                                    f"this reader was missing for {self._wait_s} s"))
                else:
                    break
            if not waiting:
                del self._waiting[token]
        return dropped


class DataSender:
    """Sends replies on the data socket and notices to the frontend. Not thread-safe.

    Args:
        data: the data socket.
        control: the connection to the frontend.
        max_announced: session tokens remembered as announced ATTACHED (least recently seen
            forgotten first; one seen again is announced again).

    Attributes:
        unrouted: the replies waiting for their client's data connection.
        unsent: per session token, ``(tracker, bytes)`` of the replies handed to ZeroMQ and
            not yet let go of, oldest first; only tokens with such replies are keys.
    """

    def __init__(self, data: zmq.Socket, control: zmq.Socket, max_announced: int = 1024) -> None:
        self._data = data
        self._control = control
        self._max_announced = max_announced
        self._announced: OrderedDict[bytes, None] = OrderedDict()
        self.unrouted = Unrouted()
        self.unsent: dict[bytes, deque[tuple[zmq.MessageTracker, int]]] = {}

    @property
    def busy(self) -> bool:
        """Whether replies are unrouted or not yet let go of by ZeroMQ."""
        return bool(self.unrouted or self.unsent)

    def attached(self, token: bytes) -> None:
        """A data connection of routing id ``token`` said HEARTBEAT: tell the frontend (once
        while ``token`` is remembered)."""
        if token in self._announced:
            self._announced.move_to_end(token)
            return
        self._announced[token] = None
        if len(self._announced) > self._max_announced:
            self._announced.popitem(last=False)
        send_parts(self._control, encode_internal(Attached(token)))

    def send(self, frames: list, sent: Sent) -> None:
        """Tell the frontend ``sent``, then hand the reply ``frames`` to ZeroMQ (unrouted while
        the client's data connection is missing)."""
        send_parts(self._control, encode_internal(sent))
        if sent.token in self.unrouted or not self._hand(sent.token, frames, sent.nbytes):
            self._lost(self.unrouted.add(sent, frames, time.monotonic()))

    def retry(self) -> None:
        """Retry the unrouted replies; drop those past their deadline."""
        self._lost(self.unrouted.retry(
            lambda w: self._hand(w.sent.token, w.frames, w.sent.nbytes), time.monotonic()))

    def _hand(self, token: bytes, frames: list, nbytes: int) -> bool:
        tracker = try_send_tracked(self._data, token, frames)
        if tracker is None:
            return False
        self.unsent.setdefault(token, deque()).append((tracker, nbytes))
        return True

    def collect(self) -> None:
        """Report (DONE) the bytes of the replies ZeroMQ let go of since the last call."""
        for token, handed in list(self.unsent.items()):
            released = 0
            while handed and handed[0][0].done:
                released += handed.popleft()[1]
            if not handed:
                del self.unsent[token]
            if released:
                send_parts(self._control, encode_internal(Done(token, released)))

    def _lost(self, dropped: list[tuple[Sent, str]]) -> None:
        for sent, why in dropped:
            log.warning("reply to request %d dropped: %s", sent.req_id, why)
            send_parts(self._control, encode_internal(Lost(sent.token, sent.req_id, why)))
            send_parts(self._control, encode_internal(Done(sent.token, sent.nbytes)))
