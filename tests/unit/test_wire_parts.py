"""Several batches in one REQUEST and one BATCH (``parts``): round trips, the rules between
fields, and each batch's ragged offsets checked on its own."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ProtocolError
from dataflow.wire import arrays as arrays_module


def _frames(msg: wire.Message) -> list[bytes]:
    return [f if isinstance(f, bytes) else np.asarray(f).tobytes() for f in wire.encode(msg)]


def _batch(first: int, n: int, text: list[bytes]) -> dict:
    offsets = np.cumsum([0, *map(len, text)]).astype(np.int64)
    return {"id": np.arange(first, first + n, dtype=np.int64),
            "image": np.full((n, 2, 3), first, dtype=np.uint8),
            "text": Ragged(np.frombuffer(b"".join(text), dtype=np.uint8).copy(), offsets,
                           "bytes")}


BATCHES = [_batch(0, 3, [b"a", b"bc", b""]), _batch(3, 1, [b"def"]),
           _batch(4, 2, [b"", b""]), _batch(6, 0, [])]


def _equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, col in want.items():
        if isinstance(col, Ragged):
            np.testing.assert_array_equal(got[name].values, col.values)
            np.testing.assert_array_equal(got[name].offsets, col.offsets)
            assert got[name].kind == col.kind
        else:
            np.testing.assert_array_equal(got[name], col)


def test_a_batch_of_parts_round_trips_to_the_same_batches() -> None:
    msg = wire.batches_to_message(9, BATCHES, skipped=2)
    assert msg.parts == (3, 1, 2, 0) and msg.size == 6 and msg.skipped == 2
    specs = {s.name: s for s in msg.arrays}
    assert specs["text.offsets"].shape == (6 + 4,)  # each batch's own n + 1
    out = wire.decode(_frames(msg))
    assert out == msg
    for got, want in zip(wire.message_to_batches(out), BATCHES, strict=True):
        _equal(got, want)
    with pytest.raises(ProtocolError, match="carries 4 batches"):
        wire.message_to_batch(out)
    single = wire.batch_to_message(1, BATCHES[0])
    _equal(wire.message_to_batches(wire.decode(_frames(single)))[0], BATCHES[0])


def test_check_frames_gives_each_batch_s_values_bounds() -> None:
    msg = wire.batches_to_message(9, BATCHES)
    frames = _frames(msg)[1:]
    bounds = wire.BatchLayout.of(msg).check_frames(msg, [len(f) for f in frames], frames)
    assert bounds == {"text": (0, 3, 6, 6, 6)}
    one = wire.batch_to_message(1, BATCHES[0])
    frames = _frames(one)[1:]
    assert wire.BatchLayout.of(one).check_frames(one, [len(f) for f in frames], frames) == {}


@pytest.mark.parametrize("offsets, match", [
    ([0, 1, 3, 3, 1, 3, 0, 0, 0, 0], "each batch's offsets must start at 0"),
    ([0, 1, 3, 3, 0, 2, 0, 0, 0, 0], "the batches' values add up to 5, not its 6 values"),
    ([0, 1, 0, 3, 0, 3, 0, 0, 0, 0], "never decrease"),
])
def test_each_batch_s_offsets_are_checked(offsets: list[int], match: str) -> None:
    msg = wire.batches_to_message(9, BATCHES)
    frames = _frames(msg)
    frames[4] = np.array(offsets, np.int64).tobytes()
    with pytest.raises(ProtocolError, match=f"^BATCH 9 ragged field 'text': .*{match}"):
        wire.decode(frames)


def test_batches_of_other_fields_are_not_put_in_one_message() -> None:
    other = {**BATCHES[1], "image": np.zeros((1, 2, 4), np.uint8)}
    with pytest.raises(ProtocolError, match="batch 1 of request 9 does not have the fields"):
        wire.batches_to_message(9, [BATCHES[0], other])
    with pytest.raises(ProtocolError, match="2 or more batches"):
        wire.batches_to_message(9, BATCHES[:1])


def _header(frames: list[bytes], **change) -> list[bytes]:
    head = json.loads(frames[0])
    head.update(change)
    return [json.dumps(head).encode(), *frames[1:]]


@pytest.mark.parametrize("change, match", [
    ({"parts": [3, 2]}, "`parts`: 2 or more batches adding up to `size` 6"),
    ({"parts": [6]}, "`parts`"),
    ({"parts": [1] * (wire.MAX_GROUP + 1)}, "`parts`"),
    ({"parts": [3, "1", 2, 0]}, "`parts`"),
])
def test_a_batch_s_parts_must_add_up(change: dict, match: str) -> None:
    frames = _header(_frames(wire.batches_to_message(9, BATCHES)), **change)
    with pytest.raises(ProtocolError, match=match):
        wire.decode(frames)


TAGS = [wire.BatchTag(5, 1, 7), wire.BatchTag(5, 1, 9), wire.BatchTag(5, 2, 0)]


def test_a_request_of_parts_round_trips() -> None:
    req = wire.Request(4, [[0, 0, 3], [1, 5, 6], [0, 3, 5], [2, 0, 1]], slot=2,
                       parts=[(2, TAGS[0]), (1, TAGS[1]), (1, TAGS[2])])
    out = wire.decode(_frames(req))
    assert out == req and out.parts[1] == wire.Part(1, TAGS[1])
    hello = wire.Hello(2, "r", batch_size=8, group=4)
    assert wire.decode(_frames(hello)) == hello
    assert "group" not in json.loads(_frames(wire.Hello(2, "r"))[0])
    assert "parts" not in json.loads(_frames(wire.Request(1, [[0, 0, 1]]))[0])


@pytest.mark.parametrize("change, match", [
    ({"parts": [[2, 5, 1, 7], [1, 5, 1, 9]]}, "`parts` name 3 rows of its 4 ranges"),
    ({"parts": [[4, 5, 1, 7]]}, "`parts`"),
    ({"parts": [[0, 5, 1, 7], [4, 5, 1, 9]]}, "`parts`: .*rows at least 1"),
    ({"parts": [[2, 5, -1, 7], [2, 5, 1, 9]]}, "`parts`"),
    ({"parts": [[2, 5, 1], [2, 5, 1, 9]]}, "`parts`"),
    ({"parts": [[1, 0, 0, 0]] * (wire.MAX_GROUP + 1)}, "`parts`"),
    ({"tag": [5, 1, 7]}, "REQUEST with `parts` must have no `tag`"),
])
def test_a_request_s_parts_are_checked(change: dict, match: str) -> None:
    req = wire.Request(4, [[0, 0, 3], [1, 5, 6], [0, 3, 5], [2, 0, 1]],
                       parts=[(2, TAGS[0]), (2, TAGS[1])])
    with pytest.raises(ProtocolError, match=match):
        wire.decode(_header(_frames(req), **change))


@pytest.mark.parametrize("group", [0, wire.MAX_GROUP + 1, "2"])
def test_a_hello_s_group_is_checked(group: object) -> None:
    with pytest.raises(ProtocolError, match="`group`"):
        wire.decode(_header(_frames(wire.Hello(2, "r")), group=group))


def _sizes(msg: wire.BatchMsg) -> list[int]:
    return [len(f) for f in _frames(msg)[1:]]


def test_batches_sent_apart_travel_in_frames_of_their_own_and_round_trip() -> None:
    """Each batch's piece of every array in frames of its own (a ragged field's values whole,
    its offsets each batch's own); decoded, the same batches as joined."""
    msg = wire.batches_to_message(9, BATCHES, skipped=2, apart=True)
    joined = wire.batches_to_message(9, BATCHES, skipped=2)
    assert msg.apart and msg.arrays == joined.arrays and msg.parts == joined.parts
    assert [s.name for s in msg.arrays] == ["id", "image", "text", "text.offsets"]
    assert _sizes(msg) == [8 * 3, 8, 8 * 2, 0,  # id: each batch's rows
                           6 * 3, 6, 6 * 2, 0,  # image: 2x3 uint8 a sample
                           6,  # text's values, whole
                           8 * 4, 8 * 2, 8 * 3, 8]  # text's offsets: each batch's n + 1
    assert json.loads(_frames(msg)[0])["apart"] is True
    assert "apart" not in json.loads(_frames(joined)[0])
    out = wire.decode(_frames(msg))
    assert out == msg
    assert b"".join(_frames(out)[1:]) == b"".join(_frames(joined)[1:])
    for got, want in zip(wire.message_to_batches(out), BATCHES, strict=True):
        _equal(got, want)


