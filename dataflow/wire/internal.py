"""Messages between a loader server's frontend and its reader processes (private ipc socket).

They are defined and travel as the wire's messages do (:mod:`dataflow.wire.table`): a JSON
header frame with the fields :data:`INTERNAL_SPECS` lists for the kind, each validated, then
the body's raw frames; nothing is pickled. Their kinds are numbered apart from the wire's, so
neither codec decodes the other's messages.

    TASK      frontend -> reader: serve request ``req_id`` of session ``token`` (its ranges
              as one int64 frame, passed on as the REQUEST brought them)
    STARTED   reader -> frontend, once: my data socket is bound at ``endpoint``
    SENT      reader -> frontend: the reply to ``req_id`` of ``token`` is being handed to
              ZeroMQ (what the frontend counts of it; damaged samples left out as one int64
              frame of ``(shard, samples)`` pairs; what it did to the reader's cache)
    LOST      reader -> frontend: that reply was dropped, ``why``
    DONE      reader -> frontend: ``nbytes`` of the replies to ``token`` left the reader
              (written by ZeroMQ, or dropped)
    ATTACHED  reader -> frontend: a data connection of routing id ``token`` said HEARTBEAT
    FORGET    frontend -> every reader: session ``token`` is freed (its announced window, if
              any, is dropped: :mod:`dataflow.server.eviction`)

``token`` is the client's session token: the routing id of its data connections, and the key
of its session at the frontend. A ROUTER prepends the peer's routing id, which is not part of
these messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

import numpy as np

from dataflow.errors import ProtocolError
from dataflow.wire.codec import COLUMNS, PARTS, REQ_ID, TAG, RangesBody, shm_offer
from dataflow.wire.fields import (
    INT64_MAX,
    MAX_RANGES,
    MAX_SHM_SLOTS,
    MAX_TEXT,
    BodyCodec,
    FieldSpec,
    boolean,
    check_sizes,
    frame_sizes,
    integer,
    routing_id,
    text,
)
from dataflow.wire.messages import NO_TAG, BatchTag, Part, ShmOffer
from dataflow.wire.table import Codec, MessageSpec


class InternalKind(IntEnum):
    """Kinds of the frontend <-> reader messages; the value is the header's ``kind``."""

    TASK = 101
    STARTED = 102
    SENT = 103
    LOST = 104
    DONE = 105
    ATTACHED = 106
    FORGET = 107


@dataclass(frozen=True)
class Task:
    """A request of a session, from its admission to the reader that serves it: queued by the
    frontend's :class:`~dataflow.server.ledger.Ledger`, held by the reader's
    :class:`~dataflow.server.pool.Worker` entry, sent to it.

    Attributes:
        token: the client's session token.
        req_id: the request's id.
        ranges: int64 (n, 3) ``(shard, start, stop)`` rows, as decoded from the REQUEST.
        tag: the REQUEST's (seed, epoch, global batch index), for the transform.
        columns: the fields the reply keeps (the session's HELLO ``columns`` when the request
            was admitted), or None: all.
        attempts: readers that exited holding it before.
        shm: the session's shared-memory segment, when the REQUEST lent a slot of it, else
            None.
        slot: the slot lent (the reader writes the reply's arrays there), or -1.
        parts: the REQUEST's batches (:class:`~dataflow.wire.Request`), or empty: one.
        ahead: the REQUEST's ``ahead`` (the rows its session reads next, int64 (m, 3)), for
            the reader's plan-aware cache; empty: none.
    """

    token: bytes
    req_id: int
    ranges: np.ndarray
    tag: BatchTag = NO_TAG
    columns: tuple[str, ...] | None = None
    attempts: int = 0
    shm: ShmOffer | None = None
    slot: int = -1
    parts: tuple[Part, ...] = ()
    ahead: np.ndarray = field(default_factory=lambda: np.empty((0, 3), dtype=np.int64))


@dataclass(frozen=True)
class Started:
    """A reader serves; its data socket is bound at ``endpoint``."""

    endpoint: str


@dataclass(frozen=True)
class Sent:
    """A reader is handing the reply to request ``req_id`` of session ``token`` to ZeroMQ:
    what the frontend counts of it.

    Attributes:
        nbytes: bytes of the reply.
        samples: samples in the reply's BATCH (0 for an ERROR).
        too_large: the reply is an ERROR because the batch exceeded ``--max-reply-bytes``.
        skips: ``(shard, samples)`` for each shard of which the reply left damaged samples out
            (``--on-error skip``); empty when none were.
        cache_hits: samples the task found in the reader's decoded-sample cache
            (:mod:`~dataflow.server.samplecache`).
        cache_misses: samples it looked for there and did not find.
        cache_evictions: entries it evicted.
        cache_bytes: bytes the reader's cache holds in memory after it.
        cache_disk_hits: samples it found in the cache's disk tier.
        cache_disk_evictions: files it removed from the disk tier.
        cache_disk_bytes: bytes of the disk tier's files after it.
    """

    token: bytes
    req_id: int
    nbytes: int
    samples: int = 0
    too_large: bool = False
    skips: tuple[tuple[int, int], ...] = ()
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    cache_bytes: int = 0
    cache_disk_hits: int = 0
    cache_disk_evictions: int = 0
    cache_disk_bytes: int = 0


