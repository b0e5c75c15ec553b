"""The frontend <-> reader messages of a server: round trips and validation, through the same
codec as the wire's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataflow import wire
from dataflow.errors import ProtocolError
from dataflow.wire import BatchTag
from dataflow.wire.internal import (
    Attached,
    Done,
    InternalKind,
    Lost,
    Sent,
    Started,
    Task,
    decode_internal,
    encode_internal,
)


@pytest.mark.parametrize("msg", [
    Sent(b"ab" * 16, 7, 1 << 40),
    Sent(b"tok", 1, 10, 3, skips=((0, 3), (5, 1))),
    Sent(b"tok", 2, 4096, too_large=True),
    Sent(b"tok", 2, 4096, 250),
    Sent(b"tok", 3, 4096, 250, cache_hits=200, cache_misses=50, cache_evictions=7,
         cache_bytes=1 << 33, cache_disk_hits=3, cache_disk_evictions=2, cache_disk_bytes=9),
    Lost(b"tok", 0, "the client's data connection was missing"),
    Started("tcp://127.0.0.1:5555"),
    Done(b"ab" * 16, 3 << 30),
    Attached(b"\x00\xff" * 4),
], ids=repr)
def test_round_trip(msg) -> None:
    assert decode_internal(encode_internal(msg)) == msg


def test_task_passes_ranges_as_one_int64_frame() -> None:
    ranges = np.array([[0, 0, 10], [3, 5, 9]], dtype=np.int64)
    frames = encode_internal(Task(b"tok", 2**62, ranges, BatchTag(7, 2, 2**62), attempts=2))
    assert len(frames) == 2 and bytes(frames[1]) == ranges.tobytes()
    out = decode_internal(frames)
    assert isinstance(out, Task) and out.token == b"tok" and out.req_id == 2**62
    assert out.ranges.dtype == np.int64 and out.ranges.tolist() == ranges.tolist()
    assert out.tag == BatchTag(7, 2, 2**62) and out.columns is None and out.attempts == 2


@pytest.mark.parametrize("columns", [("id",), ("image", "label.valid", "caf\u00e9")])
def test_task_carries_the_sessions_columns(columns: tuple[str, ...]) -> None:
    ranges = np.array([[1, 2, 3]], dtype=np.int64)
    frames = encode_internal(Task(b"tok", 1, ranges, BatchTag(), columns))
    assert json.loads(frames[0])["columns"] == list(columns)
    out = decode_internal(frames)
    assert isinstance(out, Task) and out.columns == columns


def _frames(kind: InternalKind, body: list[bytes] | None = None, **fields) -> list[bytes]:
    header = {"magic": wire.MAGIC, "version": wire.VERSION, "kind": int(kind), **fields}
    return [json.dumps(header).encode(), *(body or [])]


SENT = {"token": "tok", "req_id": 1, "nbytes": 8, "samples": 1, "n": 0}
TASK = {"token": "tok", "req_id": 1, "n": 1}
ROW = [b"\0" * 24]


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b"X"], "JSON"),
    (_frames(wire.Kind.HEARTBEAT), "`kind`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "token": ""}), "`token`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "token": "\u0100"}), "`token`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "req_id": -1}), "`req_id`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "req_id": 2**63}), "`req_id`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "nbytes": "8"}), "`nbytes`"),
    (_frames(InternalKind.SENT, [b""], **{**SENT, "too_large": 1}), "`too_large`"),
    (_frames(InternalKind.SENT, [b""], **{k: v for k, v in SENT.items() if k != "samples"}),
     "missing field `samples`"),
    (_frames(InternalKind.SENT, [], **SENT), "1 buffer frame"),
    (_frames(InternalKind.SENT, [b"\0" * 8], **{**SENT, "n": 1}), "16 bytes"),
    (_frames(InternalKind.SENT, [b"\xff" * 16], **{**SENT, "n": 1}), "`skips`"),
    (_frames(InternalKind.LOST, token="tok", req_id=0, why="x" * 20000), "`why`"),
    (_frames(InternalKind.TASK, [], **TASK), "1 buffer frame"),
    (_frames(InternalKind.TASK, [b"\0" * 20], **TASK), "24 bytes"),
    (_frames(InternalKind.TASK, ROW, **TASK, tag=[0, 0]), "`tag`"),
    (_frames(InternalKind.TASK, ROW, **TASK, tag=[-1, 0, 0]), "`tag`"),
    (_frames(InternalKind.TASK, ROW, **TASK, columns=[]), "`columns`"),
    (_frames(InternalKind.TASK, ROW, **TASK, columns=["a", "a"]), "`columns`"),
    (_frames(InternalKind.TASK, ROW, **TASK, columns=["a", 1]), "`columns`"),
    (_frames(InternalKind.TASK, ROW, **TASK, columns="a"), "`columns`"),
    (_frames(InternalKind.TASK, ROW, **TASK, attempts=-1), "`attempts`"),
    (_frames(InternalKind.TASK, ROW, **TASK, extra=1), "unexpected field `extra`"),
    (_frames(InternalKind.STARTED, endpoint=5), "`endpoint`"),
])
def test_malformed_is_a_protocol_error_naming_the_field(frames: list[bytes], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_internal(frames)


def test_neither_codec_decodes_the_others_messages() -> None:
    with pytest.raises(ProtocolError, match="`kind`"):
        wire.decode(encode_internal(Done(b"tok", 1)))
    with pytest.raises(ProtocolError, match="`kind`"):
        decode_internal(wire.encode(wire.Heartbeat()))
