"""The client's BATCH receiver over real ZeroMQ sockets: zero-copy views and malformed frames."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import zmq

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.client.buffers import HostSink, typed_views
from dataflow.client.receive import receive_batch, receive_header
from dataflow.errors import ProtocolError

ENDPOINT = "tcp://test-server:1"


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    for s in (a, b):
        s.linger = 0
        s.rcvtimeo = 10_000
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    yield a, b
    a.close()
    b.close()
    ctx.term()


def _batch(rows: int = 4, width: int = 40_000) -> dict:
    return {
        "image": np.arange(rows * width, dtype=np.int64).reshape(rows, width) % 251,
        "id": np.arange(rows, dtype=np.int64) + 100,
        "text": Ragged(np.frombuffer(b"abcdefghij", dtype=np.uint8),
                       np.array([0, 1, 3, 6, 10][: rows + 1], dtype=np.int64), "str"),
    }


def _frames(batch: dict, req_id: int = 7) -> list[bytes]:
    return [bytes(f) for f in wire.encode(wire.batch_to_message(req_id, batch))]


def _receive(b: zmq.Socket, sink: HostSink) -> dict[str, torch.Tensor]:
    b.poll(10_000)
    msg = receive_header(b, ENDPOINT)
    assert isinstance(msg, wire.BatchMsg)
    return receive_batch(b, ENDPOINT, msg, sink).tensors


def test_large_arrays_view_zeromq_messages_and_stay_writable(pair):
    a, b = pair
    batch = _batch()
    a.send_multipart(_frames(batch))
    got = _receive(b, HostSink(pin=False))
    assert torch.equal(got["image"], torch.from_numpy(batch["image"]))
    assert got["id"].tolist() == [100, 101, 102, 103]
    assert bytes(got["text"].numpy()) == b"abcdefghij"
    assert got["text.offsets"].tolist() == [0, 1, 3, 6, 10]
    image = got.pop("image")
    del got
    image[0, 0] = -5  # the message outlives the receiver and is this batch's alone
    assert image[0, 0].item() == -5 and image.sum().item() == batch["image"].sum() - 5
    assert image.data_ptr() % 8 == 0


def test_an_array_over_several_frames_is_joined(pair):
    a, b = pair
    n = wire.MAX_FRAME_BYTES // 8 + 3
    batch = {"x": np.arange(n, dtype=np.int64).reshape(1, n)}
    frames = _frames(batch)
    assert len(frames) == 3  # header + two frames of one array
    a.send_multipart(frames)
    got = _receive(b, HostSink(pin=False))
    assert torch.equal(got["x"], torch.from_numpy(batch["x"]))


def _mangle_offsets(frames: list[bytes]) -> list[bytes]:
    offsets = np.array([0, 1, 3, 2, 10], dtype=np.int64).tobytes()
    return [*frames[:-1], offsets]


@pytest.mark.parametrize("mangle, message", [
    (lambda f: f[:-1], "BATCH 7 message must have 4 buffer frame(s) after the header. Found: 3"),
    (lambda f: [*f, b"x", b"y"], "BATCH 7 message must have 4 buffer frame(s) after the "
                                 "header. Found: 6"),
    (lambda f: [f[0], f[1][:-8], *f[2:]], "BATCH 7 buffer frame 0 must be 1280000 bytes. "
                                          "Found: 1279992"),
    (_mangle_offsets, "BATCH 7 ragged field 'text': offsets must start at 0, never decrease"),
])
def test_malformed_batches_are_named_and_the_socket_stays_usable(pair, mangle, message):
    a, b = pair
    sink = HostSink(pin=False)
    a.send_multipart(mangle(_frames(_batch())))
    with pytest.raises(ProtocolError, match=f"^{re.escape(ENDPOINT)}: .*{re.escape(message)}"):
        _receive(b, sink)
    a.send_multipart(_frames(_batch(), req_id=8))
    assert _receive(b, sink)["id"].tolist() == [100, 101, 102, 103]


def test_typed_views_over_one_buffer():
    specs = (wire.ArraySpec("a", "int64", (3,)), wire.ArraySpec("b", "bool", (3, 2)),
             wire.ArraySpec("c", "float16", (3,)))
    layout = wire.BatchLayout.of(wire.BatchMsg(1, 3, specs))
    assert all(o % wire.ALIGN == 0 for o in layout.offsets) and layout.nbytes >= 24 + 6 + 6
    views = typed_views(torch.zeros(layout.nbytes, dtype=torch.uint8), specs, layout.offsets)
    assert views["a"].dtype == torch.int64 and views["a"].shape == (3,)
    assert views["b"].dtype == torch.bool and views["b"].shape == (3, 2)
    assert views["c"].dtype == torch.float16
