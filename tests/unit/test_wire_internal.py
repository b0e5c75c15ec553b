"""The frontend <-> reader messages of a server: round trips and validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataflow.errors import ProtocolError
from dataflow.wire import BatchTag
from dataflow.wire.internal import (
    Attached,
    Done,
    Lost,
    Ready,
    Sent,
    Task,
    decode_internal,
    encode_internal,
)


@pytest.mark.parametrize("msg", [
    Sent(b"ab" * 16, 7, 1 << 40),
    Sent(b"tok", 1, 10, ((0, 3), (5, 1)), 1),
    Sent(b"tok", 2, 4096, (), 0, 250),
    Lost(b"tok", 0, "the client's data connection was missing"),
    Ready("tcp://127.0.0.1:5555"),
    Done(b"ab" * 16, 3 << 30),
    Attached(b"\x00\xff" * 4),
], ids=repr)
def test_round_trip(msg) -> None:
    assert decode_internal(encode_internal(msg)) == msg


def test_task_passes_ranges_as_one_int64_array() -> None:
    ranges = np.array([[0, 0, 10], [3, 5, 9]], dtype=np.int64)
    out = decode_internal(encode_internal(Task(b"tok", 2**62, ranges, BatchTag(7, 2, 2**62))))
    assert isinstance(out, Task) and out.token == b"tok" and out.req_id == 2**62
    assert out.ranges.dtype == np.int64 and out.ranges.tolist() == ranges.tolist()
    assert out.tag == BatchTag(7, 2, 2**62) and out.columns is None


@pytest.mark.parametrize("columns", [("id",), ("image", "label.valid", "caf\u00e9")])
def test_task_carries_the_sessions_columns(columns: tuple[str, ...]) -> None:
    ranges = np.array([[1, 2, 3]], dtype=np.int64)
    frames = encode_internal(Task(b"tok", 1, ranges, BatchTag(), columns))
    assert len(frames) == 6 and frames[-1] == json.dumps(list(columns)).encode()
    out = decode_internal(frames)
    assert isinstance(out, Task) and out.columns == columns


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b"X"], "tag"),
    ([b"S", b"tok", b"\0" * 8], "must have 7 frames"),
    ([b"S", b"", b"\0" * 8, b"\0" * 8, b"", b"\0" * 8, b"\0" * 8], "`token`"),
    ([b"S", b"tok", b"\0" * 7, b"\0" * 8, b"", b"\0" * 8, b"\0" * 8], "`req_id`"),
    ([b"S", b"tok", b"\0" * 8, b"\0", b"", b"\0" * 8, b"\0" * 8], "`nbytes`"),
    ([b"S", b"tok", b"\xff" * 8, b"\0" * 8, b"", b"\0" * 8, b"\0" * 8], "`req_id`"),
    ([b"S", b"tok", b"\0" * 8, b"\0" * 8, b"", b"\0" * 8, b"\0"], "`samples`"),
    ([b"S", b"tok", b"\0" * 8, b"\0" * 8, b"\0" * 8, b"\0" * 8, b"\0" * 8], "`skips`"),
    ([b"S", b"tok", b"\0" * 8, b"\0" * 8, b"\xff" * 16, b"\0" * 8, b"\0" * 8], "`skips`"),
    ([b"L", b"tok", b"\0" * 8, b"\xff"], "`why`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24], "must have 6 frames"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 20, b"\0" * 24, b""], "`ranges`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 16, b""], "`tag`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\xff" * 24, b""], "`tag`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b"[]"], "`columns`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b'["a", "a"]'], "`columns`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b'["a", 1]'], "`columns`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b'"a"'], "`columns`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b"[\"a\""], "`columns`"),
    ([b"T", b"tok", b"\0" * 8, b"\0" * 24, b"\0" * 24, b"\xff"], "`columns`"),
    ([b"R", b"\xfe"], "`endpoint`"),
])
def test_malformed_is_a_protocol_error_naming_the_field(frames: list[bytes], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_internal(frames)
