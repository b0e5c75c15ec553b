"""Wire protocol: round trips of every message kind, and rejection of malformed messages."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ProtocolError

Kind = wire.Kind


def _frames(msg: wire.Message) -> list[bytes]:
    return [f if isinstance(f, bytes) else np.asarray(f).tobytes() for f in wire.encode(msg)]


def _header(kind: wire.Kind, **fields) -> bytes:
    return json.dumps({"magic": wire.MAGIC, "version": wire.VERSION, "kind": int(kind),
                       **fields}).encode()


def _batch() -> dict:
    return {
        "id": np.arange(5, dtype=np.int64),
        "image": np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3),
        "flag": np.array([True, False, True, True, False]),
        "text": Ragged(np.frombuffer(b"abcdefghij", dtype=np.uint8),
                       np.array([0, 1, 3, 3, 6, 10], dtype=np.int64), "str"),
    }


# One sample of every kind; the tests below check that every kind of the table has one.
SAMPLES: dict[Kind, wire.Message] = {
    Kind.HELLO: wire.Hello(4, "rank 0"),
    Kind.INDEX: wire.Index(3, 2, '{"shards": ["a"]}', "ab12",
                           ("tcp://127.0.0.1:5001", "ipc:///tmp/w2")),
    Kind.REQUEST: wire.Request(7, ((0, 0, 10), (3, 5, 9))),
    Kind.BATCH: wire.batch_to_message(3, {"id": np.arange(2),
                                          "t": Ragged(np.zeros(3, np.uint8),
                                                      np.array([0, 1, 3]), "str")}),
    Kind.ERROR: wire.ErrorMsg(7, wire.ErrorKind.READ_FAILED, "ShardReadError: shard a: broken"),
    Kind.HEARTBEAT: wire.Heartbeat(),
    Kind.BYE: wire.Bye(),
    Kind.STATS: wire.Stats(),
    Kind.STATS_REPLY: wire.StatsReply({"clients": 2, "worker_pids": [1, 2]}),
}


def test_every_kind_has_a_spec_and_a_sample() -> None:
    assert set(wire.SPECS) == set(Kind) == set(SAMPLES)
    assert all(wire.kind_of(msg) == kind for kind, msg in SAMPLES.items())


@pytest.mark.parametrize("msg", [
    *SAMPLES.values(),
    wire.Index(3, 2, "{}"),
    wire.Request(0, np.array([[1, 2, 3]], dtype=np.int64)),
    *(wire.ErrorMsg(-1, kind, "m") for kind in wire.ErrorKind),
], ids=repr)
def test_round_trip(msg: wire.Message) -> None:
    out = wire.decode(_frames(msg))
    assert out == msg and wire.kind_of(out) == wire.kind_of(msg)
    if isinstance(msg, wire.BatchMsg):
        assert isinstance(out, wire.BatchMsg)
        for a, b in zip(msg.data, out.data, strict=True):
            np.testing.assert_array_equal(a, b)


def test_request_ranges_are_one_int64_array() -> None:
    from_tuples = wire.Request(1, ((0, 0, 10), (3, 5, 9)))
    assert from_tuples.ranges.dtype == np.int64 and from_tuples.ranges.shape == (2, 3)
    out = wire.decode(_frames(from_tuples))
    assert isinstance(out, wire.Request) and out.ranges.dtype == np.int64
    assert out.ranges.tolist() == [[0, 0, 10], [3, 5, 9]]
    bad_ranges: list[Any] = [[(0, 1)], [[1, 2, 3, 4]], [("a", 1, 2)], np.zeros((2, 3, 1))]
    for bad in bad_ranges:
        with pytest.raises(ProtocolError, match="ranges"):
            wire.Request(1, bad)


def test_error_kinds_are_str_valued_and_checked() -> None:
    msg = wire.ErrorMsg(1, "UnknownClient", "gone")
    assert msg.kind is wire.ErrorKind.UNKNOWN_CLIENT and msg.kind == "UnknownClient"
    assert f"{msg.kind}: {msg.message}" == "UnknownClient: gone"
    with pytest.raises(ProtocolError, match="kind"):
        wire.ErrorMsg(1, "ValueError", "a reader's exception travels as READ_FAILED")
    with pytest.raises(ProtocolError, match="`error`"):
        wire.decode([_header(Kind.ERROR, req_id=1, error="ValueError", message="m")])


def test_batch_round_trip() -> None:
    batch = _batch()
    msg = wire.batch_to_message(9, batch)
    out = wire.decode(_frames(msg))
    assert isinstance(out, wire.BatchMsg) and out.req_id == 9 and out.size == 5
    back = wire.message_to_batch(out)
    assert list(back) == list(batch)
    for name in ("id", "image", "flag"):
        col = back[name]
        assert isinstance(col, np.ndarray)
        np.testing.assert_array_equal(col, batch[name])
        assert col.dtype == batch[name].dtype and col.flags.writeable
    assert [back["text"][i] for i in range(5)] == ["a", "bc", "", "def", "ghij"]


def test_encode_rejects_unsupported_columns() -> None:
    with pytest.raises(ProtocolError, match="'s'"):
        wire.batch_to_message(1, {"s": np.array(["a", "b"])})
    with pytest.raises(ProtocolError, match="'y'"):
        wire.batch_to_message(1, {"x": np.zeros(2), "y": np.zeros(3)})


_GOOD_BATCH = _frames(wire.batch_to_message(4, _batch()))
_ID_HEADER = dict(req_id=1, size=2, arrays=[["id", "int64", [2]]], ragged=[])


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b"\xff\xfe garbage"], "JSON"),
    ([b"[1, 2]"], "JSON object"),
    ([b"{" * 40000 + b"}" * 40000], "header"),
    ([b" " * (wire.MAX_HEADER_BYTES + 1)], "limit"),
    ([_header(Kind.HEARTBEAT)[:-3]], "JSON"),
    ([_header(Kind.HEARTBEAT), b"x"], "0 buffer frame"),
    ([_header(Kind.REQUEST, req_id=1, n=2), b"\0" * 24], "48 bytes"),
    ([_header(Kind.REQUEST, req_id=1, n=1)], "1 buffer frame"),
    ([_header(Kind.INDEX, credits=1, workers=1, nbytes=2, session="s", data=[]),
      b"\xff\xff"], "UTF-8"),
    (_GOOD_BATCH[:-1], "buffer frame"),
    (_GOOD_BATCH + [b"extra"], "buffer frame"),
    (_GOOD_BATCH[:1] + [b"\0" * 3] + _GOOD_BATCH[2:], "must be 40 bytes"),
    ([_header(Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [3]]]}),
      b"\0" * 24], "`arrays`.*first dimension"),
    ([_header(Kind.BATCH, **{**_ID_HEADER, "size": 10**15,
                             "arrays": [["id", "int64", [10**15]]]})], "more than"),
    ([_header(Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [2]]] * 2}),
      b"\0" * 16, b"\0" * 16], "unique"),
    ([_header(Kind.BATCH, **{**_ID_HEADER, "ragged": [["id", "str"]]}), b"\0" * 16],
     "`ragged`.*needs arrays"),
    ([_header(Kind.BATCH, req_id=1, size=1,
              arrays=[["t", "uint8", [2]], ["t.offsets", "int64", [2]]], ragged=[["t", "str"]]),
      b"ab", np.array([0, 3], np.int64).tobytes()], "'t': offsets"),
    ([_header(Kind.BATCH, req_id=1, size=1,
              arrays=[["t", "uint8", [2]], ["t.offsets", "int32", [2]]], ragged=[["t", "str"]]),
      b"ab", b"\0" * 8], "int64"),
])
def test_decode_rejects_malformed(frames: list[bytes], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        wire.decode(frames)


# Per kind and header field: a value of the right type that is out of range or invalid.
_INVALID: dict[Kind, dict[str, Any]] = {
    Kind.HELLO: {"credits": wire.MAX_CREDITS + 1, "client": "c" * (wire.MAX_NAME + 1)},
    Kind.INDEX: {"credits": 0, "workers": -1, "session": "s" * (wire.MAX_NAME + 1),
                 "data": [""], "nbytes": wire.MAX_INDEX_BYTES + 1},
    Kind.REQUEST: {"req_id": -1, "n": wire.MAX_RANGES + 1},
    Kind.BATCH: {"req_id": 2**63, "size": -1, "arrays": [["id", "int64", [2] * 9]],
                 "ragged": [["t", "zip"]]},
    Kind.ERROR: {"req_id": -2, "error": "KeyError", "message": "m" * (wire.MAX_TEXT + 1)},
    Kind.HEARTBEAT: {},
    Kind.BYE: {},
    Kind.STATS: {},
    Kind.STATS_REPLY: {"counters": {"a": "b"}},
}
_COMMON_INVALID = {"magic": "dataflow2", "version": wire.VERSION + 1, "kind": 99}


def _wrong_types(value: Any) -> list[Any]:
    """JSON values of another type than ``value`` (bool is not an integer)."""
    candidates = [True, "x", 1.5, None, {"a": 1}, [1]]
    if isinstance(value, int) and not isinstance(value, bool):
        candidates.append(1.0)
    else:
        candidates.append(7)
    return [c for c in candidates if type(c) is not type(value)]


def _mutations() -> list[tuple[str, Kind, str, Any]]:
    out: list[tuple[str, Kind, str, Any]] = []
    for kind, msg in SAMPLES.items():
        header = json.loads(_frames(msg)[0])
        assert set(header) == {"magic", "version", "kind", *_INVALID[kind]}, kind
        for key, value in header.items():
            invalid = _INVALID[kind].get(key, _COMMON_INVALID.get(key))
            out.append(("missing", kind, key, None))
            out.append(("out of range", kind, key, invalid))
            out.extend(("wrong type", kind, key, v) for v in _wrong_types(value))
        out.append(("extra", kind, "surplus", 1))
    return out


@pytest.mark.parametrize("how, kind, key, value", _mutations(),
                         ids=lambda v: v.name if isinstance(v, Kind) else repr(v)[:20])
def test_every_mutated_header_field_is_a_protocol_error_naming_it(how: str, kind: Kind,
                                                                  key: str, value: Any) -> None:
    frames = _frames(SAMPLES[kind])
    header = json.loads(frames[0])
    if how == "missing":
        del header[key]
    else:
        header[key] = value
    bad = json.dumps(header).encode()
    for attempt in ([bad, *frames[1:]], [bad]):
        with pytest.raises(ProtocolError, match=f"`{key}`"):
            wire.decode(attempt)
    with pytest.raises(ProtocolError, match=f"`{key}`"):
        wire.decode_header(bad)


def test_random_bytes_never_escape_as_another_exception() -> None:
    rng = np.random.default_rng(0)
    good = [_frames(msg) for msg in SAMPLES.values()]
    for i in range(2000):
        frames = [bytearray(f) for f in good[i % len(good)]]
        target = frames[int(rng.integers(len(frames)))]
        if target:
            for _ in range(int(rng.integers(1, 4))):
                target[int(rng.integers(len(target)))] = int(rng.integers(256))
        try:
            wire.decode([bytes(f) for f in frames])
        except ProtocolError:
            pass
