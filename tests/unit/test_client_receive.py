"""The client's BATCH receiver over real ZeroMQ sockets, for every sink.

Each sink lands real encoded BATCH messages sent over loopback TCP: the zero-copy host sink
(tensors view ZeroMQ's messages), the pinned host sink (``recv_into`` a buffer of its own) and
the CUDA ring. Without a GPU the pinned allocator is plain host memory and the ring's device
copy is :class:`LateCopier`, a CPU copy run as late as a CUDA copy may finish, so the ring's
rules (a slot is received into only after its last copy finished, the consumer waits for the
copy) are checked on the CPU: breaking one of them lands wrong bytes in a batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import zmq

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.client.buffers import (
    TORCH_DTYPES,
    CudaSink,
    HostSink,
    Received,
    frame_views,
    hand_over,
    typed_views,
)
from dataflow.client.receive import receive_batch, receive_header
from dataflow.errors import ProtocolError

ENDPOINT = "tcp://test-server:1"


class LateEvent:
    """The event of a :class:`LateCopier` copy: the copy runs when it is first waited for."""

    def __init__(self, host: torch.Tensor, device: torch.Tensor) -> None:
        self._host = host
        self._device = device
        self.done = False
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self._device.copy_(self._host)
            self.done = True

    def wait(self, base: torch.Tensor) -> None:
        assert base is self._device
        self.waited = True
        self.synchronize()


class LateCopier:
    """A CudaSink's device copy on the CPU: host memory, and copies into fresh CPU tensors that
    run only when their event is first waited for (as late as a CUDA copy may finish).

    Attributes:
        hosts: every host buffer handed out (the ring's slots), in order.
        events: the event of every copy, in order.
    """

    def __init__(self) -> None:
        self.hosts: list[torch.Tensor] = []
        self.events: list[LateEvent] = []

    def host(self, nbytes: int) -> torch.Tensor:
        self.hosts.append(torch.empty(nbytes, dtype=torch.uint8))
        return self.hosts[-1]

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, LateEvent]:
        device = torch.empty_like(host)
        self.events.append(LateEvent(host, device))
        return device, self.events[-1]


def _host_memory(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


SINKS: dict[str, Callable[[], HostSink | CudaSink]] = {
    "zero-copy": lambda: HostSink(pin=False),
    "pinned": lambda: HostSink(pin=True, alloc=_host_memory),
    "ring": lambda: CudaSink(torch.device("cpu"), copier=LateCopier()),
}


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


@pytest.fixture(params=list(SINKS))
def sink(request: pytest.FixtureRequest) -> Iterator[HostSink | CudaSink]:
    s = SINKS[request.param]()
    yield s
    s.close()


def _batch(rows: int = 4, width: int = 40_000, seed: int = 0) -> dict:
    return {
        "image": (np.arange(rows * width, dtype=np.int64).reshape(rows, width) + seed) % 251,
        "id": np.arange(rows, dtype=np.int64) + 100 + seed,
        "text": Ragged(np.frombuffer(b"abcdefghij", dtype=np.uint8),
                       np.array([0, 1, 3, 6, 10][: rows + 1], dtype=np.int64), "str"),
    }


def _frames(batch: dict, req_id: int = 7) -> list[bytes]:
    return [bytes(f) for f in wire.encode(wire.batch_to_message(req_id, batch))]


def _ready(b: zmq.Socket, sink: HostSink | CudaSink) -> Received:
    assert b.poll(10_000)
    msg = receive_header(b, ENDPOINT)
    assert isinstance(msg, wire.BatchMsg)
    (ready,) = receive_batch(b, ENDPOINT, msg, sink)
    return ready


def _receive(b: zmq.Socket, sink: HostSink | CudaSink) -> dict[str, torch.Tensor]:
    return hand_over(_ready(b, sink))


def _assert_batch(got: dict[str, torch.Tensor], batch: dict) -> None:
    assert torch.equal(got["image"], torch.from_numpy(batch["image"]))
    assert torch.equal(got["id"], torch.from_numpy(batch["id"]))
    assert bytes(got["text"].numpy()) == b"abcdefghij"
    assert got["text.offsets"].tolist() == [0, 1, 3, 6, 10]


def test_every_sink_lands_a_batch(pair, sink):
    a, b = pair
    batch = _batch()
    a.send_multipart(_frames(batch))
    _assert_batch(_receive(b, sink), batch)


def _part(first: int, texts: list[bytes], width: int = 3000) -> dict:
    n = len(texts)
    return {"image": np.full((n, width), first % 251, dtype=np.uint8),
            "id": np.arange(first, first + n, dtype=np.int64),
            "text": Ragged(np.frombuffer(b"".join(texts) or b"", dtype=np.uint8).copy(),
                           np.cumsum([0, *map(len, texts)]).astype(np.int64), "bytes")}


def _assert_parts(readies: list[Received], parts: list[dict]) -> None:
    """Each received batch has its part's rows, values and offsets from 0."""
    assert len(readies) == len(parts)
    for ready, want in zip(readies, parts, strict=True):
        got = hand_over(ready)
        assert torch.equal(got["image"], torch.from_numpy(want["image"]))
        assert torch.equal(got["id"], torch.from_numpy(want["id"]))
        assert bytes(got["text"].numpy()) == bytes(want["text"].values)
        assert got["text.offsets"].tolist() == want["text"].offsets.tolist()


def test_every_sink_cuts_a_batch_of_several_into_views_of_each(pair, sink):
    """One message of three batches (one of them empty): three batches of the message's
    memory, each with its own rows, values and offsets from 0."""
    a, b = pair
    parts = [_part(0, [b"ab", b"", b"cde"]), _part(3, []), _part(3, [b"fghij", b"k"])]
    a.send_multipart([bytes(f) for f in wire.encode(wire.batches_to_message(7, parts))])
    assert b.poll(10_000)
    msg = receive_header(b, ENDPOINT)
    readies = receive_batch(b, ENDPOINT, msg, sink)
    _assert_parts(readies, parts)
    base = readies[0].tensors["image"].untyped_storage().data_ptr()
    assert all(r.tensors["image"].untyped_storage().data_ptr() == base for r in readies)


def test_every_sink_receives_batches_sent_apart_and_views_each_batch_s_own_frames(pair, sink):
    """A message whose batches travelled apart: the same batches; without pinning each batch's
    image is a view of the frame it arrived in (no batch was joined to another)."""
    a, b = pair
    parts = [_part(0, [b"ab", b"", b"cde"], width=40_000), _part(3, [], width=40_000),
             _part(3, [b"fghij", b"k"], width=40_000)]
    msg = wire.batches_to_message(7, parts, apart=True)
    a.send_multipart([bytes(f) for f in wire.encode(msg)])
    assert b.poll(10_000)
    head = receive_header(b, ENDPOINT)
    assert isinstance(head, wire.BatchMsg) and head.apart
    readies = receive_batch(b, ENDPOINT, head, sink)
    _assert_parts(readies, parts)
    bases = {r.tensors["image"].untyped_storage().data_ptr() for r in (readies[0], readies[2])}
    assert len(bases) == (2 if isinstance(sink, HostSink) and not sink.pin else 1)


def test_each_large_piece_of_a_batch_sent_apart_is_a_view_of_its_frame():
    parts = [_part(0, [b"ab", b"", b"cde"], width=40_000), _part(3, [b"fghij", b"k"],
                                                                  width=40_000)]
    msg = wire.batches_to_message(7, parts, apart=True)
    frames = [zmq.Frame(bytes(f)) for f in wire.encode(msg)[1:]]
    layout = wire.BatchLayout.of(msg)
    assert [s.name for s in msg.arrays][:2] == ["image", "id"] and layout.counts[:2] == (2, 2)
    images = frame_views(msg, layout, frames)[0]
    for image, frame, want in zip(images, frames[:2], parts, strict=True):
        assert image.data_ptr() == np.frombuffer(frame.buffer, dtype=np.uint8).ctypes.data
        assert torch.equal(image, torch.from_numpy(want["image"]))


def test_an_array_over_several_frames_is_joined(pair, sink):
    a, b = pair
    n = wire.MAX_FRAME_BYTES // 8 + 3
    batch = {"x": np.arange(n, dtype=np.int64).reshape(1, n)}
    frames = _frames(batch)
    assert len(frames) == 3  # header + two frames of one array
    a.send_multipart(frames)
    assert torch.equal(_receive(b, sink)["x"], torch.from_numpy(batch["x"]))


def test_empty_arrays_land_as_empty_frames(pair, sink):
    a, b = pair
    batch = {"id": np.zeros(0, dtype=np.int64),
             "t": Ragged(np.zeros(0, np.uint8), np.zeros(1, np.int64), "bytes")}
    a.send_multipart(_frames(batch))
    got = _receive(b, sink)
    assert got["id"].shape == (0,) and got["t"].shape == (0,)
    assert got["t.offsets"].tolist() == [0]


def test_kept_batches_are_never_overwritten(pair, sink):
    # Five batches held at once: more than the ring's three slots.
    a, b = pair
    batches = [_batch(seed=i) for i in range(5)]
    for i, batch in enumerate(batches):
        a.send_multipart(_frames(batch, req_id=i))
    kept = [_ready(b, sink) for _ in batches]
    for ready, batch in zip(kept, batches, strict=True):
        _assert_batch(hand_over(ready), batch)


def test_large_arrays_view_zeromq_messages_and_stay_writable(pair):
    a, b = pair
    batch = _batch()
    a.send_multipart(_frames(batch))
    got = _receive(b, HostSink(pin=False))
    image = got.pop("image")
    del got
    image[0, 0] = -5  # the message outlives the receiver and is this batch's alone
    assert image[0, 0].item() == -5 and image.sum().item() == batch["image"].sum() - 5
    assert image.data_ptr() % 8 == 0


def test_large_arrays_of_every_dtype_keep_it_and_their_values(pair, sink):
    a, b = pair
    rng = np.random.default_rng(1)
    batch = {name: rng.integers(0, 2 if name == "bool" else 100, (2, 40_000)).astype(name)
             for name in sorted(wire.DTYPES)}
    a.send_multipart(_frames(batch))
    got = _receive(b, sink)
    for name, arr in batch.items():
        assert got[name].dtype == TORCH_DTYPES[name], name
        assert got[name].cpu().numpy().tobytes() == arr.tobytes(), name


def _mangle_offsets(frames: list[bytes]) -> list[bytes]:
    offsets = np.array([0, 1, 3, 2, 10], dtype=np.int64).tobytes()
    return [*frames[:-1], offsets]


@pytest.mark.parametrize("mangle, message", [
    (lambda f: f[:-1], "BATCH 7 message must have 4 buffer frame(s) after the header. Found: 3"),
    (lambda f: f[:2], "BATCH 7 message must have 4 buffer frame(s) after the header. Found: 1"),
    (lambda f: [*f, b"x", b"y"], "BATCH 7 message must have 4 buffer frame(s) after the "
                                 "header. Found: 6"),
    (lambda f: [f[0], f[1][:-8], *f[2:]], "BATCH 7 buffer frame 0 must be 1280000 bytes. "
                                          "Found: 1279992"),
    (lambda f: [*f[:2], f[2] + b"x", *f[3:]], "BATCH 7 buffer frame 1 must be 32 bytes. "
                                              "Found: 33"),
    (_mangle_offsets, "BATCH 7 ragged field 'text': offsets must start at 0, never decrease "
                      "and end at 10 values"),
])
def test_malformed_batches_are_named_and_the_socket_stays_usable(pair, sink, mangle, message):
    a, b = pair
    a.send_multipart(mangle(_frames(_batch())))
    with pytest.raises(ProtocolError, match=f"^{re.escape(ENDPOINT)}: {re.escape(message)}$"):
        _receive(b, sink)
    batch = _batch(seed=1)
    a.send_multipart(_frames(batch, req_id=8))
    _assert_batch(_receive(b, sink), batch)


def _apart_frames() -> list[bytes]:
    parts = [_part(0, [b"ab", b"", b"cde"], width=40_000), _part(3, [b"fghij", b"k"],
                                                                  width=40_000)]
    return [bytes(f) for f in wire.encode(wire.batches_to_message(7, parts, apart=True))]


@pytest.mark.parametrize("mangle, message", [
    (lambda f: [f[0], f[1] + f[2], *f[3:]], "BATCH 7 message must have 7 buffer frame(s) after "
                                            "the header. Found: 6"),
    (lambda f: [f[0], f[1][:-1], f[2] + b"x", *f[3:]], "BATCH 7 buffer frame 0 must be "
                                                       "120000 bytes. Found: 119999"),
    (lambda f: [*f[:-2], np.array([0, 3, 2, 5], np.int64).tobytes(), f[-1]],
     "BATCH 7 ragged field 'text': each batch's offsets must start at 0 and never decrease"),
    (lambda f: [json.dumps({**json.loads(f[0]), "parts": [2, 3]}).encode(), *f[1:]],
     "BATCH 7 buffer frame 0 must be 80000 bytes. Found: 120000"),
])
def test_malformed_batches_sent_apart_are_named_and_the_socket_stays_usable(pair, sink, mangle,
                                                                             message):
    """A message sent apart whose frames, offsets or parts do not fit: an error naming the
    endpoint and the request, nothing made of it, and the next message is received whole."""
    a, b = pair
    a.send_multipart(mangle(_apart_frames()))
    with pytest.raises(ProtocolError, match=f"^{re.escape(ENDPOINT)}: {re.escape(message)}$"):
        _receive_all(b, sink)
    batch = _batch(seed=1)
    a.send_multipart(_frames(batch, req_id=8))
    _assert_batch(_receive(b, sink), batch)


def _receive_all(b: zmq.Socket, sink: HostSink | CudaSink) -> list[Received]:
    assert b.poll(10_000)
    msg = receive_header(b, ENDPOINT)
    assert isinstance(msg, wire.BatchMsg)
    return receive_batch(b, ENDPOINT, msg, sink)


def _ring() -> tuple[CudaSink, LateCopier]:
    copier = LateCopier()
    return CudaSink(torch.device("cpu"), slots=3, copier=copier), copier


def test_a_slot_is_received_into_only_after_its_last_copy_finished(pair):
    a, b = pair
    sink, copier = _ring()
    for i in range(5):
        a.send_multipart(_frames(_batch(seed=i), req_id=i))
    for _ in range(3):
        _ready(b, sink)
    assert [e.done for e in copier.events] == [False] * 3 and len(copier.hosts) == 3
    _ready(b, sink)  # into slot 0 again: batch 0's copy had to finish first
    assert [e.done for e in copier.events] == [True, False, False, False]
    _ready(b, sink)
    assert [e.done for e in copier.events] == [True, True, False, False, False]
    assert len(copier.hosts) == 3  # the slots are reused
    sink.close()
    assert all(e.done for e in copier.events)
    sink.close()


def test_hand_over_makes_the_consumer_wait_for_the_copy(pair):
    a, b = pair
    sink, copier = _ring()
    a.send_multipart(_frames(_batch()))
    ready = _ready(b, sink)
    assert ready.event is copier.events[0] and not ready.event.query()
    _assert_batch(hand_over(ready), _batch())
    assert copier.events[0].waited and ready.event.query()
    sink.close()


def test_a_slot_grows_for_a_bigger_batch_and_keeps_its_size(pair):
    a, b = pair
    sink, copier = _ring()
    small, big = _batch(width=20_000), _batch(width=60_000, seed=1)
    for i, batch in enumerate([small, small, small, big, small]):
        a.send_multipart(_frames(batch, req_id=i))
    kept = [_ready(b, sink) for _ in range(5)]
    assert [h.numel() for h in copier.hosts] == [
        wire.BatchLayout.of(wire.batch_to_message(0, batch)).nbytes
        for batch in (small, small, small, big)]  # slot 0 grew; slot 1 was big enough
    for ready, batch in zip(kept, [small, small, small, big, small], strict=True):
        _assert_batch(hand_over(ready), batch)
    sink.close()


def test_typed_views_over_one_buffer():
    specs = (wire.ArraySpec("a", "int64", (3,)), wire.ArraySpec("b", "bool", (3, 2)),
             wire.ArraySpec("c", "float16", (3,)))
    layout = wire.BatchLayout.of(wire.BatchMsg(1, 3, specs))
    assert all(o % wire.ALIGN == 0 for o in layout.offsets) and layout.nbytes >= 24 + 6 + 6
    views = typed_views(torch.zeros(layout.nbytes, dtype=torch.uint8), specs, layout.offsets)
    assert views["a"].dtype == torch.int64 and views["a"].shape == (3,)
    assert views["b"].dtype == torch.bool and views["b"].shape == (3, 2)
    assert views["c"].dtype == torch.float16
