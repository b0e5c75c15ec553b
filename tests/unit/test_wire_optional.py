"""Optional header fields: HELLO ``batch_size`` and ``columns``, BATCH ``skipped`` and
``left_out``, REQUEST ``tag``; new ERROR kinds."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dataflow import wire
from dataflow.errors import ProtocolError


def _header(frames: list) -> dict:
    return json.loads(bytes(frames[0]))


def test_hello_without_batch_size_is_the_old_header_and_decodes_to_none() -> None:
    frames = wire.encode(wire.Hello(4, "rank 0"))
    assert "batch_size" not in _header(frames)
    assert wire.decode(frames) == wire.Hello(4, "rank 0", None)


def test_hello_batch_size_round_trips_and_is_validated() -> None:
    frames = wire.encode(wire.Hello(4, "rank 0", batch_size=256))
    assert _header(frames)["batch_size"] == 256
    assert wire.decode(frames).batch_size == 256
    for bad in (0, -1, True, "256", wire.MAX_BATCH_SIZE + 1):
        header = {**_header(frames), "batch_size": bad}
        with pytest.raises(ProtocolError, match="HELLO header field `batch_size`"):
            wire.decode([json.dumps(header).encode()])


def test_hello_columns_are_left_out_when_none_and_round_trip() -> None:
    plain = wire.encode(wire.Hello(4, "rank 0", 8))
    assert "columns" not in _header(plain) and wire.decode(plain).columns is None
    frames = wire.encode(wire.Hello(4, "rank 0", 8, ("id", "image", "label.valid")))
    assert _header(frames)["columns"] == ["id", "image", "label.valid"]
    assert wire.decode(frames) == wire.Hello(4, "rank 0", 8, ("id", "image", "label.valid"))
    widest = tuple(f"{i:04d}".ljust(24, "x") for i in range(wire.MAX_COLUMNS))
    assert wire.decode(wire.encode(wire.Hello(1, columns=widest))).columns == widest


@pytest.mark.parametrize("bad, reason", [
    ([], "list of 1 to"),
    ("id", "list of 1 to"),
    ({"id": 1}, "list of 1 to"),
    ([f"c{i}" for i in range(wire.MAX_COLUMNS + 1)], "list of 1 to"),
    (["id", 3], "non-empty strings"),
    (["id", None], "non-empty strings"),
    (["id", ["image"]], "non-empty strings"),
    ([""], "non-empty strings"),
    (["x" * (wire.MAX_NAME + 1)], "non-empty strings"),
    (["id", "label", "id"], "names field 'id' twice"),
    (["\u00e9" * 200 + str(i) for i in range(40)], "at most 32768 bytes as JSON"),
])
def test_malformed_hello_columns_are_a_protocol_error_naming_the_field(bad, reason: str) -> None:
    header = {**_header(wire.encode(wire.Hello(4))), "columns": bad}
    with pytest.raises(ProtocolError, match="HELLO header field `columns`") as info:
        wire.decode([json.dumps(header).encode()])
    assert reason in str(info.value)


def test_batch_skipped_is_left_out_when_zero_and_round_trips() -> None:
    batch = {"x": np.arange(3, dtype=np.int64)}
    plain = wire.encode(wire.batch_to_message(1, batch))
    assert "skipped" not in _header(plain) and wire.decode(plain).skipped == 0
    frames = wire.encode(wire.batch_to_message(1, batch, skipped=2))
    assert _header(frames)["skipped"] == 2
    msg = wire.decode(frames)
    assert isinstance(msg, wire.BatchMsg) and (msg.size, msg.skipped) == (3, 2)
    header = {**_header(frames), "skipped": -1}
    with pytest.raises(ProtocolError, match="`skipped`"):
        wire.decode([json.dumps(header).encode(), *frames[1:]])


def test_batch_left_out_runs_round_trip_and_must_add_up_to_skipped() -> None:
    batch = {"x": np.arange(3, dtype=np.int64)}
    plain = wire.encode(wire.batch_to_message(1, batch, skipped=2))
    assert "left_out" not in _header(plain) and wire.decode(plain).left_out == ()
    msg = replace(wire.batch_to_message(1, batch, skipped=3), left_out=(0, 1, 3, 5))
    frames = wire.encode(msg)
    assert _header(frames)["left_out"] == [0, 1, 3, 5]
    assert wire.decode(frames).left_out == (0, 1, 3, 5)
    assert wire.decode(wire.encode(replace(msg, left_out=(1, 4)))).left_out == (1, 4)
    for runs, reason in (([0, 2, 3, 5], "adding up to `skipped` 3"),  # 4 of them
                         ([4, 7], "adding up"),  # past the request's 6 samples
                         ([3, 5, 5, 6], "increasing"), ([0, 1, 3], "runs"), ([2, 2], "runs"),
                         ([0, -1], "runs"), ("0-3", "runs"),
                         (list(range(2 * wire.MAX_LEFT_OUT_RUNS + 2)), "runs")):
        header = {**_header(frames), "left_out": runs}
        with pytest.raises(ProtocolError, match="`left_out`") as info:
            wire.decode([json.dumps(header).encode(), *frames[1:]])
        assert reason in str(info.value), (runs, str(info.value))


def test_request_tag_is_left_out_when_zero_and_round_trips() -> None:
    plain = wire.encode(wire.Request(1, [[0, 0, 4]]))
    assert "tag" not in _header(plain) and wire.decode(plain).tag == wire.NO_TAG
    frames = wire.encode(wire.Request(1, [[0, 0, 4]], wire.BatchTag(42, 3, 2**62)))
    assert _header(frames)["tag"] == [42, 3, 2**62]
    msg = wire.decode(frames)
    assert isinstance(msg, wire.Request) and msg.tag == (42, 3, 2**62)
    assert msg.ranges.tolist() == [[0, 0, 4]]
    for bad in ([1, 2], [1, 2, -3], [1, 2, True], [1, 2, 2**63], "1,2,3", {"seed": 1}):
        header = {**_header(frames), "tag": bad}
        with pytest.raises(ProtocolError, match="REQUEST header field `tag`"):
            wire.decode([json.dumps(header).encode(), *frames[1:]])


def test_required_fields_stay_required() -> None:
    header = _header(wire.encode(wire.Hello(4)))
    del header["credits"]
    with pytest.raises(ProtocolError, match="missing field `credits`"):
        wire.decode([json.dumps(header).encode()])


@pytest.mark.parametrize("kind", [wire.ErrorKind.SERVER_STOPPING, wire.ErrorKind.SERVER_BUSY])
def test_new_error_kinds_round_trip(kind: wire.ErrorKind) -> None:
    msg = wire.ErrorMsg(-1, kind, "bye")
    assert wire.decode(wire.encode(msg)) == msg
    assert _header(wire.encode(msg))["error"] == kind.value


def test_index_transform_is_left_out_when_none_and_round_trips() -> None:
    plain = wire.encode(wire.Index(2, 1, "{}", "tok", ("tcp://a:1",)))
    assert "transform" not in _header(plain)
    assert wire.decode(plain).transform == ""
    named = wire.encode(wire.Index(2, 1, "{}", "tok", ("tcp://a:1",), "decode:jpeg"))
    assert _header(named)["transform"] == "decode:jpeg"
    assert wire.decode(named) == wire.Index(2, 1, "{}", "tok", ("tcp://a:1",), "decode:jpeg")
    long = wire.encode(wire.Index(2, 1, "{}", "tok", ("tcp://a:1",), "m:" + "f" * 400))
    assert wire.decode(long).transform == ("m:" + "f" * 400)[:wire.MAX_NAME]
    for bad in (3, None, ["m:f"]):
        header = {**_header(named), "transform": bad}
        with pytest.raises(ProtocolError, match="INDEX header field `transform`"):
            wire.decode([json.dumps(header).encode(), b"{}"])
