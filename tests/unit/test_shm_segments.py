"""Shared-memory segments and slots (:mod:`dataflow.shm`) and their wire fields: the segment
file's checks and crash cleanup on real files and processes, the slot ledger pure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from dataflow import wire
from dataflow.errors import ProtocolError, SegmentError
from dataflow.shm import SHM_DIR, Geometry, Mapped, Segment, SlotLedger, read_proof, remove_stale

GEO = Geometry(3, 4096)


def test_segment_is_private_sparse_and_proved_by_its_nonce(tmp_path) -> None:
    seg = Segment(GEO, str(tmp_path))
    try:
        st = os.stat(seg.path)
        assert st.st_mode & 0o777 == 0o600 and st.st_size == GEO.nbytes
        assert st.st_blocks * 512 < GEO.nbytes  # the slots take memory only once written
        assert read_proof(seg.name, GEO, str(tmp_path)) == seg.nonce
        mapped = Mapped(seg.name, GEO, str(tmp_path))
        mapped.reserve(2, 67)
        blocks = os.stat(seg.path).st_blocks
        assert mapped.reserved(2) == 67 and blocks > st.st_blocks
        mapped.reserve(2, 10)  # reserved already: the slot keeps its 67 bytes
        assert mapped.reserved(2) == 67 and mapped.reserved(1) == 0
        mapped.write(2, 64, memoryview(b"abc"))
        assert bytes(seg.slot(2, 67)[64:]) == b"abc"
        with pytest.raises(SegmentError, match="do not fit slot 2"):
            mapped.write(2, 4095, memoryview(b"ab"))
        assert not mapped.gone()
        seg.close()
        assert mapped.gone() and not os.path.exists(seg.path)
        mapped.close()
        mapped.close()
    finally:
        seg.close()


def test_a_named_segment_is_refused_unless_it_is_exactly_the_clients(tmp_path) -> None:
    seg = Segment(GEO, str(tmp_path))
    try:
        with pytest.raises(SegmentError, match="not the 8192 of 1 slot"):
            read_proof(seg.name, Geometry(1, 4096), str(tmp_path))
        with pytest.raises(SegmentError, match="not a shared-memory segment name"):
            read_proof("../" + seg.name, GEO, str(tmp_path))
        with pytest.raises(SegmentError, match="cannot open"):
            read_proof(seg.name, GEO, str(tmp_path / "elsewhere"))
        os.chmod(seg.path, 0o644)
        with pytest.raises(SegmentError, match="readable or writable by others"):
            read_proof(seg.name, GEO, str(tmp_path))
        os.chmod(seg.path, 0o600)
        link = tmp_path / seg.name.replace(seg.name[-32:], "0" * 32)
        link.symlink_to(seg.path)
        with pytest.raises(SegmentError, match="cannot open"):
            read_proof(link.name, GEO, str(tmp_path))
        fake = tmp_path / seg.name.replace(seg.name[-32:], "1" * 32)
        fake.write_bytes(b"\0" * GEO.nbytes)
        fake.chmod(0o600)
        with pytest.raises(SegmentError, match="no dataflow segment header"):
            read_proof(fake.name, GEO, str(tmp_path))
    finally:
        seg.close()


def test_a_segment_too_big_to_map_fails_creation_cleanly() -> None:
    with pytest.raises(SegmentError, match="cannot make a shared-memory segment"):
        Segment(Geometry(1, 1 << 60), SHM_DIR)
    assert not [n for n in os.listdir(SHM_DIR) if f"-{os.getpid()}-" in n]


def test_a_full_dev_shm_refuses_the_reservation_not_the_write() -> None:
    """A slot larger than what /dev/shm has free: reserving it fails cleanly (no SIGBUS)."""
    free = os.statvfs(SHM_DIR)
    slot = (free.f_bavail * free.f_frsize * 2 + 4096) // 64 * 64
    seg = Segment(Geometry(1, slot), SHM_DIR)
    try:
        mapped = Mapped(seg.name, seg.geometry, SHM_DIR)
        with pytest.raises(SegmentError, match=f"cannot reserve {slot} bytes"):
            mapped.reserve(0, slot)
        assert mapped.reserved(0) == 0  # a failed reservation is not counted
        mapped.reserve(0, 4096)
        mapped.write(0, 0, memoryview(b"ok"))
        assert bytes(seg.slot(0, 2)) == b"ok"
        with pytest.raises(SegmentError, match="do not fit slot 1"):
            mapped.reserve(1, 1)
        mapped.close()
    finally:
        seg.close()


CREATE = """
import sys, time
from dataflow.shm import Geometry, Segment
seg = Segment(Geometry(2, 4096), sys.argv[1])
print(seg.name, flush=True)
time.sleep(60)
"""


def test_the_segment_of_a_killed_creator_is_removed_and_a_live_ones_kept(tmp_path) -> None:
    mine = Segment(GEO, str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", CREATE, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        names = [p.stdout.readline().strip() for p in procs]
        assert all((tmp_path / n).exists() for n in names)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        assert remove_stale(str(tmp_path)) == [names[0]]
        assert sorted(os.listdir(tmp_path)) == sorted([mine.name, names[1]])
        assert remove_stale(str(tmp_path)) == []
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
            p.stdout.close()
        mine.close()
    assert remove_stale(str(tmp_path)) == [names[1]]


# -- the slot ledger (pure) ---------------------------------------------------------------------

def test_slots_are_lent_once_and_come_back_when_read_or_answered() -> None:
    ledger = SlotLedger(2, 100)
    assert [ledger.lend(1), ledger.lend(2), ledger.lend(3)] == [0, 1, -1]
    assert ledger.take(1, 0, 100, "ep") == 0
    assert ledger.lend(4) == -1  # taken, not read yet
    ledger.release(0)
    ledger.answered(2)  # an ERROR, or a reply in TCP frames
    ledger.answered(99)  # a request without a slot
    assert ledger.free == 2 and ledger.lent == 0
    assert ledger.lend(5) == 1  # the one freed last
    with pytest.raises(RuntimeError, match="holds slot 1"):
        ledger.lend(5)


def test_the_slot_freed_last_is_lent_first_so_a_session_touches_only_what_it_needs() -> None:
    """Two requests in flight at a time over many batches use two of the ten slots: the
    others never take memory (a slot's pages are allocated the first time it is written)."""
    ledger = SlotLedger(10, 100)
    used, held = set(), [ledger.lend(0)]
    for req_id in range(1, 50):
        held.append(ledger.lend(req_id))
        used.update(held)
        slot = held.pop(0)
        ledger.take(req_id - 1, slot, 10, "ep")
        ledger.release(slot)
    assert used == {0, 1}


def test_a_slot_read_by_a_copy_comes_back_when_the_copy_finished() -> None:
    ledger = SlotLedger(1, 100)
    slot = ledger.take(7, ledger.lend(7), 10, "ep")
    done = [False]
    ledger.release(slot, lambda: done[0])
    assert ledger.lend(8) == -1
    done[0] = True
    assert ledger.lend(8) == 0


@pytest.mark.parametrize(("req_id", "slot", "nbytes", "match"), [
    (2, 0, 10, "no slot was lent to that request"),
    (1, 1, 10, "slot 0 was lent to it"),
    (1, 0, 101, "which holds 100"),
])
def test_a_descriptor_naming_what_was_not_lent_is_a_protocol_error(req_id, slot, nbytes,
                                                                   match) -> None:
    ledger = SlotLedger(2, 100)
    assert ledger.lend(1) == 0
    with pytest.raises(ProtocolError, match=f"tcp://h:1: BATCH {req_id} .*{match}"):
        ledger.take(req_id, slot, nbytes, "tcp://h:1")
    assert ledger.lend(3) == 1 and ledger.lend(4) == -1  # the slot is never lent again


def test_releasing_a_slot_not_taken_is_an_impossible_state() -> None:
    ledger = SlotLedger(2, 100)
    ledger.lend(1)
    for slot in (0, 1, 2):
        with pytest.raises(RuntimeError, match="not taken"):
            ledger.release(slot)


# -- wire fields --------------------------------------------------------------------------------

NAME = "dataflow-1000-4026531836-42-" + "ab" * 16


def _header(frames: list) -> dict:
    return json.loads(bytes(frames[0]))


def test_shm_fields_are_left_out_when_unused_and_round_trip() -> None:
    assert "shm" not in _header(wire.encode(wire.Hello(4, "x")))
    assert "slot" not in _header(wire.encode(wire.Request(1, [[0, 0, 2]])))
    hello = wire.Hello(4, "x", shm=wire.ShmOffer(NAME, 4, 1 << 20))
    assert _header(wire.encode(hello))["shm"] == [NAME, 4, 1 << 20]
    assert wire.decode(wire.encode(hello)) == hello
    req = wire.Request(1, [[0, 0, 2]], slot=3)
    assert wire.decode(wire.encode(req)) == req
    index = wire.Index(2, 1, "{}", "tok", ("tcp://a:1",), shm="0f" * 16)
    assert wire.decode(wire.encode(index)) == index
    arr = np.arange(4, dtype=np.int64)
    msg = wire.batch_to_message(5, {"id": arr})
    ref = wire.BatchMsg(5, 4, msg.arrays, shm=wire.ShmRef(2, 64))
    frames = wire.encode(ref)
    assert len(frames) == 1 and _header(frames)["shm"] == [2, 64]
    assert wire.decode(frames) == ref


@pytest.mark.parametrize(("kind_msg", "key", "bad", "match"), [
    (wire.Hello(4, "x"), "shm", ["../etc/passwd", 1, 64], "HELLO header field `shm`"),
    (wire.Hello(4, "x"), "shm", [NAME, 0, 64], "HELLO header field `shm`"),
    (wire.Hello(4, "x"), "shm", [NAME, 1, 65], "HELLO header field `shm`"),
    (wire.Hello(4, "x"), "shm", [NAME, wire.MAX_SHM_SLOTS + 1, 64], "HELLO header field `shm`"),
    (wire.Hello(4, "x"), "shm", NAME, "HELLO header field `shm`"),
    (wire.Request(1, [[0, 0, 1]]), "slot", wire.MAX_SHM_SLOTS, "REQUEST header field `slot`"),
    (wire.Request(1, [[0, 0, 1]]), "slot", True, "REQUEST header field `slot`"),
    (wire.Index(2, 1, "{}", "t", ("a",)), "shm", "XY" * 16, "INDEX header field `shm`"),
])
def test_malformed_shm_fields_are_protocol_errors(kind_msg, key, bad, match) -> None:
    frames = wire.encode(kind_msg)
    header = {**_header(frames), key: bad}
    with pytest.raises(ProtocolError, match=match):
        wire.decode([json.dumps(header).encode(), *frames[1:]])


@pytest.mark.parametrize(("ref", "extra", "match"), [
    ([0, 63], [], "BATCH header field `shm`: the arrays take 64 bytes"),
    ([0, 64], [b"x"], "must have 0 buffer frame"),
    ([-1, 64], [], "BATCH header field `shm`"),
    ([0, "64"], [], "BATCH header field `shm`"),
    ([0], [], "BATCH header field `shm`"),
])
def test_malformed_descriptors_are_protocol_errors(ref, extra, match) -> None:
    msg = wire.batch_to_message(5, {"id": np.arange(4, dtype=np.int64)})
    header = {**_header(wire.encode(wire.BatchMsg(5, 4, msg.arrays, shm=wire.ShmRef(0, 64)))),
              "shm": ref}
    with pytest.raises(ProtocolError, match=match):
        wire.decode([json.dumps(header).encode(), *extra])
