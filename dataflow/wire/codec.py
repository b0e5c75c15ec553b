"""The wire protocol's table of message kinds (:data:`SPECS`) and its codec (:data:`WIRE`).

A message is one small JSON header frame followed by zero or more raw buffer frames (see
:mod:`dataflow.wire.table`); adding a kind or a field is one entry in :data:`SPECS`: its
dataclass, its header fields, an optional rule between fields and an optional
:class:`~dataflow.wire.fields.BodyCodec` for its buffer frames.

:func:`decode` validates everything and raises :class:`~dataflow.errors.ProtocolError` on
anything malformed, truncated, oversized or of another version, also on what this module did
not foresee: a receiver never dies of a message. :func:`parse_header` validates the header
alone, and its :meth:`~dataflow.wire.table.Header.message` the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dataflow.checks import as_int
from dataflow.errors import FieldError, ProtocolError
from dataflow.shm.segment import NONCE_BYTES, is_segment_name
from dataflow.wire.arrays import ArraysBody, array_specs, check_batch, ragged_fields
from dataflow.wire.fields import (
    INT64_MAX,
    MAX_BATCH_SIZE,
    MAX_CREDITS,
    MAX_GROUP,
    MAX_INDEX_BYTES,
    MAX_LEFT_OUT_RUNS,
    MAX_MESSAGE_BYTES,
    MAX_NAME,
    MAX_RANGES,
    MAX_SHM_SLOTS,
    MAX_TEXT,
    MAX_WORKERS,
    BodyCodec,
    FieldSpec,
    boolean,
    check_sizes,
    choice,
    column_names,
    counters,
    frame_sizes,
    hex_text,
    integer,
    string_list,
    text,
)
from dataflow.wire.messages import (
    NO_TAG,
    BatchMsg,
    BatchTag,
    Buffer,
    Bye,
    ErrorKind,
    ErrorMsg,
    Heartbeat,
    Hello,
    Index,
    Kind,
    Message,
    Part,
    Request,
    ShmOffer,
    ShmRef,
    Stats,
    StatsReply,
)
from dataflow.wire.table import Codec, Header, MessageSpec

RANGE_BYTES = 3 * 8


class IndexBody(BodyCodec):
    """INDEX: the dataset index JSON as one UTF-8 frame of ``nbytes`` bytes."""

    attr = "index_json"
    empty = ""
    fields = (FieldSpec("nbytes", integer(0, MAX_INDEX_BYTES)),)

    def encode(self, msg: Index) -> tuple[dict[str, Any], list[Any]]:
        body = msg.index_json.encode("utf-8")
        return {"nbytes": len(body)}, [body]

    def decode(self, head: Index, described: dict[str, Any], frames: Sequence[Any]) -> Index:
        check_sizes("INDEX", [described["nbytes"]], frame_sizes(frames))
        try:
            text_ = bytes(memoryview(frames[0])).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"INDEX payload is not UTF-8: {e}") from e
        return replace(head, index_json=text_)


class RangesBody(BodyCodec):
    """``n`` int64 ``(shard, start, stop)`` rows as one frame, decoded once (a REQUEST's, and
    the TASK passing it to a reader), then its ``ahead``: ``ahead`` more rows as a second
    frame when there are any (a header without ``ahead`` announces none).

    Args:
        what: the kind, as errors name it.
    """

    attr = "ranges"
    empty = np.empty((0, 3), dtype=np.int64)
    fields = (FieldSpec("n", integer(1, MAX_RANGES)),
              FieldSpec("ahead", integer(0, MAX_RANGES), optional=True, omit=0))

    def __init__(self, what: str) -> None:
        self._what = what

    def encode(self, msg: Any) -> tuple[dict[str, Any], list[Any]]:
        if not len(msg.ahead):
            return {"n": len(msg.ranges)}, [msg.ranges.tobytes()]
        return ({"n": len(msg.ranges), "ahead": len(msg.ahead)},
                [msg.ranges.tobytes(), msg.ahead.tobytes()])

    def decode(self, head: Any, described: dict[str, Any], frames: Sequence[Any]) -> Any:
        ahead = described.get("ahead", 0)
        check_sizes(self._what, [described["n"] * RANGE_BYTES,
                                 *([ahead * RANGE_BYTES] if ahead else [])], frame_sizes(frames))
        parts = getattr(head, "parts", ())
        if parts and sum(p.rows for p in parts) != described["n"]:
            raise ProtocolError(f"{self._what} `parts` name {sum(p.rows for p in parts)} rows "
                                f"of its {described['n']} ranges")
        ranges = np.frombuffer(frames[0], dtype="<i8").reshape(-1, 3)
        if not ahead:
            return replace(head, ranges=ranges)
        return replace(head, ranges=ranges,
                       ahead=np.frombuffer(frames[1], dtype="<i8").reshape(-1, 3))


REQ_ID = FieldSpec("req_id", integer(0, INT64_MAX))


def batch_tag(v: Any) -> BatchTag:
    """A REQUEST's ``tag``: ``[seed, epoch, batch]``, integers in ``[0, 2**63)``."""
    if not isinstance(v, list) or len(v) != 3 or not all(
            as_int(x) is not None and 0 <= x <= INT64_MAX for x in v):
        raise FieldError(f"must be [seed, epoch, batch], integers in [0, {INT64_MAX}]")
    return BatchTag(*v)