def test_an_array_given_whole_is_cut_into_each_batch_s_frames_without_a_copy() -> None:
    big = [{"x": np.full((n, 70_000), k, dtype=np.uint8)} for k, n in enumerate((2, 1, 3))]
    whole = wire.parts_to_message(4, {"x": np.concatenate([b["x"] for b in big])}, (2, 1, 3))
    cut = wire.encode(replace(whole, apart=True))
    given = wire.encode(wire.batches_to_message(4, big, apart=True))
    assert [bytes(f) for f in cut[1:]] == [bytes(f) for f in given[1:]]
    assert [np.asarray(f).nbytes for f in cut[1:]] == [140_000, 70_000, 210_000]
    for frame, batch in zip(given[1:], big, strict=True):
        assert np.shares_memory(np.asarray(frame), batch["x"])
    (data,) = whole.data
    assert all(np.shares_memory(np.asarray(f), data) for f in cut[1:])


def test_pieces_of_other_sizes_than_the_layout_s_are_refused_naming_the_array() -> None:
    msg = wire.batches_to_message(9, BATCHES, apart=True)
    image = tuple(np.zeros((n, 2, 3), np.uint8) for n in (3, 2, 1, 0))
    with pytest.raises(ProtocolError, match=r"BATCH 9 array 'image': data in pieces of "
                                            r"\[18, 12, 6, 0\] bytes; .* \[18, 6, 12, 0\]"):
        wire.encode(replace(msg, data=(msg.data[0], image, *msg.data[2:])))
    with pytest.raises(ProtocolError, match="BATCH 9 array 'id' is given in pieces; expected"):
        wire.message_to_batches(msg)


