"""Which batch to request from which server: credits, window and liveness. Pure, no sockets.

The scheduler is driven by the client's I/O thread (:mod:`dataflow.client.iothread`) with the
time passed in, so every rule here is unit-tested with a fake clock:

* **Credits.** A server grants a number of credits in its INDEX reply; the client never has
  more requests outstanding at a server than that. Requests of an abandoned epoch keep their
  credit until their reply (or error) arrives: the server still holds them.
* **Window.** At most ``window`` batches of the current epoch are requested but not yet taken
  by the consumer (received, reordered and waiting count too); ``window`` is the sum of the
  granted credits, so the consumer's hand-off never holds more than that.
* **Choice.** Batches are requested in plan order, each from the server with credit that has
  the fewest requests outstanding (the first such server on a tie).
* **Liveness.** A HEARTBEAT is due at a server every ``heartbeat_s`` seconds; a server that
  leaves requests unanswered for ``timeout`` seconds without progress is unavailable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dataflow.errors import InternalError, ProtocolError, ServerUnavailable
from dataflow.plan import Batches


@dataclass(frozen=True)
class Slot:
    """What an outstanding request is for: batch ``index`` of epoch generation ``gen``."""

    gen: int
    index: int


@dataclass(frozen=True)
class Assignment:
    """Send a REQUEST for batch ``index`` to server number ``server``.

    Attributes:
        ranges: int64 array of shape ``(n, 3)``: the batch's ``(shard, start, stop)`` rows.
    """

    server: int
    req_id: int
    index: int
    ranges: np.ndarray


@dataclass
class _Server:
    endpoint: str
    credits: int = 0
    outstanding: dict[int, Slot] = field(default_factory=dict)
    last_progress: float = 0.0
    next_heartbeat: float = 0.0


@dataclass
class _Epoch:
    gen: int
    batches: Batches
    first: int
    next_request: int


class Scheduler:
    """Request scheduling of one DataLoader over its servers.

    Args:
        endpoints: the servers, in the order their numbers refer to.
        timeout: seconds without progress on outstanding requests before a server is
            declared unavailable.
        heartbeat_s: seconds between HEARTBEATs to each server.

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoints: Sequence[str], timeout: float, heartbeat_s: float) -> None:
        self._servers = [_Server(e) for e in endpoints]
        self._timeout = timeout
        self._heartbeat_s = heartbeat_s
        self._epoch: _Epoch | None = None
        self._req_ids = 0

    # -- set-up ---------------------------------------------------------------------------------

    def grant(self, server: int, credits: int, now: float) -> None:
        """Server ``server`` granted ``credits`` (its INDEX reply arrived at ``now``)."""
        if credits < 1:
            raise ProtocolError(f"{self._servers[server].endpoint}: granted {credits} credits")
        s = self._servers[server]
        s.credits = credits
        s.next_heartbeat = now + self._heartbeat_s

    @property
    def window(self) -> int:
        """Batches requested but not taken, at most: the sum of granted credits."""
        return sum(s.credits for s in self._servers)

    def endpoint(self, server: int) -> str:
        return self._servers[server].endpoint

    # -- epochs ---------------------------------------------------------------------------------

    def start_epoch(self, gen: int, batches: Batches, first: int) -> None:
        """Request ``batches`` (the epoch's batches ``first``, ``first + 1``, ...) from now on.

        The previous epoch is abandoned: its outstanding requests stay counted against their
        servers' credits until answered, and their replies are then reported stale.
        """
        if self._epoch is not None and gen <= self._epoch.gen:
            raise InternalError(f"epoch generation {gen} after {self._epoch.gen}")
        self._epoch = _Epoch(gen, batches, first, first)

    @property
    def gen(self) -> int | None:
        """Generation of the current epoch, or None before the first."""
        return None if self._epoch is None else self._epoch.gen

    def assignments(self, taken: int, now: float) -> list[Assignment]:
        """Requests to send now, given that the consumer took ``taken`` batches of this epoch.

        Returns:
            The assignments, in plan order; the caller must send every one.
        """
        ep = self._epoch
        out: list[Assignment] = []
        if ep is None:
            return out
        end = ep.first + len(ep.batches)
        while ep.next_request < end and ep.next_request - ep.first - taken < self.window:
            best = None
            for i, s in enumerate(self._servers):
                if len(s.outstanding) < s.credits and (
                        best is None or len(s.outstanding) < len(self._servers[best].outstanding)):
                    best = i
            if best is None:
                break
            s = self._servers[best]
            self._req_ids += 1
            if not s.outstanding:
                s.last_progress = now
            s.outstanding[self._req_ids] = Slot(ep.gen, ep.next_request)
            out.append(Assignment(best, self._req_ids, ep.next_request,
                                  ep.batches.rows(ep.next_request - ep.first)))
            ep.next_request += 1
        return out

    def window_full(self, taken: int) -> bool:
        """True when only the consumer taking batches lets more requests go out."""
        ep = self._epoch
        return (ep is not None and ep.next_request < ep.first + len(ep.batches)
                and ep.next_request - ep.first - taken >= self.window)

    def on_reply(self, server: int, req_id: int, now: float) -> Slot | None:
        """A reply (batch or error) to ``req_id`` arrived from ``server``.

        Returns:
            The batch it answers when it belongs to the current epoch, else None (a stale
            reply of an abandoned epoch: discard it).

        Raises:
            ProtocolError: ``server`` has no such request outstanding.
        """
        s = self._servers[server]
        slot = s.outstanding.pop(req_id, None)
        if slot is None:
            raise ProtocolError(f"{s.endpoint}: reply to unknown request {req_id}")
        s.last_progress = now
        if self._epoch is None or slot.gen != self._epoch.gen:
            return None
        return slot

    def outstanding(self, server: int) -> int:
        return len(self._servers[server].outstanding)

    # -- liveness -------------------------------------------------------------------------------

    def heartbeats_due(self, now: float) -> list[int]:
        """Servers to send a HEARTBEAT to now (each is then due again in ``heartbeat_s``)."""
        due = []
        for i, s in enumerate(self._servers):
            if s.credits and now >= s.next_heartbeat:
                s.next_heartbeat = now + self._heartbeat_s
                due.append(i)
        return due

    def check(self, now: float) -> None:
        """Raise for a server that left requests unanswered for ``timeout`` seconds.

        Raises:
            ServerUnavailable: naming the endpoint, the requests and the time waited.
        """
        for s in self._servers:
            if s.outstanding and now - s.last_progress > self._timeout:
                raise ServerUnavailable(s.endpoint, f"no reply to {len(s.outstanding)} "
                                        f"request(s) for {self._timeout} s")

    def next_deadline(self, now: float) -> float:
        """Seconds until a heartbeat is due or a timeout could expire (for the poll)."""
        soonest = float("inf")
        for s in self._servers:
            if s.credits:
                soonest = min(soonest, s.next_heartbeat - now)
            if s.outstanding:
                soonest = min(soonest, s.last_progress + self._timeout - now)
        return max(soonest, 0.0)