def shm_offer(v: Any) -> ShmOffer:
    """HELLO ``shm``: ``[name, slots, slot_bytes]``: a segment name of :mod:`dataflow.shm`,
    1 to :data:`MAX_SHM_SLOTS` slots of a positive multiple of 64 bytes, at most
    :data:`~dataflow.wire.fields.MAX_MESSAGE_BYTES` each."""
    if not isinstance(v, list) or len(v) != 3 or not isinstance(v[0], str):
        raise FieldError("must be [name, slots, slot_bytes]")
    name, slots, slot_bytes = v
    if not is_segment_name(name):
        raise FieldError("name must be dataflow-<uid>-<pidns>-<pid>-<32 hex digits>")
    integer(1, MAX_SHM_SLOTS)(slots)
    if as_int(slot_bytes) is None or not 0 < slot_bytes <= MAX_MESSAGE_BYTES or slot_bytes % 64:
        raise FieldError(f"slot_bytes must be a multiple of 64 in [64, {MAX_MESSAGE_BYTES}]")
    return ShmOffer(name, slots, slot_bytes)


def shm_ref(v: Any) -> ShmRef:
    """BATCH ``shm``: ``[slot, nbytes]``, integers in ``[0, MAX_SHM_SLOTS)`` and
    ``[0, MAX_MESSAGE_BYTES]``."""
    if (not isinstance(v, list) or len(v) != 2 or as_int(v[0]) is None
            or not 0 <= v[0] < MAX_SHM_SLOTS or as_int(v[1]) is None
            or not 0 <= v[1] <= MAX_MESSAGE_BYTES):
        raise FieldError(f"must be [slot, nbytes]: a slot in [0, {MAX_SHM_SLOTS}) and bytes in "
                         f"[0, {MAX_MESSAGE_BYTES}]")
    return ShmRef(v[0], v[1])


def request_parts(v: Any) -> tuple[Part, ...]:
    """A REQUEST's ``parts``: 2 to :data:`MAX_GROUP` ``[rows, seed, epoch, batch]``, each of
    1 or more rows, integers in ``[0, 2**63)``."""
    if not isinstance(v, list) or not 2 <= len(v) <= MAX_GROUP:
        raise FieldError(f"must be a list of 2 to {MAX_GROUP} [rows, seed, epoch, batch]")
    out = []
    for p in v:
        if (not isinstance(p, list) or len(p) != 4
                or not all(as_int(x) is not None and 0 <= x <= INT64_MAX for x in p)
                or p[0] < 1):
            raise FieldError("entries must be [rows, seed, epoch, batch]: integers in "
                             f"[0, {INT64_MAX}], rows at least 1")
        out.append(Part(p[0], BatchTag(*p[1:])))
    return tuple(out)


def batch_parts(v: Any) -> tuple[int, ...]:
    """A BATCH's ``parts``: 2 to :data:`MAX_GROUP` sample counts."""
    if (not isinstance(v, list) or not 2 <= len(v) <= MAX_GROUP
            or not all(as_int(x) is not None and 0 <= x <= INT64_MAX for x in v)):
        raise FieldError(f"must be a list of 2 to {MAX_GROUP} sample counts")
    return tuple(v)


def sample_runs(v: Any) -> tuple[int, ...]:
    """A BATCH's ``left_out``: 1 to :data:`MAX_LEFT_OUT_RUNS` runs ``[start, stop, ...]`` of
    sample positions, each non-empty, increasing and disjoint."""
    if (not isinstance(v, list) or not 2 <= len(v) <= 2 * MAX_LEFT_OUT_RUNS or len(v) % 2
            or not all(as_int(x) is not None and 0 <= x <= INT64_MAX for x in v)
            or any(a >= b for a, b in zip(v, v[1:], strict=False))):
        raise FieldError(f"must be 1 to {MAX_LEFT_OUT_RUNS} runs [start, stop, ...] of "
                         "increasing sample positions")
    return tuple(v)


def check_request(msg: Request) -> None:
    """A REQUEST with ``parts`` tags each of them, not itself."""
    if msg.parts and msg.tag != NO_TAG:
        raise ProtocolError("REQUEST with `parts` must have no `tag` (each part has its own)")


