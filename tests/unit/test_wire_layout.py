"""BatchLayout: the one layout of a BATCH in a receive buffer and the one check of its frames,
used by decode and by every receiver of the client."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ProtocolError
from dataflow.wire import layout as layout_module


def _msg(**batch) -> wire.BatchMsg:
    return wire.batch_to_message(1, batch)


def _nbytes(frame: wire.Buffer) -> int:
    return np.asarray(frame).nbytes


def _decode_batch(frames: list) -> wire.BatchMsg:
    out = wire.decode(frames)
    assert isinstance(out, wire.BatchMsg)
    return out


def _land(msg: wire.BatchMsg) -> tuple[wire.BatchLayout, np.ndarray]:
    """Receive ``msg``'s buffer frames at their layout slots, as a client does."""
    layout = wire.BatchLayout.of(msg)
    buf = np.zeros(layout.nbytes, dtype=np.uint8)
    frames = wire.encode(msg)[1:]
    assert len(frames) == len(layout.frames)
    for (start, n), f in zip(layout.frames, frames, strict=True):
        assert _nbytes(f) == n
        buf[start : start + n] = np.frombuffer(f, dtype=np.uint8)
    return layout, buf


def test_arrays_start_at_aligned_offsets() -> None:
    msg = _msg(a=np.arange(3, dtype=np.uint8), b=np.arange(3, dtype=np.float64),
               c=np.zeros((3, 0), dtype=np.int32), d=np.ones((3, 5), dtype=np.int16))
    layout = wire.BatchLayout.of(msg)
    assert layout.offsets == (0, 64, 128, 128)
    assert layout.nbytes == 128 + 64
    assert all(off % wire.ALIGN == 0 for off in layout.offsets)
    assert layout.frames == ((0, 3), (64, 24), (128, 0), (128, 30))
    assert layout.sizes == (3, 24, 0, 30)


def test_views_share_the_buffer_and_hold_the_arrays() -> None:
    batch = {"id": np.arange(4), "x": np.arange(8, dtype=np.float32).reshape(4, 2),
             "t": Ragged(np.frombuffer(b"abcdef", np.uint8), np.array([0, 1, 1, 4, 6]), "str")}
    msg = _msg(**batch)
    layout, buf = _land(msg)
    views = layout.arrays(msg, buf)
    assert list(views) == ["id", "x", "t", "t.offsets"]
    assert all(np.shares_memory(v, buf) for v in views.values() if v.nbytes)
    np.testing.assert_array_equal(views["x"], batch["x"])
    assert views["t.offsets"].tolist() == [0, 1, 1, 4, 6]


def test_a_large_array_travels_in_several_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout_module, "MAX_FRAME_BYTES", 1000)
    big = np.arange(2600, dtype=np.uint8)
    msg = _msg(pad=np.ones(2600, dtype=np.uint8), big=big)
    layout = wire.BatchLayout.of(msg)
    assert layout.frames == ((0, 1000), (1000, 1000), (2000, 600),
                             (2624, 1000), (3624, 1000), (4624, 600))
    out = wire.decode(wire.encode(msg))
    assert isinstance(out, wire.BatchMsg)
    np.testing.assert_array_equal(out.data[1], big)


def test_a_batch_of_128_images_of_3x224x224_travels_in_one_frame() -> None:
    # One frame: a client with CPU tensors views it in place instead of joining frames.
    assert layout_module.chunk_sizes(128 * 3 * 224 * 224) == [128 * 3 * 224 * 224]
    assert layout_module.chunk_sizes(wire.MAX_FRAME_BYTES + 1) == [wire.MAX_FRAME_BYTES, 1]


