"""Requests that take too long: the request timeout's rule. Pure, no sockets.

A batch whose every request at a usable server was sent more than ``request_timeout`` seconds
ago, without a reply, is *late*: it is requested again, alone, before any new batch, from a
usable server that does not hold a request of it alone (the first reply is accepted, as in
failover): a request of several batches may be late for one of them, so its server may be
asked for each of the others alone. When there is none, or that request too is not answered
within ``request_timeout`` (counted from when it was decided; while it waits for a credit, from
the latest request sent to a server that may take it: a server that answers gives its credits
back, so a batch queued behind others at a healthy server is not failed), the batch fails. A late
request says nothing about its server's liveness: the server keeps its other requests and
gets new ones. A batch queued to be asked again that no usable server holds (its server was
lost, or its reply undeliverable) fails by the same rule: once ``request_timeout`` passed since
it was queued, and no usable server that may take it sent a request within ``request_timeout``
(every one holds its credits with requests it does not answer); with no usable server at all,
the unavailable rule (:meth:`~dataflow.client.scheduler.Scheduler.check`) applies instead.
Applied by :meth:`~dataflow.client.scheduler.Scheduler.late` to its records, with the time
passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dataflow.client.fetch import Fetch
from dataflow.client.servers import ServerRecord, State
from dataflow.client.slots import Slot
from dataflow.wire import BatchTag


@dataclass(frozen=True)
class Late:
    """Batch ``index`` of generation ``gen`` (``tag``) got no reply within the request timeout.

    Attributes:
        asked: ``(server, seconds since its request was sent)`` of each usable server holding
            a request for it.
        failed: no other server could take it (or its request again was late too): the batch
            fails; else it is requested again from another server.
        again: it was late before (it was requested again already).
        queued: it waited to be asked again, held by no usable server, and those in
            ``asked`` (with the age of their oldest request) answered none meanwhile.
    """

    gen: int
    index: int
    tag: BatchTag
    asked: tuple[tuple[int, float], ...]
    failed: bool
    again: bool
    queued: bool = False


def _held(fetch: Fetch, servers: Sequence[ServerRecord]) -> dict[int, list[Slot]]:
    """Open batches of ``fetch`` with requests at usable servers: index -> those requests."""
    held: dict[int, list[Slot]] = {}
    for s in servers:
        if s.state is State.UP:
            for slot in s.outstanding.values():
                if slot.gen == fetch.gen:
                    for index in slot.indexes:
                        if index in fetch.open:
                            held.setdefault(index, []).append(slot)
    return held


def alone_at(holders: Sequence[Slot]) -> set[int]:
    """The servers of ``holders`` (requests of one batch) that hold it alone: those not to ask
    it of again."""
    return {slot.server for slot in holders if not slot.parts}


def first_sent(servers: Sequence[ServerRecord]) -> float:
    """When the oldest request a usable server holds was sent (infinite: none): no batch is
    late until ``limit`` after it. A server's requests are held in the order they were sent,
    so this looks at one request per server, where :func:`find_late` looks at all of them."""
    return min((next(iter(s.outstanding.values())).sent for s in servers
                if s.state is State.UP and s.outstanding), default=math.inf)


def credit_until(servers: Sequence[ServerRecord], holders: Sequence[Slot],
                 limit: float) -> float:
    """Until when a batch asked again, not sent yet, may wait for a credit: ``limit`` after
    the latest request sent to a usable server that may take it (one not holding it alone:
    it sends requests as its replies come, so its credits come back); -inf: none."""
    alone = alone_at(holders)
    return max((next(reversed(s.outstanding.values())).sent + limit
                for i, s in enumerate(servers)
                if s.state is State.UP and i not in alone and s.outstanding),
               default=-math.inf)


def _waiting(fetch: Fetch, index: int, servers: Sequence[ServerRecord],
             holders: Sequence[Slot], limit: float) -> float:
    """Until when late batch ``index`` may wait unsent (:func:`credit_until`; -inf once it
    was sent again: its request then has ``limit`` of its own)."""
    return credit_until(servers, holders, limit) if index in fetch.queued else -math.inf


def _stranded(fetch: Fetch, servers: Sequence[ServerRecord],
              limit: float) -> dict[int, float]:
    """Batches queued to be asked again that no usable server holds, and when each fails
    unless sent (never while no server is usable)."""
    if not fetch.queued or not any(s.state is State.UP for s in servers):
        return {}
    held = _held(fetch, servers)
    wait = credit_until(servers, (), limit)
    return {i: max(since + limit, wait) for i, since in fetch.queued.items()
            if i in fetch.open and i not in held}


def find_late(fetch: Fetch, servers: Sequence[ServerRecord], now: float,
              limit: float) -> list[Late]:
    """Apply the request timeout ``limit`` (seconds; infinite: never) at ``now``.

    Returns:
        The batches found late now, in order: requested again (``failed`` False: queued in
        ``fetch`` to be asked of another server), or failed (closed: a reply for it is
        discarded; the caller puts its error in its place).
    """
    if math.isinf(limit):
        return []
    out = []
    for index, due in sorted(_stranded(fetch, servers, limit).items()):
        if now > due:
            asked = tuple((i, now - next(iter(s.outstanding.values())).sent)
                          for i, s in enumerate(servers)
                          if s.state is State.UP and s.outstanding)
            fetch.close(index)
            out.append(Late(fetch.gen, index, fetch.batch(index)[1], asked, True, True,
                            queued=True))
    if now - first_sent(servers) <= limit:
        return out
    up = {i for i, s in enumerate(servers) if s.state is State.UP}
    for index, holders in sorted(_held(fetch, servers).items()):
        if any(now - slot.sent <= limit for slot in holders):
            continue
        since = fetch.late.get(index)
        if since is not None and now <= max(since + limit, _waiting(fetch, index, servers,
                                                                    holders, limit)):
            continue  # requested again: not sent yet, or waiting for a credit
        failed = since is not None or not up - alone_at(holders)
        if failed:
            fetch.close(index)
        else:
            fetch.late[index] = now
            fetch.requeue([index], now)
        asked = tuple((slot.server, now - slot.sent) for slot in holders)
        out.append(Late(fetch.gen, index, fetch.batch(index)[1], asked, failed,
                        since is not None))
    return sorted(out, key=lambda late: late.index)


def late_in(fetch: Fetch, servers: Sequence[ServerRecord], now: float, limit: float) -> float:
    """Seconds until :func:`find_late` may find a batch late: exact once the oldest request
    is older than ``limit``; before, the seconds until it is (never later than exact)."""
    if math.isinf(limit):
        return math.inf
    stranded = min(_stranded(fetch, servers, limit).values(), default=math.inf) - now
    early = first_sent(servers) + limit - now
    if early > 0:
        return min(early, stranded)
    soonest = stranded
    for index, holders in _held(fetch, servers).items():
        due = max(slot.sent for slot in holders) + limit
        if index in fetch.late:
            due = max(due, fetch.late[index] + limit,
                      _waiting(fetch, index, servers, holders, limit))
        soonest = min(soonest, due - now)
    return soonest
