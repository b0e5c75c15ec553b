"""The wire protocol between loader servers and trainer clients: the one module for it.

A message is one small JSON header frame followed by zero or more raw buffer frames::

    [header, buffer_0, buffer_1, ...]

The header is a JSON object ``{"magic": "dataflow", "version": 1, "kind": K, ...}`` holding the
fields of one of the frozen dataclasses below. Arrays travel as raw little-endian bytes, never
pickled; an array of ``nbytes`` bytes is cut into ``ceil(nbytes / MAX_FRAME_BYTES)`` frames
(one empty frame when ``nbytes == 0``) so no frame exceeds 8 MiB, and the receiver reassembles
them into one buffer (see :func:`frame_sizes`).

:func:`decode` validates every field (types, ranges, frame counts and sizes, dtypes, shapes,
ragged offsets) and raises :class:`~dataflow.errors.ProtocolError` on anything malformed,
truncated, oversized or of another protocol version. A receiver that wants to place array
frames itself (``recv_into``) decodes the header with :func:`decode_header`, receives the
frames :func:`frame_sizes` announces and checks ragged offsets with :func:`check_offsets`.

Kinds (client -> server): HELLO, REQUEST, HEARTBEAT, BYE, STATS.
Kinds (server -> client): INDEX, BATCH, ERROR, HEARTBEAT, STATS_REPLY.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from dataflow.batch import RAGGED_KINDS, Batch, Ragged, batch_len
from dataflow.errors import ProtocolError

MAGIC = "dataflow"
VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_MESSAGE_BYTES = 2 * 1024**3
MAX_INDEX_BYTES = 256 * 1024 * 1024
MAX_ARRAYS = 1024
MAX_NDIM = 8
MAX_NAME = 256
MAX_TEXT = 16 * 1024
MAX_RANGES = 1 << 20
MAX_CREDITS = 1 << 16
ZERO_COPY_MIN_BYTES = 64 * 1024
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
OFFSETS_SUFFIX = ".offsets"
_INT64_MAX = 2**63 - 1

Buffer = bytes | memoryview | np.ndarray


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
class Hello:
    """Client -> server: open a session.

    Attributes:
        credits: requests the client may keep outstanding (its prefetch depth); the server
            grants ``min(credits, --max-credits)``.
        client: free-form client description for the server's logs (e.g. ``"rank 3"``).
    """

    credits: int
    client: str = ""


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
    """

    credits: int
    workers: int
    index_json: str
    session: str = ""
    data: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    """Client -> server: read one batch.

    Attributes:
        req_id: client-chosen id echoed in the reply, ``0 <= req_id < 2**63``.
        ranges: ``(shard, start, stop)`` triples; travel as one int64 frame of shape (n, 3).
    """

    req_id: int
    ranges: tuple[tuple[int, int, int], ...]


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
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


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
    """

    req_id: int
    size: int
    arrays: tuple[ArraySpec, ...]
    ragged: tuple[tuple[str, str], ...] = ()
    data: tuple[np.ndarray, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class ErrorMsg:
    """Server -> client: a request (``req_id``) or a message (``req_id == -1``) failed.

    Attributes:
        req_id: id of the failed request, or -1.
        kind: server-side exception class name.
        message: server-side message (truncated to :data:`MAX_TEXT` characters).
    """

    req_id: int
    kind: str
    message: str


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

    counters: Mapping[str, int | list[int]]


Message = Hello | Index | Request | BatchMsg | ErrorMsg | Heartbeat | Bye | Stats | StatsReply

_KIND_OF: dict[type, Kind] = {
    Hello: Kind.HELLO, Index: Kind.INDEX, Request: Kind.REQUEST, BatchMsg: Kind.BATCH,
    ErrorMsg: Kind.ERROR, Heartbeat: Kind.HEARTBEAT, Bye: Kind.BYE, Stats: Kind.STATS,
    StatsReply: Kind.STATS_REPLY,
}


def kind_of(msg: Message) -> Kind:
    """The :class:`Kind` of a message object."""
    for cls in type(msg).__mro__:
        if cls in _KIND_OF:
            return _KIND_OF[cls]
    raise ProtocolError(f"not a message: {type(msg).__name__}")


@dataclass(frozen=True)
class _IndexHeader(Index):
    """An INDEX header before its payload frame: ``nbytes`` of UTF-8 JSON follow."""

    nbytes: int = 0


@dataclass(frozen=True)
class _RequestHeader(Request):
    """A REQUEST header before its payload frame: ``n`` int64 triples follow."""

    n: int = 0


# ---------------------------------------------------------------------------------------------
# Encoding


def chunk_sizes(nbytes: int) -> list[int]:
    """Sizes of the frames an array of ``nbytes`` bytes travels in (each <= 8 MiB)."""
    if nbytes == 0:
        return [0]
    full, rest = divmod(nbytes, MAX_FRAME_BYTES)
    return [MAX_FRAME_BYTES] * full + ([rest] if rest else [])


def _array_frames(arr: np.ndarray) -> list[Buffer]:
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    out: list[Buffer] = []
    pos = 0
    for n in chunk_sizes(flat.nbytes):
        part = flat[pos : pos + n]
        out.append(part if n >= ZERO_COPY_MIN_BYTES else part.tobytes())
        pos += n
    return out


def _header(kind: Kind, **fields: Any) -> bytes:
    text = json.dumps({"magic": MAGIC, "version": VERSION, "kind": int(kind), **fields},
                      separators=(",", ":"))
    data = text.encode("utf-8")
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"{kind.name} header is {len(data)} bytes; the limit is "
                            f"{MAX_HEADER_BYTES}")
    return data


def encode(msg: Message) -> list[Buffer]:
    """Frames of ``msg``: the header, then raw buffers.

    Buffers of at least :data:`ZERO_COPY_MIN_BYTES` are numpy views (send them with
    ``copy=False``); smaller ones are ``bytes``.

    Raises:
        ProtocolError: the message cannot be represented (oversized, unsupported dtype).
    """
    if isinstance(msg, Hello):
        return [_header(Kind.HELLO, credits=msg.credits, client=msg.client[:MAX_NAME])]
    if isinstance(msg, Index):
        body = msg.index_json.encode("utf-8")
        return [_header(Kind.INDEX, credits=msg.credits, workers=msg.workers, nbytes=len(body),
                        session=msg.session, data=list(msg.data)), body]
    if isinstance(msg, Request):
        ranges = np.asarray(msg.ranges, dtype=np.int64).reshape(-1, 3)
        return [_header(Kind.REQUEST, req_id=msg.req_id, n=len(ranges)), ranges.tobytes()]
    if isinstance(msg, BatchMsg):
        if len(msg.data) != len(msg.arrays):
            raise ProtocolError(f"BATCH has {len(msg.arrays)} array specs but "
                                f"{len(msg.data)} arrays")
        if sum(s.nbytes for s in msg.arrays) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"BATCH of {sum(s.nbytes for s in msg.arrays)} bytes exceeds "
                                f"{MAX_MESSAGE_BYTES}")
        frames: list[Buffer] = [_header(
            Kind.BATCH, req_id=msg.req_id, size=msg.size,
            arrays=[[s.name, s.dtype, list(s.shape)] for s in msg.arrays],
            ragged=[list(r) for r in msg.ragged],
        )]
        for arr in msg.data:
            frames.extend(_array_frames(arr))
        return frames
    if isinstance(msg, ErrorMsg):
        return [_header(Kind.ERROR, req_id=msg.req_id, error=msg.kind[:MAX_NAME],
                        message=msg.message[:MAX_TEXT])]
    if isinstance(msg, Heartbeat):
        return [_header(Kind.HEARTBEAT)]
    if isinstance(msg, Bye):
        return [_header(Kind.BYE)]
    if isinstance(msg, Stats):
        return [_header(Kind.STATS)]
    if isinstance(msg, StatsReply):
        return [_header(Kind.STATS_REPLY, counters=dict(msg.counters))]
    raise ProtocolError(f"cannot encode {type(msg).__name__}")


# ---------------------------------------------------------------------------------------------
# Decoding


def _nbytes(frame: Any) -> int:
    return memoryview(frame).nbytes


def _int(h: Mapping, key: str, lo: int, hi: int) -> int:
    v = h.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProtocolError(f"header field `{key}` must be an integer in [{lo}, {hi}]. "
                            f"Found: {v!r}"[:400])
    return v


def _str(h: Mapping, key: str, limit: int) -> str:
    v = h.get(key)
    if not isinstance(v, str) or len(v) > limit:
        raise ProtocolError(f"header field `{key}` must be a string of at most {limit} "
                            f"characters. Found: {v!r}"[:400])
    return v


def _keys(h: Mapping, kind: Kind, allowed: set[str]) -> None:
    extra = set(h) - allowed - {"magic", "version", "kind"}
    missing = allowed - set(h)
    if extra or missing:
        raise ProtocolError(f"{kind.name} header: unexpected fields {sorted(extra)[:8]}, "
                            f"missing fields {sorted(missing)}")


def _array_spec(item: Any) -> ArraySpec:
    if not isinstance(item, list) or len(item) != 3:
        raise ProtocolError(f"BATCH array spec must be [name, dtype, shape]. Found: {item!r}"[:400])
    name, dtype, shape = item
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ProtocolError(f"BATCH array name must be a non-empty string of at most {MAX_NAME} "
                            f"characters. Found: {name!r}"[:400])
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ProtocolError(f"BATCH array {name!r}: dtype must be one of {sorted(DTYPES)}. "
                            f"Found: {dtype!r}"[:400])
    if (not isinstance(shape, list) or not 1 <= len(shape) <= MAX_NDIM
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _INT64_MAX
                       for d in shape)):
        raise ProtocolError(f"BATCH array {name!r}: shape must be 1 to {MAX_NDIM} non-negative "
                            f"integers. Found: {shape!r}"[:400])
    return ArraySpec(name, dtype, tuple(shape))


def _batch_header(h: Mapping) -> BatchMsg:
    _keys(h, Kind.BATCH, {"req_id", "size", "arrays", "ragged"})
    req_id = _int(h, "req_id", 0, _INT64_MAX)
    size = _int(h, "size", 0, _INT64_MAX)
    raw_arrays, raw_ragged = h["arrays"], h["ragged"]
    if not isinstance(raw_arrays, list) or len(raw_arrays) > MAX_ARRAYS:
        raise ProtocolError(f"BATCH `arrays` must be a list of at most {MAX_ARRAYS} specs")
    arrays = tuple(_array_spec(a) for a in raw_arrays)
    by_name = {s.name: s for s in arrays}
    if len(by_name) != len(arrays):
        raise ProtocolError("BATCH array names must be unique")
    total = 0
    for s in arrays:
        total += s.nbytes
        if total > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"BATCH declares more than {MAX_MESSAGE_BYTES} bytes of arrays")
    if not isinstance(raw_ragged, list) or len(raw_ragged) > MAX_ARRAYS:
        raise ProtocolError(f"BATCH `ragged` must be a list of at most {MAX_ARRAYS} pairs")
    ragged: list[tuple[str, str]] = []
    offsets_names = set()
    for item in raw_ragged:
        if (not isinstance(item, list) or len(item) != 2 or item[1] not in RAGGED_KINDS
                or not isinstance(item[0], str)):
            raise ProtocolError(f"BATCH ragged entry must be [name, kind] with kind in "
                                f"{RAGGED_KINDS}. Found: {item!r}"[:400])
        name, kind = item
        values, offsets = by_name.get(name), by_name.get(name + OFFSETS_SUFFIX)
        if values is None or offsets is None:
            raise ProtocolError(f"BATCH ragged field {name!r} needs arrays {name!r} and "
                                f"{name + OFFSETS_SUFFIX!r}"[:400])
        if len(values.shape) != 1:
            raise ProtocolError(f"BATCH ragged field {name!r}: values must be 1-D. "
                                f"Found shape {values.shape}")
        if offsets.dtype != "int64" or offsets.shape != (size + 1,):
            raise ProtocolError(f"BATCH ragged field {name!r}: offsets must be int64 of shape "
                                f"({size + 1},). Found: {offsets.dtype} {offsets.shape}")
        ragged.append((name, kind))
        offsets_names.add(name + OFFSETS_SUFFIX)
    if len({n for n, _ in ragged}) != len(ragged):
        raise ProtocolError("BATCH ragged field names must be unique")
    ragged_names = {n for n, _ in ragged}
    for s in arrays:
        if s.name not in ragged_names and s.name not in offsets_names and s.shape[0] != size:
            raise ProtocolError(f"BATCH array {s.name!r}: first dimension must be the batch "
                                f"size {size}. Found shape {s.shape}")
    return BatchMsg(req_id, size, arrays, tuple(ragged))


def _counters(h: Mapping) -> dict[str, int | list[int]]:
    c = h.get("counters")
    if not isinstance(c, dict) or len(c) > 256:
        raise ProtocolError("STATS_REPLY `counters` must be an object of at most 256 entries")
    for k, v in c.items():
        ok = isinstance(v, int) and not isinstance(v, bool)
        ok = ok or (isinstance(v, list) and len(v) <= 4096
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in v))
        if not ok or len(k) > MAX_NAME:
            raise ProtocolError(f"STATS_REPLY counter {k[:MAX_NAME]!r} must be an integer or a "
                                f"list of integers. Found: {v!r}"[:400])
    return c


def _guarded(parse: Callable[[Any], Message], data: Any) -> Message:
    """``parse(data)``, with any error it did not foresee turned into a ProtocolError."""
    try:
        return parse(data)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"malformed message: {type(e).__name__}: {e}"[:400]) from e


def decode_header(header: Any) -> Message:
    """Decode and validate a header frame alone.

    Every problem, also one this module did not foresee, is a :class:`ProtocolError`: a
    receiver never dies of a message.

    For INDEX, REQUEST and BATCH the result carries no payload (empty ``index_json``, empty
    ``ranges``, empty ``data``); :func:`frame_sizes` gives the buffer frames that must follow.

    Raises:
        ProtocolError: the header is malformed, oversized or of another version.
    """
    return _guarded(_decode_header, header)


def _decode_header(header: Any) -> Message:
    n = _nbytes(header)
    if n > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {n} bytes; the limit is {MAX_HEADER_BYTES}")
    try:
        h = json.loads(bytes(memoryview(header)).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"header is not UTF-8 JSON: {e}") from e
    if not isinstance(h, dict) or h.get("magic") != MAGIC:
        raise ProtocolError(f"header must be a JSON object with magic {MAGIC!r}")
    if h.get("version") != VERSION:
        raise ProtocolError(f"protocol version must be {VERSION}. Found: {h.get('version')!r}"
                            [:400])
    raw_kind = _int(h, "kind", min(Kind), max(Kind))
    kind = Kind(raw_kind)
    if kind == Kind.HELLO:
        _keys(h, kind, {"credits", "client"})
        return Hello(_int(h, "credits", 1, MAX_CREDITS), _str(h, "client", MAX_NAME))
    if kind == Kind.INDEX:
        _keys(h, kind, {"credits", "workers", "nbytes", "session", "data"})
        _int(h, "nbytes", 0, MAX_INDEX_BYTES)
        data = h["data"]
        if (not isinstance(data, list) or len(data) > MAX_ARRAYS
                or not all(isinstance(e, str) and 0 < len(e) <= MAX_NAME for e in data)):
            raise ProtocolError(f"INDEX `data` must be a list of at most {MAX_ARRAYS} endpoint "
                                f"strings. Found: {data!r}"[:400])
        return _IndexHeader(_int(h, "credits", 1, MAX_CREDITS), _int(h, "workers", 0, 1 << 20),
                            "", _str(h, "session", MAX_NAME), tuple(data), h["nbytes"])
    if kind == Kind.REQUEST:
        _keys(h, kind, {"req_id", "n"})
        return _RequestHeader(_int(h, "req_id", 0, _INT64_MAX), (), _int(h, "n", 1, MAX_RANGES))
    if kind == Kind.BATCH:
        return _batch_header(h)
    if kind == Kind.ERROR:
        _keys(h, kind, {"req_id", "error", "message"})
        return ErrorMsg(_int(h, "req_id", -1, _INT64_MAX), _str(h, "error", MAX_NAME),
                        _str(h, "message", MAX_TEXT))
    if kind == Kind.STATS_REPLY:
        _keys(h, kind, {"counters"})
        return StatsReply(_counters(h))
    _keys(h, kind, set())
    return {Kind.HEARTBEAT: Heartbeat, Kind.BYE: Bye, Kind.STATS: Stats}[kind]()


def frame_sizes(msg: Message) -> list[int]:
    """Exact sizes of the buffer frames that follow the header of ``msg`` (from decode_header)."""
    if isinstance(msg, _IndexHeader):
        return [msg.nbytes]
    if isinstance(msg, _RequestHeader):
        return [msg.n * 24]
    if isinstance(msg, BatchMsg):
        return [n for s in msg.arrays for n in chunk_sizes(s.nbytes)]
    return []


def check_offsets(name: str, offsets: np.ndarray, n_values: int) -> None:
    """Check ragged ``offsets`` (int64, (batch + 1,)) against ``n_values`` values.

    Raises:
        ProtocolError: ``offsets[0] != 0``, offsets decrease, or ``offsets[-1] != n_values``.
    """
    if offsets[0] != 0 or offsets[-1] != n_values or (np.diff(offsets) < 0).any():
        raise ProtocolError(f"BATCH ragged field {name!r}: offsets must start at 0, never "
                            f"decrease and end at {n_values} values")


def _fill(frames: Sequence[Any], sizes: Sequence[int], nbytes: int) -> np.ndarray:
    """Copy ``frames`` back to back into one fresh writable uint8 buffer."""
    out = np.empty(nbytes, dtype=np.uint8)
    pos = 0
    for f, n in zip(frames, sizes, strict=True):
        out[pos : pos + n] = np.frombuffer(f, dtype=np.uint8)
        pos += n
    return out


def decode(frames: Sequence[Any]) -> Message:
    """Decode and validate a whole message (header frame + buffer frames).

    Arrays of a BATCH are fresh writable copies (never aliases of the frames).

    Raises:
        ProtocolError: anything malformed, truncated, oversized or of another version (also
            what this module did not foresee: a receiver never dies of a message).
    """
    return _guarded(_decode, frames)


def _decode(frames: Sequence[Any]) -> Message:
    if not frames:
        raise ProtocolError("empty message")
    head = decode_header(frames[0])
    sizes = frame_sizes(head)
    body = frames[1:]
    if len(body) != len(sizes):
        raise ProtocolError(f"{kind_of(head).name} message must have {len(sizes)} buffer "
                            f"frame(s) after the header. Found: {len(body)}")
    for i, (f, n) in enumerate(zip(body, sizes, strict=True)):
        if _nbytes(f) != n:
            raise ProtocolError(f"{kind_of(head).name} buffer frame {i} must be {n} bytes. "
                                f"Found: {_nbytes(f)}")
    if isinstance(head, _IndexHeader):
        try:
            text = bytes(memoryview(body[0])).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"INDEX payload is not UTF-8: {e}") from e
        return Index(head.credits, head.workers, text, head.session, head.data)
    if isinstance(head, _RequestHeader):
        ranges = np.frombuffer(body[0], dtype=np.int64).reshape(-1, 3)
        return Request(head.req_id, tuple(tuple(r) for r in ranges.tolist()))
    if isinstance(head, BatchMsg):
        data = []
        pos = 0
        for spec in head.arrays:
            chunks = chunk_sizes(spec.nbytes)
            buf = _fill(body[pos : pos + len(chunks)], chunks, spec.nbytes)
            data.append(buf.view(spec.dtype).reshape(spec.shape))
            pos += len(chunks)
        arrays = dict(zip((s.name for s in head.arrays), data, strict=True))
        for name, _ in head.ragged:
            check_offsets(name, arrays[name + OFFSETS_SUFFIX], len(arrays[name]))
        return BatchMsg(head.req_id, head.size, head.arrays, head.ragged, tuple(data))
    return head


# ---------------------------------------------------------------------------------------------
# Batch <-> message


def _native(name: str, arr: Any) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise ProtocolError(f"field {name!r}: expected a numpy array or Ragged column. "
                            f"Found: {type(arr).__name__}")
    if arr.dtype.name not in DTYPES:
        raise ProtocolError(f"field {name!r}: dtype must be one of {sorted(DTYPES)}. "
                            f"Found: {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr)


def batch_to_message(req_id: int, batch: Batch) -> BatchMsg:
    """The BATCH message carrying ``batch`` as the reply to request ``req_id``.

    Raises:
        ProtocolError: a column has an unsupported type or dtype, or columns disagree on length.
    """
    size = batch_len(batch)
    specs: list[ArraySpec] = []
    data: list[np.ndarray] = []
    ragged: list[tuple[str, str]] = []
    for name, col in batch.items():
        if isinstance(col, Ragged):
            values = _native(name, col.values)
            offsets = np.ascontiguousarray(col.offsets, dtype=np.int64)
            parts = [(name, values), (name + OFFSETS_SUFFIX, offsets)]
            ragged.append((name, col.kind))
        else:
            arr = _native(name, col)
            if arr.ndim == 0:
                raise ProtocolError(f"field {name!r}: a column needs a batch dimension")
            parts = [(name, arr)]
        if len(col) != size:
            raise ProtocolError(f"field {name!r} has {len(col)} samples; expected {size}")
        for n, a in parts:
            specs.append(ArraySpec(n, a.dtype.name, tuple(a.shape)))
            data.append(a)
    return BatchMsg(req_id, size, tuple(specs), tuple(ragged), tuple(data))


def message_to_batch(msg: BatchMsg) -> Batch:
    """The :data:`~dataflow.batch.Batch` carried by a decoded BATCH message."""
    arrays = dict(zip((s.name for s in msg.arrays), msg.data, strict=True))
    kinds = dict(msg.ragged)
    out: Batch = {}
    for name, arr in arrays.items():
        if name in kinds:
            out[name] = Ragged(arr, arrays[name + OFFSETS_SUFFIX], kinds[name])
        elif not (name.endswith(OFFSETS_SUFFIX) and name[: -len(OFFSETS_SUFFIX)] in kinds):
            out[name] = arr
    return out