def test_an_array_over_the_frame_limit_is_split_into_frames_of_the_limit() -> None:
    big = np.random.default_rng(0).integers(0, 255, size=(3, wire.MAX_FRAME_BYTES // 2 + 7),
                                            dtype=np.uint8)
    msg = _msg(x=big)
    frames = wire.encode(msg)
    assert [n for _, n in wire.BatchLayout.of(msg).frames] == [wire.MAX_FRAME_BYTES,
                                                              big.nbytes - wire.MAX_FRAME_BYTES]
    assert len(frames) == 1 + 2
    np.testing.assert_array_equal(wire.message_to_batch(_decode_batch(frames))["x"], big)


def test_empty_arrays_travel_as_one_empty_frame() -> None:
    msg = _msg(id=np.zeros(0, dtype=np.int64),
               t=Ragged(np.zeros(0, np.uint8), np.zeros(1, np.int64), "bytes"))
    layout = wire.BatchLayout.of(msg)
    assert layout.frames == ((0, 0), (0, 0), (0, 8))
    out = wire.message_to_batch(_decode_batch(wire.encode(msg)))
    assert np.asarray(out["id"]).shape == (0,) and len(out["t"]) == 0


def test_header_only_decode_announces_the_frames() -> None:
    msg = _msg(id=np.arange(3), t=Ragged(np.zeros(5, np.uint8), np.array([0, 2, 2, 5]), "str"))
    frames = wire.encode(msg)
    head = wire.decode_header(frames[0])
    assert isinstance(head, wire.BatchMsg) and head.data == ()
    assert [n for _, n in wire.BatchLayout.of(head).frames] == [
        _nbytes(f) for f in frames[1:]]


def _check(msg: wire.BatchMsg, frames: list) -> None:
    wire.BatchLayout.of(msg).check_frames(msg, [_nbytes(f) for f in frames], frames)


@pytest.mark.parametrize("offsets", [[1, 2, 2, 5], [0, 3, 2, 5], [0, 2, 2, 4], [0, 2, 2, 6]])
def test_ragged_offsets_that_do_not_fit_are_rejected(offsets: list[int]) -> None:
    msg = _msg(id=np.arange(3), t=Ragged(np.zeros(5, np.uint8), np.array([0, 2, 2, 5]), "str"))
    frames = [np.asarray(f).tobytes() for f in wire.encode(msg)]
    _check(msg, frames[1:])
    frames[3] = np.array(offsets, np.int64).tobytes()
    for check in (lambda: _check(msg, frames[1:]), lambda: wire.decode(frames)):
        with pytest.raises(ProtocolError, match="^BATCH 1 ragged field 't': offsets"):
            check()


def test_offsets_over_several_unaligned_frames_are_read_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout_module, "MAX_FRAME_BYTES", 20)
    offsets = np.array([0, 1, 1, 2, 2, 3], np.int64)
    msg = _msg(t=Ragged(np.zeros(3, np.uint8), offsets, "bytes"))
    frames = [np.asarray(f).tobytes() for f in wire.encode(msg)][1:]
    assert wire.BatchLayout.of(msg).counts == (1, 3)
    unaligned = [memoryview(b"?" + f)[1:] for f in frames]
    _check(msg, unaligned)
    frames[-1] = np.array([5], np.int64).tobytes()  # the last offset is 5, not 3
    with pytest.raises(ProtocolError, match="end at 3 values"):
        _check(msg, frames)


@pytest.mark.parametrize("change, message", [
    (lambda f: f[:-1], "BATCH 1 message must have 2 buffer frame(s) after the header. Found: 1"),
    (lambda f: [*f, b""], "BATCH 1 message must have 2 buffer frame(s) after the header. Found: 3"),
    (lambda f: [f[0], f[1][:-1]], "BATCH 1 buffer frame 1 must be 24 bytes. Found: 23"),
    (lambda f: [f[0] + b"x", f[1]], "BATCH 1 buffer frame 0 must be 3 bytes. Found: 4"),
])
def test_frames_missing_in_excess_or_of_another_size_are_rejected(change, message) -> None:
    msg = _msg(a=np.arange(3, dtype=np.uint8), b=np.arange(3, dtype=np.float64))
    frames = [np.asarray(f).tobytes() for f in wire.encode(msg)]
    for check in (lambda: _check(msg, change(frames[1:])),
                  lambda: wire.decode([frames[0], *change(frames[1:])])):
        with pytest.raises(ProtocolError, match=f"^{re.escape(message)}$"):
            check()


def test_arrays_rejects_a_buffer_too_small_or_not_uint8() -> None:
    msg = _msg(id=np.arange(3))
    layout = wire.BatchLayout.of(msg)
    for buf in (np.zeros(layout.nbytes - 1, np.uint8), np.zeros(layout.nbytes, np.int8)):
        with pytest.raises(ProtocolError, match="receive buffer"):
            layout.arrays(msg, buf)


def test_each_batch_s_piece_travels_in_frames_of_its_own_up_to_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout_module, "MAX_FRAME_BYTES", 1000)
    batches = [{"x": np.full((n, 600), k, np.uint8)} for k, n in enumerate((3, 1))]
    msg = wire.batches_to_message(2, batches, apart=True)
    layout = wire.BatchLayout.of(msg)
    assert layout.pieces == (((3, 2), (1, 1)),)
    assert layout.frames == ((0, 1000), (1000, 800), (1800, 600))
    assert layout.counts == (3,)
    out = _decode_batch(wire.encode(msg))
    np.testing.assert_array_equal(out.data[0], np.concatenate([b["x"] for b in batches]))