TAG = FieldSpec("tag", batch_tag, dump=list, optional=True, omit=NO_TAG)
PARTS = FieldSpec("parts", request_parts, dump=lambda ps: [[p.rows, *p.tag] for p in ps],
                  optional=True, omit=())
COLUMNS = FieldSpec("columns", column_names, dump=list, optional=True)


SPECS: dict[Kind, MessageSpec] = {
    Kind.HELLO: MessageSpec(Hello, (
        FieldSpec("credits", integer(1, MAX_CREDITS)),
        FieldSpec("client", text(MAX_NAME), dump=lambda s: s[:MAX_NAME]),
        FieldSpec("batch_size", integer(1, MAX_BATCH_SIZE), optional=True),
        COLUMNS,
        FieldSpec("shm", shm_offer, dump=lambda o: [o.name, o.slots, o.slot_bytes],
                  optional=True),
        FieldSpec("group", integer(1, MAX_GROUP), optional=True, omit=1),
    )),
    Kind.INDEX: MessageSpec(Index, (
        FieldSpec("credits", integer(1, MAX_CREDITS)),
        FieldSpec("workers", integer(0, MAX_WORKERS)),
        FieldSpec("session", text(MAX_NAME)),
        FieldSpec("data", string_list(1024, MAX_NAME), dump=list),
        FieldSpec("transform", text(MAX_NAME), dump=lambda s: s[:MAX_NAME], optional=True,
                  omit=""),
        FieldSpec("shm", hex_text(2 * NONCE_BYTES), optional=True, omit=""),
        FieldSpec("group", integer(1, MAX_GROUP), optional=True, omit=1),
        FieldSpec("ahead", integer(0, INT64_MAX), optional=True, omit=0),
    ), IndexBody()),
    Kind.REQUEST: MessageSpec(Request, (
        REQ_ID, TAG, FieldSpec("slot", integer(-1, MAX_SHM_SLOTS - 1), optional=True, omit=-1),
        PARTS,
    ), RangesBody("REQUEST"), check_request),
    Kind.BATCH: MessageSpec(BatchMsg, (
        REQ_ID,
        FieldSpec("size", integer(0, INT64_MAX)),
        FieldSpec("arrays", array_specs,
                  dump=lambda a: [[s.name, s.dtype, list(s.shape)] for s in a]),
        FieldSpec("ragged", ragged_fields, dump=lambda r: [list(p) for p in r]),
        FieldSpec("skipped", integer(0, INT64_MAX), optional=True, omit=0),
        FieldSpec("shm", shm_ref, dump=lambda r: [r.slot, r.nbytes], optional=True),
        FieldSpec("parts", batch_parts, dump=list, optional=True, omit=()),
        FieldSpec("left_out", sample_runs, dump=list, optional=True, omit=()),
        FieldSpec("apart", boolean, optional=True, omit=False),
    ), ArraysBody(), check_batch, varies="req_id"),
    Kind.ERROR: MessageSpec(ErrorMsg, (
        FieldSpec("req_id", integer(-1, INT64_MAX)),
        FieldSpec("kind", choice({k.value: k for k in ErrorKind}), key="error",
                  dump=lambda k: k.value),
        FieldSpec("message", text(MAX_TEXT), dump=lambda s: s[:MAX_TEXT]),
    )),
    Kind.HEARTBEAT: MessageSpec(Heartbeat),
    Kind.BYE: MessageSpec(Bye),
    Kind.STATS: MessageSpec(Stats),
    Kind.STATS_REPLY: MessageSpec(StatsReply, (
        FieldSpec("counters", counters, dump=lambda c: {k: v if isinstance(v, int) else list(v)
                                                        for k, v in c.items()}),
    )),
}

WIRE = Codec(SPECS)
"""The codec of the wire protocol (client <-> server)."""


def kind_of(msg: Message) -> Kind:
    """The :class:`Kind` of a message object."""
    return Kind(WIRE.kind_of(msg))


def encode(msg: Message) -> list[Buffer]:
    """Frames of ``msg`` (:meth:`Codec.encode` of :data:`WIRE`)."""
    return WIRE.encode(msg)


def parse_header(header: Any) -> Header:
    """A wire header frame, decoded and validated (:meth:`Codec.parse_header`)."""
    return WIRE.parse_header(header)


def decode_header(header: Any) -> Message:
    """The header-only message of a wire header frame (:meth:`Codec.decode_header`)."""
    return WIRE.decode_header(header)


def decode(frames: Sequence[Any]) -> Message:
    """Decode and validate a whole wire message (:meth:`Codec.decode`)."""
    return WIRE.decode(frames)
