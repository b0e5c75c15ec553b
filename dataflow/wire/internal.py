"""Messages between a loader server's frontend and its reader processes (private ipc socket).

Each message is a tag frame then one frame per field, fixed by the tag's entry in
:data:`INTERNAL`::

    TASK  [b"T", token, req_id, ranges, tag, columns]  frontend -> reader: serve one
                                           REQUEST
    READY [b"R", endpoint]                 reader -> frontend, once: my data endpoint
    SENT  [b"S", token, req_id, nbytes, skips, too_large, samples]  reader -> frontend:
                                           reply handed to ZeroMQ
    LOST  [b"L", token, req_id, why]       reader -> frontend: reply dropped
    DONE  [b"D", token, nbytes]            reader -> frontend: ``nbytes`` of replies to
                                           ``token`` left the reader (written by ZeroMQ, or
                                           dropped)
    ATTACHED [b"A", token]                 reader -> frontend: a data connection of routing id
                                           ``token`` said HEARTBEAT

``token`` is the client's session token (the routing id of its data connections, and the key
of its session at the frontend); integers are 8 little-endian bytes, in ``[0, 2**63)``;
``ranges`` the REQUEST's int64 (n, 3) array, passed on without decoding it again; ``tag`` its
:class:`~dataflow.wire.messages.BatchTag` as three integers; ``columns`` the session's column
subset (its HELLO's ``columns``) as a UTF-8 JSON list of names, empty for every field;
``skips`` int64 ``(shard, samples)`` pairs, the damaged samples of each shard the reply left
out. A ROUTER prepends the peer's routing id, which is not part of these messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from dataflow.errors import FieldError, ProtocolError
from dataflow.wire.fields import INT64_MAX, MAX_NAME, MAX_TEXT, column_names
from dataflow.wire.messages import NO_TAG, BatchTag, as_ranges


@dataclass(frozen=True)
class Task:
    """A REQUEST handed to a reader: for session ``token``, request ``req_id``.

    Attributes:
        token: the client's session token (ASCII).
        req_id: the request's id.
        ranges: int64 (n, 3) ``(shard, start, stop)`` rows, as decoded from the REQUEST.
        tag: the REQUEST's (seed, epoch, global batch index).
        columns: the fields the reply keeps (the session's HELLO ``columns``), or None: all.
    """

    token: bytes
    req_id: int
    ranges: np.ndarray
    tag: BatchTag = NO_TAG
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Ready:
    """A reader serves; its data socket is bound at ``endpoint``."""

    endpoint: str


@dataclass(frozen=True)
class Sent:
    """A reader is handing the reply to request ``req_id`` of session ``token`` to ZeroMQ.

    Attributes:
        nbytes: bytes of the reply.
        skips: ``(shard, samples)`` for each shard of which the reply left damaged samples out
            (``--on-error skip``); empty when none were.
        too_large: 1 when the reply is an ERROR because the batch exceeded
            ``--max-reply-bytes``, else 0.
        samples: samples in the reply's BATCH (0 for an ERROR).
    """

    token: bytes
    req_id: int
    nbytes: int
    skips: tuple[tuple[int, int], ...] = ()
    too_large: int = 0
    samples: int = 0


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


Internal = Task | Ready | Sent | Lost | Done | Attached


def _count(data: Any) -> int:
    if memoryview(data).nbytes != 8:
        raise FieldError("must be 8 bytes")
    value = int.from_bytes(bytes(data), "little")
    if value > INT64_MAX:
        raise FieldError(f"must be in [0, {INT64_MAX}]")
    return value


def _count_bytes(value: int) -> bytes:
    return int(value).to_bytes(8, "little")


def _token(data: Any) -> bytes:
    raw = bytes(data)
    if not 0 < len(raw) <= MAX_NAME:
        raise FieldError(f"must be 1 to {MAX_NAME} bytes")
    return raw


def _text(data: Any) -> str:
    raw = bytes(data)
    if len(raw) > MAX_TEXT:
        raise FieldError(f"must be at most {MAX_TEXT} bytes")
    return raw.decode("utf-8")


def _ranges(data: Any) -> np.ndarray:
    if memoryview(data).nbytes % 24:
        raise FieldError("must be whole int64 triples")
    return as_ranges(np.frombuffer(data, dtype="<i8").reshape(-1, 3))


def _tag(data: Any) -> BatchTag:
    if memoryview(data).nbytes != 24:
        raise FieldError("must be 3 int64")
    values = np.frombuffer(data, dtype="<i8").tolist()
    if min(values) < 0:
        raise FieldError("must be non-negative")
    return BatchTag(*values)


def _columns_bytes(value: tuple[str, ...] | None) -> bytes:
    return b"" if value is None else json.dumps(list(value)).encode("utf-8")


def _columns(data: Any) -> tuple[str, ...] | None:
    raw = bytes(data)
    if not raw:
        return None
    return column_names(json.loads(raw.decode("utf-8")))


def _skips(data: Any) -> tuple[tuple[int, int], ...]:
    if memoryview(data).nbytes % 16:
        raise FieldError("must be whole int64 pairs")
    pairs = np.frombuffer(data, dtype="<i8").reshape(-1, 2)
    if (pairs < 0).any():
        raise FieldError("must be non-negative (shard, samples) pairs")
    return tuple((int(a), int(b)) for a, b in pairs.tolist())


_Codec = tuple[Callable[[Any], bytes], Callable[[Any], Any]]
_CODECS: dict[str, _Codec] = {
    "token": (bytes, _token),
    "req_id": (_count_bytes, _count),
    "nbytes": (_count_bytes, _count),
    "too_large": (_count_bytes, _count),
    "samples": (_count_bytes, _count),
    "ranges": (lambda v: np.ascontiguousarray(v, dtype="<i8").tobytes(), _ranges),
    "tag": (lambda v: np.asarray(v, dtype="<i8").tobytes(), _tag),
    "skips": (lambda v: np.asarray(v, dtype="<i8").reshape(-1, 2).tobytes(), _skips),
    "columns": (_columns_bytes, _columns),
    "endpoint": (lambda v: v.encode("utf-8"), _text),
    "why": (lambda v: v[:MAX_TEXT].encode("utf-8"), _text),
}

INTERNAL: dict[bytes, type] = {b"T": Task, b"R": Ready, b"S": Sent, b"L": Lost, b"D": Done,
                               b"A": Attached}
_TAG_OF = {cls: tag for tag, cls in INTERNAL.items()}


def encode_internal(msg: Internal) -> list[bytes]:
    """Frames of ``msg``: its tag, then one frame per field."""
    return [_TAG_OF[type(msg)],
            *(_CODECS[f.name][0](getattr(msg, f.name)) for f in fields(msg))]


def decode_internal(frames: Sequence[Any]) -> Internal:
    """Decode and validate an internal message.

    Raises:
        ProtocolError: unknown tag, wrong number of frames, or a field is invalid (named).
    """
    if not frames:
        raise ProtocolError("internal message is empty")
    cls = INTERNAL.get(bytes(frames[0]))
    if cls is None:
        raise ProtocolError(f"internal message tag must be one of {sorted(INTERNAL)}. "
                            f"Found: {bytes(frames[0])[:16]!r}")
    names = [f.name for f in fields(cls)]
    if len(frames) != 1 + len(names):
        raise ProtocolError(f"internal {cls.__name__} must have {1 + len(names)} frames. "
                            f"Found: {len(frames)}")
    values = {}
    for name, data in zip(names, frames[1:], strict=True):
        try:
            values[name] = _CODECS[name][1](data)
        except (FieldError, ValueError, ProtocolError) as e:  # ValueError: not UTF-8 or JSON
            raise ProtocolError(f"internal {cls.__name__} field `{name}`: {e}"[:400]) from e
    return cls(**values)
