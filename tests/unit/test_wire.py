"""Wire protocol: round trips of every message kind, and rejection of malformed messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ProtocolError


def _frames(msg: wire.Message) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f
            for f in wire.encode(msg)]


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


@pytest.mark.parametrize("msg", [
    wire.Hello(4, "rank 0"),
    wire.Index(3, 2, '{"shards": ["a"]}'),
    wire.Index(3, 2, '{"shards": ["a"]}', "ab12", ("tcp://127.0.0.1:5001", "ipc:///tmp/w2")),
    wire.Request(7, ((0, 0, 10), (3, 5, 9))),
    wire.ErrorMsg(7, "ShardReadError", "shard a: broken"),
    wire.ErrorMsg(-1, "ProtocolError", "bad"),
    wire.Heartbeat(),
    wire.Bye(),
    wire.Stats(),
    wire.StatsReply({"clients": 2, "worker_pids": [1, 2]}),
])
def test_round_trip(msg: wire.Message) -> None:
    assert wire.decode(_frames(msg)) == msg


def test_batch_round_trip() -> None:
    batch = _batch()
    msg = wire.batch_to_message(9, batch)
    out = wire.decode(_frames(msg))
    assert isinstance(out, wire.BatchMsg) and out.req_id == 9 and out.size == 5
    back = wire.message_to_batch(out)
    assert list(back) == list(batch)
    for name in ("id", "image", "flag"):
        np.testing.assert_array_equal(back[name], batch[name])
        assert back[name].dtype == batch[name].dtype and back[name].flags.writeable
    assert [back["text"][i] for i in range(5)] == ["a", "bc", "", "def", "ghij"]


def test_large_array_split_into_frames_and_reassembled() -> None:
    big = np.random.default_rng(0).integers(0, 255, size=(3, wire.MAX_FRAME_BYTES // 2 + 7),
                                            dtype=np.uint8)
    frames = wire.encode(wire.batch_to_message(1, {"x": big}))
    assert len(frames) == 1 + 2
    assert all(memoryview(f).nbytes <= wire.MAX_FRAME_BYTES for f in frames)
    out = wire.message_to_batch(wire.decode(frames))
    np.testing.assert_array_equal(out["x"], big)


def test_empty_batch_and_empty_arrays() -> None:
    batch = {"id": np.zeros(0, dtype=np.int64),
             "t": Ragged(np.zeros(0, np.uint8), np.zeros(1, np.int64), "bytes")}
    out = wire.message_to_batch(wire.decode(_frames(wire.batch_to_message(2, batch))))
    assert out["id"].shape == (0,) and len(out["t"]) == 0


def test_header_only_decode_announces_frame_sizes() -> None:
    frames = _frames(wire.batch_to_message(3, _batch()))
    head = wire.decode_header(frames[0])
    assert wire.frame_sizes(head) == [len(f) for f in frames[1:]]


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
    ([b"[1, 2]"], "magic"),
    ([b"{" * 40000 + b"}" * 40000], "header"),
    ([b" " * (wire.MAX_HEADER_BYTES + 1)], "limit"),
    ([json.dumps({"magic": wire.MAGIC, "version": 2, "kind": 6}).encode()], "version"),
    ([_header(wire.Kind.HEARTBEAT)[:-3]], "JSON"),
    ([json.dumps({"magic": wire.MAGIC, "version": 1, "kind": 99}).encode()], "kind"),
    ([_header(wire.Kind.HELLO, credits=0, client="")], "credits"),
    ([_header(wire.Kind.HELLO, credits=True, client="")], "credits"),
    ([_header(wire.Kind.HELLO, credits=2, client="", extra=1)], "unexpected"),
    ([_header(wire.Kind.HELLO, credits=2)], "missing"),
    ([_header(wire.Kind.HEARTBEAT), b"x"], "0 buffer frame"),
    ([_header(wire.Kind.REQUEST, req_id=1, n=2), b"\0" * 24], "48 bytes"),
    ([_header(wire.Kind.REQUEST, req_id=1, n=1)], "1 buffer frame"),
    ([_header(wire.Kind.REQUEST, req_id=-5, n=1), b"\0" * 24], "req_id"),
    ([_header(wire.Kind.REQUEST, req_id=1, n=wire.MAX_RANGES + 1)], "`n`"),
    ([_header(wire.Kind.INDEX, credits=1, workers=1, nbytes=2, session="s", data=[]),
      b"\xff\xff"], "UTF-8"),
    ([_header(wire.Kind.INDEX, credits=1, workers=1, nbytes=wire.MAX_INDEX_BYTES + 1,
              session="s", data=[])], "nbytes"),
    ([_header(wire.Kind.INDEX, credits=1, workers=1, nbytes=0, session="s", data=[""]), b""],
     "`data`"),
    ([_header(wire.Kind.INDEX, credits=1, workers=1, nbytes=0, session=3, data=[]), b""],
     "session"),
    ([_header(wire.Kind.ERROR, req_id=1, error="E", message=5)], "message"),
    ([_header(wire.Kind.STATS_REPLY, counters={"a": "b"})], "counter"),
    (_GOOD_BATCH[:-1], "buffer frame"),
    (_GOOD_BATCH + [b"extra"], "buffer frame"),
    (_GOOD_BATCH[:1] + [b"\0" * 3] + _GOOD_BATCH[2:], "must be 40 bytes"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "object", [2]]]}),
      b"\0" * 16], "dtype"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [3]]]}),
      b"\0" * 24], "first dimension"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [-1]]]})], "shape"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "size": 10**15,
                                  "arrays": [["id", "int64", [10**15]]]})], "more than"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [2]]] * 2}),
      b"\0" * 16, b"\0" * 16], "unique"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "arrays": [["id", "int64", [2] * 9]]})],
     "shape"),
    ([_header(wire.Kind.BATCH, **{**_ID_HEADER, "ragged": [["id", "str"]]}), b"\0" * 16],
     "needs arrays"),
    ([_header(wire.Kind.BATCH, req_id=1, size=1,
              arrays=[["t", "uint8", [2]], ["t.offsets", "int64", [2]]], ragged=[["t", "str"]]),
      b"ab", np.array([0, 3], np.int64).tobytes()], "offsets"),
    ([_header(wire.Kind.BATCH, req_id=1, size=1,
              arrays=[["t", "uint8", [2]], ["t.offsets", "int32", [2]]], ragged=[["t", "str"]]),
      b"ab", b"\0" * 8], "int64"),
    ([_header(wire.Kind.BATCH, req_id=1, size=1,
              arrays=[["t", "uint8", [2]], ["t.offsets", "int64", [2]]], ragged=[["t", "zip"]]),
      b"ab", b"\0" * 16], "kind"),
])
def test_decode_rejects_malformed(frames: list[bytes], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        wire.decode(frames)


_WRONG_VALUES = [None, [], {}, [[]], {"a": 1}, 1.5, -1, 2**70, "x", True, [["a", [], [1]]]]


@pytest.mark.parametrize("msg", [
    wire.Hello(4, "rank 0"),
    wire.Index(3, 2, "{}", "ab12", ("tcp://127.0.0.1:5001",)),
    wire.Request(7, ((0, 0, 2),)),
    wire.batch_to_message(3, {"id": np.arange(2), "t": Ragged(np.zeros(3, np.uint8),
                                                               np.array([0, 1, 3]), "str")}),
    wire.ErrorMsg(1, "E", "m"),
    wire.StatsReply({"a": 1}),
])
def test_any_wrong_field_type_is_a_protocol_error(msg: wire.Message) -> None:
    frames = wire.encode(msg)
    header = json.loads(frames[0])
    for key in header:
        for value in _WRONG_VALUES:
            bad = json.dumps({**header, key: value}).encode()
            for body in (frames[1:], []):
                try:
                    wire.decode([bad, *body])
                except ProtocolError:
                    pass
            try:
                wire.decode_header(bad)
            except ProtocolError:
                pass
        for inner in ("arrays", "ragged"):
            for i, item in enumerate(header.get(inner, [])):
                for j in range(len(item)):
                    for value in _WRONG_VALUES:
                        changed = [list(x) for x in header[inner]]
                        changed[i][j] = value
                        bad = json.dumps({**header, inner: changed}).encode()
                        try:
                            wire.decode([bad, *frames[1:]])
                        except ProtocolError:
                            pass