def test_only_a_batch_of_parts_is_sent_apart() -> None:
    frames = _header(_frames(wire.batch_to_message(1, BATCHES[0])), apart=True)
    with pytest.raises(ProtocolError, match="`apart`: only a BATCH with `parts`"):
        wire.decode(frames)
    frames = _header(_frames(wire.batches_to_message(9, BATCHES)), apart=1)
    with pytest.raises(ProtocolError, match="`apart`"):
        wire.decode(frames)


def test_a_frame_of_a_batch_sent_apart_of_another_size_is_refused() -> None:
    frames = _frames(wire.batches_to_message(9, BATCHES, apart=True))
    frames[1], frames[2] = frames[1] + frames[2], b""
    with pytest.raises(ProtocolError, match="BATCH 9"):
        wire.decode(frames)


def test_a_batch_sent_apart_has_few_pieces_else_it_is_joined(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A header sent apart may name at most MAX_APART_PIECES pieces (arrays x parts): a peer
    cannot make a receiver lay out (and remember) tens of thousands of frames; a sender with
    more joins the batches instead."""
    batches = BATCHES[1:]  # a header no other test decodes (a codec remembers the latest)
    frames = _frames(wire.batches_to_message(11, batches, apart=True))
    monkeypatch.setattr(arrays_module, "MAX_APART_PIECES", 11)
    with pytest.raises(ProtocolError, match=r"`apart`: a BATCH sent apart has at most 11 "
                                            r"pieces \(arrays x parts\). Found: 4 x 3"):
        wire.decode(frames)
    with pytest.raises(ProtocolError, match="`apart`: a BATCH sent apart has at most 11"):
        wire.decode_header(frames[0])  # what a client reads before it lays out any frame
    msg = wire.batches_to_message(11, batches, apart=True)
    assert not msg.apart
    for got, want in zip(wire.message_to_batches(wire.decode(_frames(msg))), batches,
                         strict=True):
        _equal(got, want)


def test_a_ragged_field_may_not_use_another_ragged_field_s_arrays() -> None:
    batch = {"a": Ragged(np.zeros(2, np.uint8), np.array([0, 2], np.int64), "bytes"),
             "a.offsets": Ragged(np.zeros(3, np.uint8), np.array([0, 3], np.int64), "bytes")}
    head = json.loads(_frames(wire.batch_to_message(1, {"a": batch["a"]}))[0])
    head["ragged"] = [["a", "bytes"], ["a.offsets", "bytes"]]
    head["arrays"] = [["a", "uint8", [2]], ["a.offsets", "int64", [2]],
                      ["a.offsets.offsets", "int64", [2]]]
    frames = [json.dumps(head).encode(), bytes(2), np.array([0, 2], np.int64).tobytes(),
              np.array([0, 2], np.int64).tobytes()]
    with pytest.raises(ProtocolError, match="`ragged`: field 'a.offsets': its arrays are "
                                            "another ragged field's"):
        wire.decode(frames)
