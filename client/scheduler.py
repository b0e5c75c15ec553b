"""Which batch to request from which server, and which servers are alive. Pure, no sockets.

The scheduler is driven by the client's I/O thread (:mod:`dataflow.client.iothread`) with the
time passed in, so every rule here is unit-tested with a fake clock:

* **Credits.** A server grants a number of credits in its INDEX reply; the client never has
  more requests outstanding at a server than that, and uses ``prefetch`` of them, or one per
  reader of a server with more readers, as far as the depth goes (below: every reader can
  work at once, a server decoding images in 12 readers is not held to 4 requests). Requests
  of an abandoned generation keep their credit until their reply (or error) arrives: the
  server still holds them.
* **Depth.** At most ``depth`` batches of the consumer's stream are requested but not yet
  taken by the consumer (received, reordered and waiting count too), so the consumer's
  hand-off never holds more. ``depth`` is the sum of the servers' ``prefetch`` (at most their
  credits) at their first join, times the batches a reply carries; it grows when a server
  joins for the first time (also mid-epoch: the loader starts with the first server, and the
  others' credits count as soon as they join) and when requests carry more batches, and never
  shrinks (servers that left or were lost keep their part: they may come back). Where a
  server's readers take more requests than ``prefetch``, the depth holds a request for each
  within the bytes of ``prefetch`` requests of :data:`SPREAD_BYTES` (or of their own bytes,
  if more), known once the first batch arrived: small batches keep their runs, larger ones
  are spread over the readers, each request carrying fewer batches, at least one; the
  largest are held to ``prefetch`` requests as before.
* **Batches per request.** A request carries a run of up to ``group`` consecutive batches of
  one pass (one credit, one reply; each batch still open, accepted and handed over on its
  own): fixed, or sized once from the first batch received so that a request's reply is at
  most ``group_bytes`` (``shared_bytes`` while any server's replies land in shared memory:
  every request then fits a slot), for batches of which :data:`MIN_RUN` or more fit there
  (larger ones go alone: :meth:`Scheduler.sized`). A batch requested again goes alone, so a
  failed request of several batches is asked again batch by batch and an error lands on its
  own batch.
* **Membership.** A server found by discovery is :meth:`Scheduler.add`-ed (it joins and then
  takes requests at once, the stream's batches not yet requested and re-requests, within the
  depth); a removed one is :meth:`Scheduler.retire`-d (GONE: its open batches go to
  the other servers, as for a lost server, and it is never asked again). Server numbers are
  never reused.
* **Choice.** Batches are requested in stream order (:mod:`dataflow.client.fetch`), batches to
  re-request first, each from a usable server with credit (for a re-request, one that does
  not hold it alone), shared in proportion to the servers' capacity (:mod:`dataflow.client.shares`:
  their readers and their service times; servers alike take turns). A stalled server (it
  answered nothing for a while though it holds requests) gets none while another server
  that answers may take it.
* **Exactly once.** A batch is *open* from its first request until a reply for it is
  accepted; only the first reply for an open batch of the current generation is accepted,
  every other one (a late reply from a server it was taken away from, a duplicate, a batch of
  an abandoned generation) is discarded.
* **Liveness** is judged by each server's connections, never by how long a reply takes (a
  56 MB reply on a slow link may take longer than ``timeout`` while bytes flow): the rules are
  :mod:`dataflow.client.servers`. A suspect server gets no new requests and its open
  batches are re-requested from the other servers at once; if a connection broke meanwhile,
  replies in flight on it may be gone, so its outstanding requests are forgotten when it is
  usable again (their late replies are discarded). A lost server's requests are all
  forgotten, and it must join again (HELLO) before it gets work.
* **Late requests** (:mod:`dataflow.client.late`): a batch no server answered within
  ``request_timeout`` is asked of another server, or fails.
* **Start.** Every server starts DOWN, not connected; it is sent HELLO once its control
  connection is up, and joins when its handshake is done (:meth:`Scheduler.grant`). The loader
  starts as soon as one server joined; the others join whenever they can (a busy, slow or
  not yet started server is asked again with a backoff), as servers found by discovery do.
  When none joined within ``timeout`` seconds of the start,
  :class:`~dataflow.errors.ServerUnavailable` names every endpoint and its state.
* **Unavailable.** When the consumer needs a server and none was usable for ``timeout``
  seconds, :class:`~dataflow.errors.ServerUnavailable` names every endpoint. Batches of a pass
  read ahead are not needed until the consumer begins it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

from dataflow.client.fetch import Fetch
from dataflow.client.late import Late, alone_at, find_late, late_in
from dataflow.client.servers import (
    CONTROL,
    ServerRecord,
    State,
    Transition,
    deadline,
    join_backoff,
    transition,
)
from dataflow.client.shares import Shares
from dataflow.client.slots import NO_ROWS, Slot, announced
from dataflow.client.stream import Demand
from dataflow.errors import InternalError, ProtocolError, ServerUnavailable
from dataflow.wire import Part

__all__ = ["CONTROL", "Late", "Loss", "Reply", "Scheduler", "Slot", "State"]

# Requests sized from a batch's bytes carry several batches only when this many fit in their
# ``group_bytes``: for fewer, the per-batch costs saved are small beside the bytes.
MIN_RUN = 4
# The bytes of batches each of a server's ``prefetch`` requests may hold (a request's own, if
# more): where its readers take more requests than ``prefetch``, the batches that fit these
# bytes are spread over them, a request per reader as far as they go.
SPREAD_BYTES = 32 * 2**20


def requests_kept(credits: int, readers: int, prefetch: int | None) -> int:
    """The requests a loader keeps at a server granting ``credits`` with ``readers`` reader
    processes: ``prefetch`` of them (all, when None), or one per reader where it has more."""
    return max(credits if prefetch is None else min(credits, prefetch), min(credits, readers))


class Reply(NamedTuple):
    """A reply accepted for request ``slot``: for its batches ``indexes`` (in order), the
    first reply; its other batches' parts are to be discarded."""

    slot: Slot
    indexes: tuple[int, ...]


