"""The row count of an Arrow IPC record batch read from its message's metadata alone, so
that a record batch whose body is cut off or damaged is counted when it is lost.

An encapsulated IPC message is the continuation marker ``0xFFFFFFFF`` (absent in streams
written before Arrow 0.15), the int32 byte length of its metadata, the metadata (a
flatbuffer ``Message``), then the body. ``Message``'s fields are ``version``, the header's
type (``RecordBatch`` is 3) and the header itself (a union: two vtable slots),
``bodyLength`` and ``custom_metadata``; a ``RecordBatch`` header's first field is
``length``, its row count (``format/Message.fbs`` in the Arrow repository).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3
_RECORD_BATCH_LENGTH = 0
MAX_METADATA = 64 << 20
"""Metadata lengths beyond this are taken as damage, not read."""


class BatchMeta(NamedTuple):
    """What a record batch message's metadata says.

    Attributes:
        rows: the record batch's row count.
        end: byte offset just past its body (the next message, if the stream goes on).
    """

    rows: int
    end: int


def _field(buf: bytes, table: int, slot: int) -> int | None:
    """Byte offset of field ``slot`` of the flatbuffer table at ``table``; ``None`` when the
    table leaves it out (its default)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vsize = struct.unpack_from("<H", buf, vtable)[0]
    at = 4 + 2 * slot
    if at + 2 > vsize:
        return None
    rel = struct.unpack_from("<H", buf, vtable + at)[0]
    return table + rel if rel else None


def record_batch_meta(read: Callable[[int, int], bytes], offset: int) -> BatchMeta | None:
    """The row count and end of the record batch message at byte ``offset``, from its
    metadata; ``None`` when no readable record batch metadata is there.

    Args:
        read: ``read(start, stop)``: the shard's bytes ``[start, stop)`` (fewer at its end).
        offset: where the message starts.
    """
    head = read(offset, offset + 8)
    if len(head) < 4:
        return None
    (first,) = struct.unpack_from("<I", head)
    start = offset + 8 if first == _CONTINUATION else offset + 4
    if first == _CONTINUATION:
        if len(head) < 8:
            return None
        (length,) = struct.unpack_from("<i", head, 4)
    else:
        length = struct.unpack_from("<i", head)[0]
    if not 0 < length <= MAX_METADATA:
        return None
    buf = read(start, start + length)
    if len(buf) < length:
        return None
    try:
        message = struct.unpack_from("<I", buf)[0]
        kind = _field(buf, message, _MESSAGE_HEADER_TYPE)
        if kind is None or buf[kind] != _RECORD_BATCH:
            return None
        header = _field(buf, message, _MESSAGE_HEADER)
        body = _field(buf, message, _MESSAGE_BODY_LENGTH)
        if header is None:
            return None
        batch = header + struct.unpack_from("<I", buf, header)[0]
        rows_at = _field(buf, batch, _RECORD_BATCH_LENGTH)
        rows = struct.unpack_from("<q", buf, rows_at)[0] if rows_at is not None else 0
        body_length = struct.unpack_from("<q", buf, body)[0] if body is not None else 0
    except (struct.error, IndexError):
        return None
    if rows < 0 or body_length < 0:
        return None
    return BatchMeta(rows, start + length + body_length)
