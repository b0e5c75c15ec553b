"""The messages of the wire protocol: kinds, error kinds and one frozen dataclass per kind.

Kinds (client -> server): HELLO, REQUEST, HEARTBEAT, BYE, STATS.
Kinds (server -> client): INDEX, BATCH, ERROR, HEARTBEAT, STATS_REPLY.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from dataflow.errors import ErrorKind, ProtocolError

MAGIC = "dataflow"
VERSION = 2
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
OFFSETS_SUFFIX = ".offsets"
ITEMSIZE = {name: np.dtype(name).itemsize for name in DTYPES}

Buffer = bytes | memoryview


class Kind(IntEnum):
    """Message kinds; the value is the header's ``kind`` field."""

    HELLO = 1
    INDEX = 2
    REQUEST = 3
    BATCH = 4
    ERROR = 5
    HEARTBEAT = 6
    BYE = 7
    STATS = 8
    STATS_REPLY = 9


@dataclass(frozen=True)
class ShmOffer:
    """A client's shared-memory segment, offered in HELLO (:mod:`dataflow.shm`).

    Attributes:
        name: the segment's file name in ``/dev/shm`` (``dataflow-<uid>-<pidns>-<pid>-<hex>``).
        slots: its slot count (at most this many requests carry a slot at once).
        slot_bytes: bytes of one slot (a multiple of 64).
    """

    name: str
    slots: int
    slot_bytes: int


@dataclass(frozen=True)
class ShmRef:
    """Where a BATCH's arrays lie instead of in frames: the descriptor of a shared-memory reply.

    Attributes:
        slot: the slot the client lent with the REQUEST (its offset in the session's segment
            is :meth:`dataflow.shm.Geometry.offset`).
        nbytes: bytes written there, laid out as :class:`~dataflow.wire.BatchLayout` says
            (equal to its ``nbytes``).
    """

    slot: int
    nbytes: int


@dataclass(frozen=True)
class Hello:
    """Client -> server: open a session.

    Attributes:
        credits: requests the client may keep outstanding, at most (it may use fewer of
            those granted); the server grants ``min(credits, --max-credits)``.
        client: free-form client description for the server's logs (e.g. ``"rank 3"``).
        batch_size: most samples the client will ask for in one REQUEST, or None (not on the
            wire; a client that predates the field): the server's ``--max-request-samples``
            applies. A REQUEST of more samples is refused.
        columns: the served fields the client's batches hold (names or parent names,
            :mod:`dataflow.subset`), or None (not on the wire): every field. The server refuses
            a HELLO naming a field it does not serve.
        shm: the client's shared-memory segment for this session, or None (not on the wire):
            TCP frames only. A server that can open it answers its nonce in INDEX ``shm``.
        group: most batches one REQUEST will carry (its ``parts``); 1 (not on the wire): one.
            The server's samples per request for the session are ``batch_size x group``.
    """

    credits: int
    client: str = ""
    batch_size: int | None = None
    columns: tuple[str, ...] | None = None
    shm: ShmOffer | None = None
    group: int = 1


@dataclass(frozen=True)
class Index:
    """Server -> client: the dataset index (reply to HELLO).

    Attributes:
        credits: credits granted to this client.
        workers: reader processes of the server.
        index_json: ``DatasetIndex.to_json()``; travels as one buffer frame.
        session: this client's session token; the client uses it (ASCII) as the routing id of
            its data connections.
        data: endpoints of the server's reader processes. Replies to REQUESTs (BATCH, and
            ERROR for a failed read) come straight from a reader over the client's data
            connection to it; the client connects one DEALER to each and sends a HEARTBEAT
            there, which the reader answers once the connection can carry replies.
        transform: the server's ``--transform`` (``module:function``, for messages such as
            a request that timed out), or "" for none; optional: left out when "" (the header
            of a server without a transform is the old one).
        shm: the nonce (hex) the server read from the HELLO's shared-memory segment: its proof
            that it opened the client's file, so this session's REQUESTs may lend slots; ""
            (not on the wire): none offered, or the server cannot or will not use it.
        group: most batches one REQUEST of this session may carry (at most the HELLO's);
            1 (not on the wire): one.
        ahead: most samples a REQUEST of this session may announce in its ``ahead`` (the
            server's ``--cache-plan-window``: its readers' caches evict by the plans sessions
            announce); 0 (not on the wire): announce none.
    """

    credits: int
    workers: int
    index_json: str
    session: str = ""
    data: tuple[str, ...] = ()
    transform: str = ""
    shm: str = ""
    group: int = 1
    ahead: int = 0