@dataclass(frozen=True)
class Lost:
    """A reader dropped the reply to request ``req_id`` of session ``token``; ``why``."""

    token: bytes
    req_id: int
    why: str


@dataclass(frozen=True)
class Done:
    """``nbytes`` of the replies to session ``token`` a reader reported SENT are no longer held
    by it: ZeroMQ wrote them to the client's connection (or dropped them with it), or the
    reader dropped them (LOST)."""

    token: bytes
    nbytes: int


@dataclass(frozen=True)
class Attached:
    """A data connection whose routing id is ``token`` said HEARTBEAT to a reader."""

    token: bytes


@dataclass(frozen=True)
class Forget:
    """Session ``token`` is freed: a reader drops what it keeps for it (its announced
    window)."""

    token: bytes


Internal = Task | Started | Sent | Lost | Done | Attached | Forget


class SkipsBody(BodyCodec):
    """SENT: ``n`` int64 ``(shard, samples)`` pairs as one frame (empty when ``n`` is 0)."""

    attr = "skips"
    empty = ()
    fields = (FieldSpec("n", integer(0, MAX_RANGES)),)

    def encode(self, msg: Sent) -> tuple[dict[str, Any], list[Any]]:
        data = np.asarray(msg.skips, dtype="<i8").tobytes() if msg.skips else b""
        return {"n": len(msg.skips)}, [data]

    def decode(self, head: Sent, described: dict[str, Any], frames: Sequence[Any]) -> Sent:
        check_sizes("SENT", [described["n"] * 16], frame_sizes(frames))
        if not described["n"]:
            return head
        pairs = np.frombuffer(frames[0], dtype="<i8").reshape(-1, 2)
        if (pairs < 0).any():
            raise ProtocolError("SENT `skips` must be non-negative (shard, samples) pairs")
        return replace(head, skips=tuple((a, b) for a, b in pairs.tolist()))


_TOKEN = FieldSpec("token", routing_id, dump=lambda t: t.decode("latin-1"))
_NBYTES = FieldSpec("nbytes", integer(0, INT64_MAX))

INTERNAL_SPECS: dict[InternalKind, MessageSpec] = {
    InternalKind.TASK: MessageSpec(Task, (
        _TOKEN, REQ_ID, TAG, COLUMNS,
        FieldSpec("attempts", integer(0, INT64_MAX), optional=True, omit=0),
        FieldSpec("shm", shm_offer, dump=lambda o: [o.name, o.slots, o.slot_bytes],
                  optional=True),
        FieldSpec("slot", integer(-1, MAX_SHM_SLOTS - 1), optional=True, omit=-1),
        PARTS,
    ), RangesBody("TASK")),
    InternalKind.STARTED: MessageSpec(Started, (FieldSpec("endpoint", text(MAX_TEXT)),)),
    InternalKind.SENT: MessageSpec(Sent, (
        _TOKEN, REQ_ID, _NBYTES,
        FieldSpec("samples", integer(0, INT64_MAX)),
        FieldSpec("too_large", boolean, optional=True, omit=False),
        *(FieldSpec(name, integer(0, INT64_MAX), optional=True, omit=0)
          for name in ("cache_hits", "cache_misses", "cache_evictions", "cache_bytes",
                       "cache_disk_hits", "cache_disk_evictions", "cache_disk_bytes")),
    ), SkipsBody()),
    InternalKind.LOST: MessageSpec(Lost, (
        _TOKEN, REQ_ID, FieldSpec("why", text(MAX_TEXT), dump=lambda s: s[:MAX_TEXT]),
    )),
    InternalKind.DONE: MessageSpec(Done, (_TOKEN, _NBYTES)),
    InternalKind.ATTACHED: MessageSpec(Attached, (_TOKEN,)),
    InternalKind.FORGET: MessageSpec(Forget, (_TOKEN,)),
}

INTERNAL = Codec(INTERNAL_SPECS)
"""The codec of the frontend <-> reader messages."""


def encode_internal(msg: Internal) -> list[Any]:
    """Frames of an internal message."""
    return INTERNAL.encode(msg)


def decode_internal(frames: Sequence[Any]) -> Internal:
    """Decode and validate an internal message.

    Raises:
        ProtocolError: malformed: the kind, a missing frame, or a field (named) is invalid.
    """
    msg: Internal = INTERNAL.decode(frames)
    return msg
