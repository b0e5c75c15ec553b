"""The client's shared-memory rings (:mod:`dataflow.client.shmring`) over real segments (in
``tmp_path``), real ZeroMQ sockets and the server's real writer
(:class:`~dataflow.server.shmserve.Segments`): every sink gets the batch the server wrote, the
slot comes back when it was read (with a device copy reading the slot in place, only once
that copy finished), and what the client did not lend is refused."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import zmq
from test_client_receive import SINKS, LateCopier, pair  # noqa: F401 (a fixture)

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.client.buffers import CudaSink, HostSink, hand_over
from dataflow.client.receive import receive_header
from dataflow.client.shmring import PAGE_BYTES, VIEWS, ShmRings, receive_shared
from dataflow.errors import ProtocolError
from dataflow.server.shmserve import Segments
from dataflow.shm import Geometry, read_proof
from dataflow.wire.internal import Task

EP = "tcp://test-server:1"
GEO = Geometry(2, 1 << 20)


class Counts(dict):
    def __call__(self, name: str, n: int) -> None:
        self[name] = self.get(name, 0) + n


def _batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.integers(0, 255, (4, 3, 50, 50), dtype=np.uint8),
            "y": rng.standard_normal(4).astype(np.float32),
            "t": Ragged(np.arange(10, dtype=np.int32), np.array([0, 1, 5, 5, 10]), "list")}


@pytest.fixture
def rings(tmp_path) -> Iterator[tuple[ShmRings, Counts, Segments]]:
    counts = Counts()
    r = ShmRings(wire.Hello(1, "t"), 1, GEO, counts, directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    yield r, counts, segments
    r.close()
    segments.close()
    assert not os.listdir(tmp_path)


def _join(r: ShmRings, tmp_path, proof: str | None = None) -> wire.ShmOffer:
    hello = wire.decode(r.hello(0))
    assert isinstance(hello, wire.Hello) and hello.shm is not None
    if proof is None:
        proof = read_proof(hello.shm.name, GEO, str(tmp_path)).hex()
    r.joined(0, wire.Index(2, 1, "{}", "tok", ("tcp://x:1",), shm=proof), EP)
    return hello.shm


def _serve(segments: Segments, offer: wire.ShmOffer, req: wire.Request, batch: dict,
           sock: zmq.Socket) -> wire.BatchMsg:
    task = Task(b"tok", req.req_id, req.ranges, shm=offer, slot=req.slot)
    msg = segments.place(task, wire.batch_to_message(req.req_id, batch))
    sock.send_multipart(wire.encode(msg))
    return msg


def _recv(sock: zmq.Socket) -> wire.Message | None:
    assert sock.poll(10_000)
    return receive_header(sock, EP)


def _equal(got: dict, batch: dict) -> None:
    for name, want in batch.items():
        if isinstance(want, Ragged):
            assert np.array_equal(got[name].numpy(), want.values)
            assert np.array_equal(got[name + ".offsets"].numpy(), want.offsets)
        else:
            assert np.array_equal(got[name].numpy(), want), name


@pytest.mark.parametrize("kind", list(SINKS))
def test_every_sink_gets_what_the_server_wrote_and_the_slot_comes_back(
        kind, rings, pair, tmp_path) -> None:  # noqa: F811
    r, counts, segments = rings
    sink = SINKS[kind]()
    offer = _join(r, tmp_path)
    assert counts == {"shm_sessions": 1}
    for k in range(5):  # more batches than slots: each slot is lent again
        req = r.lend(0, wire.Request(k, [[0, 0, 4]]))
        assert req.slot in (0, 1)
        _serve(segments, offer, req, _batch(k), pair[0])
        msg = _recv(pair[1])
        assert isinstance(msg, wire.BatchMsg) and msg.shm is not None
        ring, slot = r.take(0, msg, EP)
        (ready,) = receive_shared(pair[1], EP, msg, ring, slot, sink, counts)
        got = hand_over(ready)
        _equal(got, _batch(k))
        del got, ready  # a view of its slot holds the slot until then
        assert ring.ledger.free == 2
    assert counts["shm_batches"] == 5
    sink.close()


def _pages(msg: wire.BatchMsg) -> int:
    return -(-wire.BatchLayout.of(msg).nbytes // PAGE_BYTES) * PAGE_BYTES


def _mapped(name: str) -> bool:
    with open("/proc/self/maps") as f:
        return name in f.read()


def test_a_registered_slot_is_copied_in_place_and_waits_for_the_copy(
        tmp_path, pair) -> None:  # noqa: F811
    """A slot's bytes are registered in whole pages as a device copy first reads them (a
    session pins what its slots in use were written, not its whole segment), again larger
    when a larger reply comes, and unregistered, and the segment unmapped, when the ring
    closes."""
    counts, registered, unregistered = Counts(), [], []

    def register(buf: memoryview):
        start = np.frombuffer(buf, np.uint8).ctypes.data
        registered.append((start, buf.nbytes))
        return lambda: unregistered.append((start, buf.nbytes))

    def serve(req: wire.Request, batch: dict) -> tuple[wire.BatchMsg, list]:
        _serve(segments, offer, req, batch, pair[0])
        msg = _recv(pair[1])
        return msg, receive_shared(pair[1], EP, msg, *r.take(0, msg, EP), sink, counts)

    r = ShmRings(wire.Hello(2, "t"), 2, GEO, counts, register=register,
                 directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    copier = LateCopier()
    sink = CudaSink(torch.device("cpu"), copier=copier)
    try:
        offer = _join(r, tmp_path)
        assert registered == []
        reqs = [r.lend(0, wire.Request(k, [[0, 0, 4]])) for k in range(2)]
        assert r.lend(0, wire.Request(9, [[0, 0, 4]])).slot == -1  # both lent: TCP frames
        msgs, readies = zip(*(serve(req, _batch(k)) for k, req in enumerate(reqs)), strict=True)
        assert copier.hosts == []  # no copy into the sink's own ring: read in place
        ring = r._rings[0]  # kept: its close unmaps the segment, not its garbage collection
        base = np.frombuffer(ring.segment.buf, np.uint8).ctypes.data
        at = [base + GEO.offset(req.slot) for req in reqs]
        assert registered == [(at[0], _pages(msgs[0])), (at[1], _pages(msgs[1]))]
        assert _pages(msgs[0]) < GEO.slot_bytes
        assert r.lend(0, wire.Request(10, [[0, 0, 4]])).slot == -1  # copies not finished
        _equal(hand_over(readies[0][0]), _batch(0))
        again = r.lend(0, wire.Request(11, [[0, 0, 4]]))
        assert again.slot == reqs[0].slot
        _equal(hand_over(readies[1][0]), _batch(1))
        big = {**_batch(2), "x": np.ones((4, 3, 100, 100), np.uint8)}
        msg, got = serve(again, big)
        _equal(hand_over(got[0]), big)
        assert registered[2:] == [(at[0], _pages(msg))] and unregistered == registered[:1]
        msg, got = serve(r.lend(0, wire.Request(12, [[0, 0, 4]])), _batch(3))
        _equal(hand_over(got[0]), _batch(3))
        assert len(registered) == 3 and copier.hosts == []  # registered large enough already
    finally:
        r.close()
        segments.close()
        sink.close()
    assert sorted(unregistered) == sorted(registered)
    assert not _mapped(offer.name) and ring.segment.name == offer.name
    assert not os.listdir(tmp_path)


def test_after_a_failed_registration_slots_are_copied_and_none_is_registered_again(
        tmp_path, pair) -> None:  # noqa: F811
    """A registration that fails (no room in ``/dev/shm`` to pin, say) is not tried again for
    the session: its batches are copied into the sink's own pinned ring."""
    counts, calls = Counts(), []
    r = ShmRings(wire.Hello(2, "t"), 2, GEO, counts,
                 register=lambda buf: calls.append(buf.nbytes) and None,
                 directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    copier = LateCopier()
    sink = CudaSink(torch.device("cpu"), copier=copier)
    try:
        offer = _join(r, tmp_path)
        for k in range(3):
            req = r.lend(0, wire.Request(k, [[0, 0, 4]]))
            msg = _serve(segments, offer, req, _batch(k), pair[0])
            msg = _recv(pair[1])
            got = receive_shared(pair[1], EP, msg, *r.take(0, msg, EP), sink, counts)
            _equal(hand_over(got[0]), _batch(k))
            if k == 0:
                assert calls == [_pages(msg)]
        assert len(calls) == 1
        assert len(copier.hosts) == 3 and counts["shm_batches"] == 3
    finally:
        r.close()
        segments.close()
        sink.close()
    assert not os.listdir(tmp_path)


def test_pinned_cpu_batches_are_copied_out_of_their_slot(tmp_path, pair) -> None:  # noqa: F811
    """A pinned CPU batch is copied into a buffer of its own (torch's caching host allocator:
    it guards a training loop's ``non_blocking`` copies from it), never a view of its slot,
    which is written again as soon as it is given back; the segment is not registered."""
    counts, calls = Counts(), []
    r = ShmRings(wire.Hello(1, "t"), 1, GEO, counts,
                 register=lambda buf: calls.append(buf.nbytes) or (lambda: None),
                 directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    sink = HostSink(pin=True, alloc=lambda n: torch.empty(n, dtype=torch.uint8))
    try:
        offer = _join(r, tmp_path)
        held = []
        for k in range(3):
            req = r.lend(0, wire.Request(k, [[0, 0, 4]]))
            _serve(segments, offer, req, _batch(k), pair[0])
            msg = _recv(pair[1])
            ring, slot = r.take(0, msg, EP)
            held += map(hand_over, receive_shared(pair[1], EP, msg, ring, slot, sink, counts))
            assert ring.ledger.free == GEO.slots  # given back at once
        segment = np.frombuffer(ring.segment.buf, np.uint8)
        for k, got in enumerate(held):
            _equal(got, _batch(k))
            assert not np.shares_memory(got["x"].numpy(), segment)
        assert calls == [] and counts["shm_batches"] == 3
        del segment
    finally:
        r.close()
        segments.close()
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("readers", [1, 3])
def test_cpu_batches_view_their_slot_until_freed_and_beyond_views_are_copied(
        readers, tmp_path, pair) -> None:  # noqa: F811
    """Unpinned CPU batches. A loader at ``prefetch`` 1 keeps a request at a server of one
    reader, and two (its grant) at one of three: as many replies waiting and :data:`VIEWS`
    more batches are held as views, however many the consumer keeps."""
    kept = min(readers, 2)
    counts, geo = Counts(), Geometry(2 * kept + VIEWS, 1 << 20)
    views = kept + VIEWS
    r = ShmRings(wire.Hello(256, "t"), 1, geo, counts, directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    sink = HostSink(pin=False)
    try:
        offer = wire.decode(r.hello(0)).shm
        r.joined(0, wire.Index(2, readers, "{}", "t", ("a",) * readers,
                               shm=read_proof(offer.name, geo, str(tmp_path)).hex()), EP)
        held = []
        for k in range(6):
            req = r.lend(0, wire.Request(k, [[0, 0, 4]]))
            assert req.slot >= 0  # `views` held as views, the rest copied out: never starved
            _serve(segments, offer, req, _batch(k), pair[0])
            msg = _recv(pair[1])
            ring, slot = r.take(0, msg, EP)
            held += map(hand_over, receive_shared(pair[1], EP, msg, ring, slot, sink, counts))
        assert ring.ledger.free == kept
        for k, got in enumerate(held):  # slots written again since: the views are intact
            _equal(got, _batch(k))
        segment = np.frombuffer(ring.segment.buf, np.uint8)
        assert [np.shares_memory(got["x"].numpy(), segment) for got in held] == [
            k < views for k in range(6)]
        del held[:views], got, segment
        assert ring.ledger.free == kept + views
    finally:
        r.close()
        segments.close()
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("kept", ["x", "y", "t.offsets"])
def test_any_one_tensor_of_a_viewed_batch_holds_its_slot(kept, rings, pair,  # noqa: F811
                                                         tmp_path) -> None:
    """The slot of a batch viewing it is not lent again while any one of its tensors (or a
    slice of one) lives, however the others were freed; then it is."""
    r, counts, segments = rings
    offer = _join(r, tmp_path)
    req = r.lend(0, wire.Request(0, [[0, 0, 4]]))
    _serve(segments, offer, req, _batch(0), pair[0])
    msg = _recv(pair[1])
    (ready,) = receive_shared(pair[1], EP, msg, *r.take(0, msg, EP), HostSink(pin=False),
                              counts)
    got = hand_over(ready)
    del ready
    tensor = got.pop(kept)[1:]
    want = tensor.clone()
    del got
    for k in range(1, 4):  # the other slot only, written again each time
        other = r.lend(0, wire.Request(k, [[0, 0, 4]]))
        assert other.slot not in (-1, req.slot)
        _serve(segments, offer, other, _batch(k), pair[0])
        _recv(pair[1])
        r.answered(0, k)  # as a reply discarded: its slot is free again
    assert torch.equal(tensor, want)
    assert r.lend(0, wire.Request(9, [[0, 0, 4]])).slot != req.slot
    del tensor
    assert r.lend(0, wire.Request(10, [[0, 0, 4]])).slot == req.slot


def test_what_was_not_lent_is_refused_naming_the_endpoint(rings, pair, tmp_path) -> None:  # noqa: F811
    r, _, segments = rings
    offer = _join(r, tmp_path)
    req = r.lend(0, wire.Request(1, [[0, 0, 4]]))
    msg = _serve(segments, offer, req, _batch(0), pair[0])
    _recv(pair[1])
    forged = wire.BatchMsg(2, msg.size, msg.arrays, msg.ragged, shm=msg.shm)
    with pytest.raises(ProtocolError, match=f"{EP}: BATCH 2 .*no slot was lent"):
        r.take(0, forged, EP)
    with pytest.raises(ProtocolError, match="this session has no shared memory"):
        r.take(1, msg, EP)
    ring, slot = r.take(0, msg, EP)
    pair[0].send_multipart([*wire.encode(msg), b"extra"])
    _recv(pair[1])
    with pytest.raises(ProtocolError, match=f"{EP}: BATCH 1 in shared memory must have no"):
        receive_shared(pair[1], EP, msg, ring, slot, HostSink(pin=False), Counts())
    assert not pair[1].poll(0)  # the extra frame was drained


def test_a_reply_in_frames_or_an_error_frees_the_lent_slot(rings, tmp_path) -> None:
    r, _, _ = rings
    _join(r, tmp_path)
    a, b = r.lend(0, wire.Request(1, [[0, 0, 1]])), r.lend(0, wire.Request(2, [[0, 0, 1]]))
    assert {a.slot, b.slot} == {0, 1}
    assert r.take(0, wire.BatchMsg(1, 0, ()), EP) is None  # too big for a slot: frames
    r.answered(0, 2)  # an ERROR
    assert r.lend(0, wire.Request(3, [[0, 0, 1]])).slot >= 0
    assert r.lend(0, wire.Request(4, [[0, 0, 1]])).slot >= 0


def test_an_unproved_segment_is_unlinked_and_the_session_uses_frames(rings, tmp_path) -> None:
    r, counts, _ = rings
    _join(r, tmp_path, proof="")
    assert not os.listdir(tmp_path) and counts == {}
    assert r.lend(0, wire.Request(1, [[0, 0, 1]])).slot == -1
    _join(r, tmp_path, proof="00" * 16)  # another segment's nonce
    assert not os.listdir(tmp_path)


def test_a_server_that_predates_the_field_is_asked_again_without_it(rings) -> None:
    r, _, _ = rings
    assert wire.decode(r.hello(0)).shm is not None
    refusal = wire.ErrorMsg(-1, wire.ErrorKind.PROTOCOL, "HELLO header: unexpected field `shm`")
    assert not r.refused_field(0, wire.ErrorMsg(-1, wire.ErrorKind.PROTOCOL, "other"))
    assert r.refused_field(0, refusal)
    assert wire.decode(r.hello(0)).shm is None
    assert wire.decode(r.hello(1)).shm is not None  # another server is offered one


def test_off_offers_nothing(tmp_path) -> None:
    r = ShmRings(wire.Hello(2, "t"), 2, None, Counts(), directory=str(tmp_path))
    assert wire.decode(r.hello(0)) == wire.Hello(2, "t")
    assert not os.listdir(tmp_path)