def as_ranges(ranges: Any) -> np.ndarray:
    """``ranges`` as a C-contiguous int64 array of shape (n, 3).

    Raises:
        ProtocolError: ``ranges`` is not a sequence of ``(shard, start, stop)`` integer triples.
    """
    try:
        arr = np.asarray(ranges, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"REQUEST `ranges` must be (shard, start, stop) integer triples: "
                            f"{e}") from e
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 3)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ProtocolError(f"REQUEST `ranges` must have shape (n, 3). Found: {arr.shape}")
    return np.ascontiguousarray(arr)


RangesLike = np.ndarray | Sequence[Sequence[int]]


class BatchTag(NamedTuple):
    """Which batch of which plan a REQUEST reads, for the server's transform.

    Attributes:
        seed: the DataLoader's seed.
        epoch: the epoch.
        batch: the global batch index in the epoch (:mod:`dataflow.plan`).
    """

    seed: int = 0
    epoch: int = 0
    batch: int = 0


NO_TAG = BatchTag()


class Part(NamedTuple):
    """One batch of a REQUEST that carries several: its next ``rows`` rows of ``ranges``, and
    its tag (for the server's transform, which runs on each batch alone)."""

    rows: int
    tag: BatchTag


@dataclass(frozen=True, eq=False, init=False)
class Request:
    """Client -> server: read one batch, or several (``parts``) answered by one BATCH.

    Attributes:
        req_id: client-chosen id echoed in the reply, ``0 <= req_id < 2**63``.
        ranges: int64 array of shape (n, 3), one ``(shard, start, stop)`` row per range; built
            from an array or any sequence of triples. Travels as one raw frame.
        tag: the batch's (seed, epoch, global batch index), from which the server's transform
            gets its per-batch seed (:mod:`dataflow.transform`). Not on the wire when all 0.
        slot: the shared-memory slot lent for the reply (a session whose INDEX proved the
            segment), or -1 (not on the wire): the reply comes in TCP frames.
        parts: 2 or more batches (at most the session's HELLO ``group``), in order, whose
            ``rows`` add up to the rows of ``ranges``; each is read and transformed as its
            own request would be, and the reply is one BATCH of their samples in order, with
            its ``parts``. ``tag`` is then unused (NO_TAG). Empty (not on the wire): one batch.
        ahead: the samples the session reads after this request, in order, as
            ``(shard, start, stop)`` rows (int64, shape (m, 3); one raw frame after
            ``ranges``): a window of its plan, at most the INDEX's ``ahead`` samples, for the
            server's cache to keep what is read soonest. A hint only: what is served never
            depends on it. Empty (not on the wire): none announced.
    """

    req_id: int
    ranges: np.ndarray
    tag: BatchTag
    slot: int
    parts: tuple[Part, ...]
    ahead: np.ndarray

    def __init__(self, req_id: int, ranges: RangesLike, tag: BatchTag = NO_TAG,
                 slot: int = -1, parts: Sequence[tuple[int, BatchTag]] = (),
                 ahead: RangesLike = ()) -> None:
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "ranges", as_ranges(ranges))
        object.__setattr__(self, "tag", BatchTag(*tag))
        object.__setattr__(self, "slot", slot)
        object.__setattr__(self, "parts", tuple(Part(rows, BatchTag(*tag))
                                                for rows, tag in parts))
        object.__setattr__(self, "ahead", as_ranges(ahead))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Request) and self.req_id == other.req_id
                and np.array_equal(self.ranges, other.ranges) and self.tag == other.tag
                and self.slot == other.slot and self.parts == other.parts
                and np.array_equal(self.ahead, other.ahead))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ArraySpec:
    """Type and shape of one array of a BATCH.

    Attributes:
        name: field name, or ``field + ".offsets"`` for a ragged field's offsets.
        dtype: one of :data:`DTYPES`.
        shape: array shape; fixed fields are ``(batch, *shape)``, ragged values ``(n,)``,
            ragged offsets ``(batch + 1,)``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class BatchMsg:
    """Server -> client: one batch, the reply to a REQUEST.

    Attributes:
        req_id: the request's id.
        size: samples in the batch.
        arrays: one spec per array, in frame order. A fixed field is one array; a ragged
            field ``f`` is two: ``f`` (1-D values) then ``f.offsets`` (int64, ``size + 1``).
        ragged: ``(field, kind)`` for every ragged field.
        data: the arrays (C-contiguous, matching ``arrays``); empty in a header-only decode.
            When sent ``apart``, an array may also be given as the sequence of its pieces
            (:class:`~dataflow.wire.BatchLayout`: each batch's rows), never joined by the
            sender; a decoded message holds whole arrays.
        skipped: samples of the request not served because they were damaged (server
            ``--on-error skip``); ``size + skipped`` is the request's sample count. Not on the
            wire when 0.
        shm: where the arrays lie in the client's shared memory (no buffer frames follow the
            header), or None (not on the wire): in frames.
        parts: the samples of each batch, in order, of a reply to a REQUEST with ``parts``
            (one entry each; they add up to ``size``); a ragged field's offsets then start
            again at 0 for each batch (``size + len(parts)`` of them: each batch's own
            ``n + 1``), its values follow one another. Empty (not on the wire): one batch.
        apart: each batch's rows of every array but a ragged field's values travel in frames of
            their own (needs ``parts``), so the receiver views each batch where it arrived and
            the sender never joins them. False (not on the wire): each array whole.
        left_out: which of the request's samples are the ``skipped`` ones, as runs
            ``(start, stop, start, stop, ...)`` of positions in the request's samples (in the
            order its ranges name them, over all its parts), increasing and disjoint, adding
            up to ``skipped``; at most :data:`~dataflow.wire.fields.MAX_LEFT_OUT_RUNS` runs.
            Empty (not on the wire): none skipped, or the server does not say which.
    """

    req_id: int
    size: int
    arrays: tuple[ArraySpec, ...]
    ragged: tuple[tuple[str, str], ...] = ()
    data: tuple[np.ndarray | Sequence[np.ndarray], ...] = field(default=(), compare=False)
    skipped: int = 0
    shm: ShmRef | None = None
    parts: tuple[int, ...] = ()
    left_out: tuple[int, ...] = ()
    apart: bool = False


@dataclass(frozen=True, init=False)
class ErrorMsg:
    """Server -> client: a request (``req_id``) or a message (``req_id == -1``) failed.

    Attributes:
        req_id: id of the failed request, or -1.
        kind: what failed; built from an :class:`ErrorKind` or its value.
        message: server-side message (truncated to ``MAX_TEXT`` characters on the wire).
    """

    req_id: int
    kind: ErrorKind
    message: str

    def __init__(self, req_id: int, kind: ErrorKind | str, message: str) -> None:
        try:
            error_kind = ErrorKind(kind)
        except ValueError as e:
            raise ProtocolError(f"ERROR `kind` must be one of {[k.value for k in ErrorKind]}. "
                                f"Found: {kind!r}"[:400]) from e
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "kind", error_kind)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True)
class Heartbeat:
    """Either way: I am alive. A server answers each HEARTBEAT with one."""


@dataclass(frozen=True)
class Bye:
    """Client -> server: forget my session now."""


@dataclass(frozen=True)
class Stats:
    """Client -> server: ask for counters."""


@dataclass(frozen=True)
class StatsReply:
    """Server -> client: counters (``name -> int`` or ``name -> list[int]``)."""

    counters: Mapping[str, int | Sequence[int]]


Message = Hello | Index | Request | BatchMsg | ErrorMsg | Heartbeat | Bye | Stats | StatsReply
