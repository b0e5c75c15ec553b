"""BATCH headers decoded from one decoded shortly before but for their request id (the
codec's ``varies`` field): whatever the bytes, the same message or the same error as a codec
that never saw one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ProtocolError
from dataflow.wire.fields import INT64_MAX
from dataflow.wire.table import SEEN


def _batch(n: int = 4) -> dict:
    return {"x": np.zeros((n, 3), np.uint8),
            "t": Ragged(np.zeros(2 * n, np.uint8), np.arange(0, 2 * n + 1, 2), "str")}


def _headers() -> list[bytes]:
    """Compact headers (as servers write them) of BATCHes of every optional field."""
    plain = wire.batch_to_message(5, {"x": np.zeros((4, 3), np.uint8)})
    ragged = wire.batch_to_message(17, _batch())
    parts = wire.parts_to_message(3, _batch(), [1, 3])
    skipped = replace(plain, skipped=2, left_out=(1, 3))
    shm = replace(ragged, shm=wire.ShmRef(2, wire.BatchLayout.of(ragged).nbytes))
    return [wire.encode(m)[0] for m in (plain, ragged, parts, skipped, shm)]


def _outcome(codec: wire.Codec, raw: bytes) -> Any:
    """The header-only message, or the error's text."""
    try:
        return codec.parse_header(raw).msg
    except ProtocolError as e:
        return f"ProtocolError: {e}"


def _with_req_id(raw: bytes, value: bytes) -> bytes:
    start = raw.index(b'"req_id":') + len(b'"req_id":')
    end = start + len(raw[start:]) - len(raw[start:].lstrip(b"0123456789"))
    return raw[:start] + value + raw[end:]


@pytest.mark.parametrize("raw", _headers())
def test_another_request_id_is_the_message_a_fresh_codec_decodes_sharing_the_rest(
        raw: bytes) -> None:
    warm = wire.Codec(wire.SPECS)
    first = warm.parse_header(raw).msg
    for req_id in (0, 1, 9, 10, 4711, 10**18, INT64_MAX):
        again = _with_req_id(raw, str(req_id).encode())
        msg = warm.parse_header(again).msg
        assert msg == _outcome(wire.Codec(wire.SPECS), again) and msg.req_id == req_id
        assert msg.arrays is first.arrays  # decoded from the first: its fields are shared
    assert warm.parse_header(raw).msg == first


@pytest.mark.parametrize("raw", _headers())
def test_any_other_bytes_decode_or_fail_as_with_a_fresh_codec(raw: bytes) -> None:
    values = [b"-1", b"01", b"1.0", b"1e3", b" 5", b"true", b'"5"', b"9223372036854775808",
              b"99999999999999999999", b"", b"5,\"req_id\":6", b"5,\"req_idx\":6"]
    mutated = [_with_req_id(raw, v) for v in values]
    mutated.append(raw.replace(b"{", b'{"req_id":8,', 1))  # the key twice: JSON takes the last
    mutated.append(raw.replace(b'"x"', b'"x\\"req_id\\":7"', 1))  # inside a name
    mutated.append(raw.replace(b'"x"', b'"x\\"req_id"', 1))
    rng = np.random.default_rng(0)
    for _ in range(300):
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 3))):
            b[int(rng.integers(len(b)))] = int(rng.choice(list(b'0123456789",:{}[]x ')))
        mutated.append(bytes(b))
    warm = wire.Codec(wire.SPECS)
    warm.parse_header(raw)
    for m in mutated:
        got = _outcome(warm, m)
        assert got == _outcome(wire.Codec(wire.SPECS), m), m
        assert _outcome(warm, m) == got, m  # and again, once it may be remembered itself


def test_headers_remembered_are_bounded() -> None:
    codec = wire.Codec(wire.SPECS)
    for i in range(3 * SEEN):
        msg = wire.batch_to_message(i, {f"a{i}": np.zeros(1, np.uint8)})
        assert codec.parse_header(wire.encode(msg)[0]).msg == replace(msg, data=())
        assert len(codec._seen) <= SEEN


@pytest.mark.parametrize("raw", _headers())
def test_a_header_naming_the_request_id_twice_is_never_decoded_from_another(
        raw: bytes) -> None:
    req_id = wire.Codec(wire.SPECS).parse_header(raw).msg.req_id
    twice = raw.replace(b"{", b'{"req_id":%d,' % req_id, 1)  # the same value twice
    warm = wire.Codec(wire.SPECS)
    assert warm.parse_header(twice).msg.req_id == req_id
    other = twice.replace(b'{"req_id":%d,' % req_id, b'{"req_id":%d,' % (req_id + 1), 1)
    assert _outcome(warm, other) == _outcome(wire.Codec(wire.SPECS), other)
    assert warm.parse_header(other).msg.req_id == req_id  # JSON takes the last