class Loss(NamedTuple):
    """Server ``server`` was lost (``joining`` False: it had joined) or its join attempt ran
    out of time (``joining`` True): the caller closes its data connections."""

    server: int
    joining: bool


class Scheduler:
    """Request scheduling and liveness of one DataLoader's servers.

    Args:
        endpoints: the servers, in the order their numbers refer to.
        timeout: seconds the consumer may wait without a usable server; also the limit of
            one attempt to join again.
        heartbeat_s: seconds between HEARTBEATs to each server.
        silent_s: seconds a HEARTBEAT may stay unanswered before its server is suspect.
        grace: seconds a server may be suspect before it is lost.
        now: the start (no server joined within ``timeout`` of it: unavailable).
        request_timeout: seconds a request may go unanswered before its batch is late
            (:mod:`dataflow.client.late`); infinite: never.
        group: the most batches one request carries (the HELLO's ``group``).
        group_bytes: None: every request carries up to ``group`` batches; else one until
            :meth:`sized` says how large a batch is, then up to ``group_bytes`` of them (when
            :data:`MIN_RUN` or more fit).
        shared_bytes: with ``group_bytes``, what sizes the requests instead while any
            server's replies land in shared memory (:meth:`grant`'s ``shared``); None:
            ``group_bytes``.
        prefetch: requests kept outstanding per server (the DataLoader's ``prefetch``): a
            server granting more takes up to one per reader beyond it (:meth:`grant`); None:
            every credit a server grants (it was asked for no more than it should hold).

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float, heartbeat_s: float,
                 silent_s: float, grace: float, now: float = 0.0,
                 request_timeout: float = math.inf, group: int = 1,
                 group_bytes: int | None = None, shared_bytes: int | None = None,
                 prefetch: int | None = None) -> None:
        self._servers = [ServerRecord(e, state=State.DOWN, since=now, down_links={CONTROL},
                                      note="not connected") for e in endpoints]
        self._started = now
        self._admitted = False  # a server joined: the loader started
        self._depth = 0
        self._timeout = timeout
        self._request_timeout = request_timeout
        self._heartbeat_s = heartbeat_s
        self._silent_s = silent_s
        self._grace = grace
        self._fetch: Fetch | None = None
        self._shares = Shares()
        self._req_ids = 0
        self._taken = 0
        self._stalled_since: float | None = None
        if group < 1 or any(b is not None and b < 1 for b in (group_bytes, shared_bytes)):
            raise InternalError(f"requests of {group} batches, {group_bytes} bytes "
                                f"({shared_bytes} through shared memory)")
        self._most = group
        self._group_bytes = group_bytes
        self._shared_bytes = shared_bytes
        if prefetch is not None and prefetch < 1:
            raise InternalError(f"prefetch {prefetch}")
        self._prefetch = prefetch
        # the most batches a reply carries (by its bytes), and a request (the depth spread
        # over the credits in use)
        self._run = self._group = group if group_bytes is None else 1
        # once sized: the most batches a request carries over TCP, and while a server shares
        self._sizes = (group, group) if group_bytes is None else None
        self._nbytes: int | None = None  # a batch's bytes, once the first one arrived

    # -- joining --------------------------------------------------------------------------------

    def grant(self, server: int, credits: int, now: float, *, readers: int,
              group: int = 1, ahead: int = 0, shared: bool = False) -> bool:
        """Server ``server`` joined (its handshake finished at ``now``) granting ``credits``,
        with ``readers`` reader processes, taking requests of up to ``group`` batches, each
        announcing up to ``ahead`` samples read next (:func:`announced`), its replies landing
        in shared memory when ``shared`` (requests are then sized by ``shared_bytes``). Of
        the credits, it is sent up to ``prefetch`` requests at once, or one per reader when
        it has more readers.

        Returns:
            Whether it joined for the first time (not again after it was lost).
        """
        s = self._servers[server]
        if credits < 1:
            raise ProtocolError(f"{s.endpoint}: granted {credits} credits")
        if readers < 1:
            raise ProtocolError(f"{s.endpoint}: {readers} readers")
        if s.state not in (State.JOINING, State.DOWN):
            raise InternalError(f"{s.endpoint}: granted credits while {s.state.value}")
        first = not s.share
        if group < 1:
            raise ProtocolError(f"{s.endpoint}: requests of {group} batches")
        prefetch = credits if self._prefetch is None else min(credits, self._prefetch)
        s.credits = requests_kept(credits, readers, self._prefetch)
        s.group = group
        s.shared = shared
        s.ahead = ahead
        s.share = s.share or prefetch
        self._admitted = True
        self._regroup()
        s.failures, s.note, s.failure = 0, "", ""
        s.unanswered = None
        s.broken = False
        s.heard = now
        s.enter(State.UP, now)
        s.next_heartbeat = now + self._heartbeat_s
        self._shares.join(server, readers, s.credits, now)
        return first

    def add(self, endpoint: str, now: float) -> int:
        """A new server ``endpoint`` (found by discovery); it is asked to join at once.

        Returns:
            Its number.
        """
        if self.find(endpoint) is not None:
            raise InternalError(f"{endpoint}: added twice")
        s = ServerRecord(endpoint, state=State.DOWN, since=now, down_links={CONTROL},
                         note="not connected")
        self._servers.append(s)
        return len(self._servers) - 1

    def retire(self, server: int, now: float) -> None:
        """Server ``server`` was removed by discovery: its open batches are requested from the
        other servers, its requests forgotten, and it is GONE."""
        self.lost(server, now, hello=False)
        self._servers[server].enter(State.GONE, now)

    def find(self, endpoint: str) -> int | None:
        """The number of the server ``endpoint`` that is not GONE, if any."""
        for i, s in enumerate(self._servers):
            if s.endpoint == endpoint and s.state is not State.GONE:
                return i
        return None

    def _members_depth(self) -> int:
        return sum(s.share for s in self._servers if s.state is not State.GONE)

    def state(self, server: int) -> State:
        return self._servers[server].state

    @property
    def group(self) -> int:
        """The most batches a request carries now."""
        return self._group

    @property
    def sizing(self) -> bool:
        """Whether :meth:`sized` still waits for a batch's size (only the first one counts)."""
        return self._nbytes is None

    def sized(self, nbytes: int) -> bool:
        """A whole batch takes ``nbytes`` bytes (the first reply's, per sample, times the
        batch size): the first one sizes requests (with
        ``group_bytes``: ``group_bytes // nbytes`` batches, at most ``group``, when that is
        :data:`MIN_RUN` or more; else 1; to a shared server, the same of ``shared_bytes``),
        and the depth's room for a request per reader (:data:`SPREAD_BYTES`).

        Returns:
            Whether :attr:`depth` grew.
        """
        if self._nbytes is not None:
            return False
        self._nbytes = max(nbytes, 1)
        if self._group_bytes is not None:
            self._sizes = (self._fit(self._group_bytes),
                           self._fit(self._shared_bytes or self._group_bytes))
        depth = self._depth
        self._regroup()
        return self._depth > depth

    def _fit(self, limit: int) -> int:
        fit = limit // (self._nbytes or 1)
        return min(self._most, fit) if fit >= MIN_RUN else 1

    def _regroup(self) -> None:
        """Once sized, replies carry the shared memory's size while any server (not GONE)
        shares, else TCP's. The depth follows (it never shrinks, so a run always fits): the
        servers' ``prefetch`` of such replies, and where more credits are in use (a server's
        readers), a reply for each, within the bytes of ``prefetch`` replies of
        :data:`SPREAD_BYTES` at least (known from the first batch: small batches keep their
        runs, larger ones spread the same bytes over more requests). A request carries the
        depth spread over the credits, at most a reply's batches and at least one. Looked at
        when a server joins and when requests are sized: a sharing server lost or retired
        keeps the requests at its size until then (smaller requests, never a larger depth
        than the I/O thread was told)."""
        sharing = any(s.shared and s.state is not State.GONE for s in self._servers)
        if self._sizes is not None:
            self._run = self._sizes[sharing]
        credits = sum(s.credits for s in self._servers if s.state is not State.GONE)
        room = self._members_depth() * self._run
        if self._nbytes is not None:
            reply = max(SPREAD_BYTES, self._run * self._nbytes)
            room = max(room, self._members_depth() * reply // self._nbytes)
        self._depth = max(self._depth, min(credits * self._run, room))
        self._group = max(1, min(self._run, self._depth // max(credits, 1)))

    @property
    def depth(self) -> int:
        """Batches of the stream requested but not taken, at most (see the module)."""
        return self._depth

    @property
    def count(self) -> int:
        """Servers numbered so far (numbers are never reused: GONE ones count)."""
        return len(self._servers)

    def endpoint(self, server: int) -> str:
        """Server ``server``'s endpoint: the one place a loader keeps them."""
        return self._servers[server].endpoint

    def describe(self, server: int) -> str:
        """``server``'s state for a message (``"down (busy: ...)"``)."""
        return self._servers[server].describe()

    def hellos_due(self, now: float) -> list[int]:
        """Servers not joined to send a HELLO to now: their control connection is up and
        their next try is due (each is then JOINING until :meth:`grant`, or until ``timeout``
        passes or :meth:`join_failed`)."""
        due = [i for i, s in enumerate(self._servers) if s.hello_due(now)]
        for i in due:
            self._servers[i].note = "HELLO sent, no answer yet"
        return due

    def note(self, server: int, text: str) -> None:
        """How ``server``'s join is going (for :meth:`describe`)."""
        self._servers[server].note = text

    def join_failed(self, server: int, now: float, *, retry: bool, why: str = "") -> None:
        """The join of ``server`` failed (``why``): it is DOWN; asked to join again after a
        backoff (:func:`~dataflow.client.servers.join_backoff`) when ``retry``, else only
        once its connection comes up anew — and at once whenever it does."""
        s = self._servers[server]
        s.enter(State.DOWN, now)
        s.failures += 1
        s.failure, s.note = why or s.note or "failed", ""
        s.next_hello = now + join_backoff(s.failures) if retry else float("inf")

    # -- the stream ------------------------------------------------------------------------------

    def follow(self, demand: Demand) -> bool:
        """Request the batches of the consumer's ``demand`` from now on.

        Returns:
            Whether it starts a new generation: the one before is abandoned (its outstanding
            requests stay counted against their servers' credits until answered, and their
            replies are then discarded).

        Raises:
            InternalError: ``demand`` is of an older generation, or of the same one but drops
                a batch not received yet.
        """
        fetch = self._fetch
        if fetch is not None and demand is fetch.demand:
            return False
        if fetch is not None and demand.gen == fetch.gen:
            fetch.follow(demand)
            return False
        if fetch is not None and demand.gen < fetch.gen:
            raise InternalError(f"stream generation {demand.gen} after {fetch.gen}")
        self._fetch = Fetch(demand)
        self._taken = 0
        return True

    @property
    def gen(self) -> int | None:
        """The generation of the stream requested, or None before the first."""
        return None if self._fetch is None else self._fetch.gen

    def _usable(self) -> list[int]:
        return [i for i, s in enumerate(self._servers) if s.state is State.UP]

    def _oldest(self, server: int) -> float | None:
        """When ``server``'s oldest outstanding request was sent (None: it holds none)."""
        first = next(iter(self._servers[server].outstanding.values()), None)
        return None if first is None else first.sent

    def _choose(self, holders: set[int], now: float) -> int | None:
        """The server to take the next request (:mod:`dataflow.client.shares`): a usable one
        with credit other than ``holders``; a stalled one only when no server that answers
        could take it, now or later. None: none now."""
        usable = self._usable()
        pool = [i for i in usable if i not in holders]
        answering = [i for i in pool
                     if now <= self._shares.stalled_at(i, self._oldest(i), usable)]
        pool = answering or pool
        held = {i: len(self._servers[i].outstanding) for i in pool}
        ready = {i for i in pool if held[i] < self._servers[i].credits}
        return self._shares.pick(pool, ready, usable, held) if ready else None

    def _holders(self, gen: int, index: int) -> set[int]:
        """The servers holding a request for batch ``index`` of generation ``gen`` alone
        (:func:`~dataflow.client.late.alone_at`: a request of several batches may be held up
        by another of them, so its server may be asked for this one alone)."""
        return alone_at([slot for s in self._servers for slot in s.outstanding.values()
                         if slot.gen == gen and index in slot.indexes])

    def assignments(self, taken: int, now: float) -> list[Slot]:
        """Requests to send now, given that the consumer took ``taken`` batches of the
        stream's generation (``taken`` is the index of the batch it takes next).

        Returns:
            The requests, batches to re-request first, then in stream order; the caller must
            send every one (:meth:`Slot.request` to its server).
        """
        fetch = self._fetch
        self._taken = taken
        out: list[Slot] = []
        while fetch is not None:
            index = fetch.peek(taken, self.depth, self._group)
            if index is None:
                break
            best = self._choose(self._holders(fetch.gen, index) if fetch.retrying(index)
                                else set(), now)
            if best is None:
                break
            retry = fetch.retrying(index)
            most = min(self._group, self._servers[best].group)
            count = 1 if retry else fetch.run(index, taken, self.depth, most)
            fetch.claim(index, count)
            self._req_ids += 1
            rows, tag = fetch.batch(index)
            parts: tuple[Part, ...] = ()
            if count > 1:
                batches = [fetch.batch(i) for i in range(index, index + count)]
                rows = np.concatenate([r for r, _ in batches])
                parts = tuple(Part(len(r), t) for r, t in batches)
            held = self._servers[best].outstanding
            limit = self._servers[best].ahead
            ahead = NO_ROWS if limit <= 0 else announced(
                (fetch.batch(i)[0] for i in range(index + count, fetch.demand.end)), limit)
            slot = Slot(best, self._req_ids, fetch.gen, index, rows, tag, retry, now,
                        queued=len(held) + 1, parts=parts, ahead=ahead)
            held[self._req_ids] = slot
            out.append(slot)
        return out

    def full(self, taken: int) -> bool:
        """True when only the consumer taking batches lets more requests go out."""
        return self.unblocked_at(taken) is not None

    def unblocked_at(self, taken: int) -> int | None:
        """When only the consumer taking batches lets more requests go out (it took
        ``taken``): how many it must have taken for the next one; else None."""
        if self._fetch is None:
            return None
        return self._fetch.unblocked_at(taken, self.depth, self._group)

    def on_reply(self, server: int, req_id: int, now: float) -> Reply | None:
        """A reply (batch or error) to ``req_id`` arrived from ``server``.

        Returns:
            The request it answers and its batches for which it is the first reply (open
            batches of the current generation), else None: none is (stale, late or
            duplicate: discard it).

        Raises:
            ProtocolError: ``server`` has no such request outstanding (nor forgotten).
        """
        s = self._servers[server]
        self.heard(server, now)
        slot = s.outstanding.pop(req_id, None)
        if slot is None:
            if req_id in s.forgotten:
                s.forgotten.discard(req_id)
                if s.state is State.UP:
                    self._shares.answered(server, now)
                return None
            raise ProtocolError(f"{s.endpoint}: reply to unknown request {req_id}")
        self._shares.answered(server, now, now - slot.sent, slot.queued)
        first = () if self._fetch is None else self._fetch.accept(slot)
        return Reply(slot, first) if first else None

    def again(self, reply: Reply, now: float) -> None:
        """``reply``'s batches are requested again (each alone): the server could not
        deliver the reply, or failed a request of several batches."""
        if self._fetch is not None and self._fetch.gen == reply.slot.gen:
            for index in reply.indexes:
                self._fetch.again(index, now)

    def outstanding(self, server: int) -> int:
        return len(self._servers[server].outstanding)

    # -- liveness -------------------------------------------------------------------------------

    def heard(self, server: int, now: float) -> None:
        """A message (any) arrived from ``server``."""
        self._servers[server].heard_from(now)

    def link(self, server: int, link: Hashable, up: bool, now: float) -> None:
        """Connection ``link`` of ``server`` (:data:`CONTROL` or a reader's) went up or down.

        A lost server whose control connection comes up is asked to join again at once.
        """
        self._servers[server].link(link, up, now)

    def lost(self, server: int, now: float, *, hello: bool = True) -> None:
        """``server`` is lost (stopping, restarted, or suspect for longer than ``grace``).

        Its open batches are requested again from the other servers before any batch not yet
        requested; every request it held is forgotten. It is asked
        to join again at once when ``hello`` and its control connection is up, else once its
        control connection comes up anew.
        """
        s = self._servers[server]
        if s.state is State.GONE:
            raise InternalError(f"{s.endpoint}: lost after it was removed")
        if s.state in (State.UP, State.SUSPECT):
            self._requeue(s, now)
            s.forgotten.update(s.outstanding)
            s.outstanding.clear()
        s.enter(State.DOWN, now)
        s.next_hello = now if hello else float("inf")

    def _requeue(self, s: ServerRecord, now: float) -> None:
        fetch = self._fetch
        if fetch is None:
            return
        covered = {i for o in self._servers if o.state is State.UP and o is not s
                   for slot in o.outstanding.values() if slot.gen == fetch.gen
                   for i in slot.indexes}
        fetch.requeue((i for slot in s.outstanding.values() if slot.gen == fetch.gen
                       for i in slot.indexes if i not in covered), now)

    def heartbeats_due(self, now: float) -> list[int]:
        """Joined servers to send a HEARTBEAT to now (each is then due again in
        ``heartbeat_s``)."""
        return [i for i, s in enumerate(self._servers) if s.heartbeat_due(now, self._heartbeat_s)]

    def check(self, now: float) -> list[Loss]:
        """Apply the liveness rules at ``now``.

        Returns:
            The servers lost now (suspect for longer than ``grace``) and those whose join
            attempt ran out of time (asked again after a backoff): the caller closes their
            data connections.

        Raises:
            ServerUnavailable: no server joined within ``timeout`` of the start, or the
                consumer waited ``timeout`` seconds with no usable server; naming every
                endpoint and its state.
        """
        gone = []
        for i, s in enumerate(self._servers):
            change = transition(s, now, silent_s=self._silent_s, grace=self._grace,
                                timeout=self._timeout)
            if change is Transition.SUSPECTED:
                s.enter(State.SUSPECT, now)
                self._requeue(s, now)
            elif change is Transition.RECOVERED:
                if s.broken:
                    s.forgotten.update(s.outstanding)
                    s.outstanding.clear()
                    s.broken = False
                s.enter(State.UP, now)
            elif change is Transition.LOST:
                self.lost(i, now)
                gone.append(Loss(i, joining=False))
            elif change is Transition.JOIN_EXPIRED:
                self.join_failed(i, now, retry=True,
                                 why=f"{s.note or 'joining'} for {self._timeout} s")
                gone.append(Loss(i, joining=True))
        self._check_start(now)
        self._check_stall(now)
        return gone

    def _members(self) -> list[ServerRecord]:
        return [s for s in self._servers if s.state is not State.GONE]

    def _check_start(self, now: float) -> None:
        if self._admitted or now - self._started <= self._timeout:
            return
        members = self._members()
        raise ServerUnavailable(
            ", ".join(s.endpoint for s in members) or "every server left",
            f"no server admitted this client within {self._timeout} s (a HELLO answered "
            "with INDEX and every reader connection answering); "
            + "; ".join(f"{s.endpoint}: {s.describe()}" for s in members))

    def _check_stall(self, now: float) -> None:
        if any(s.state is State.UP for s in self._servers) or not self._waiting():
            self._stalled_since = None
            return
        if self._stalled_since is None:
            self._stalled_since = now
        elif now - self._stalled_since > self._timeout:
            members = self._members()
            raise ServerUnavailable(
                ", ".join(s.endpoint for s in members) or "every server left",
                f"no server usable for {now - self._stalled_since:.1f} s (timeout "
                f"{self._timeout} s; states: "
                + "; ".join(f"{s.endpoint}: {s.describe()}" for s in members) + ")")

    def late(self, now: float) -> list[Late]:
        """Apply the request timeout at ``now`` (:func:`dataflow.client.late.find_late`): the
        batches found late, in order; those not ``failed`` are asked of another server by the
        next :meth:`assignments`."""
        if self._fetch is None:
            return []
        return find_late(self._fetch, self._servers, now, self._request_timeout)

    def _waiting(self) -> bool:
        """Whether the consumer needs a server now."""
        return self._fetch is not None and self._fetch.waiting(self._taken, self.depth)

    def next_deadline(self, now: float) -> float:
        """Seconds until a heartbeat or a liveness rule is due (for the poll)."""
        soonest = min((deadline(s, now, silent_s=self._silent_s, grace=self._grace,
                                timeout=self._timeout) for s in self._servers),
                      default=float("inf"))
        if self._stalled_since is not None:
            soonest = min(soonest, self._stalled_since + self._timeout - now)
        if not self._admitted:
            soonest = min(soonest, self._started + self._timeout - now)
        if self._fetch is not None:
            soonest = min(soonest, late_in(self._fetch, self._servers, now,
                                           self._request_timeout))
        return max(min(soonest, self._stall_in(now)), 0.0)

    def _stall_in(self, now: float) -> float:
        """Seconds until a server that answers now is stalled (which may let another
        server take a request: :meth:`_choose`)."""
        usable = self._usable()
        at = (self._shares.stalled_at(i, self._oldest(i), usable) for i in usable)
        return min((t - now for t in at if t >= now), default=math.inf)
