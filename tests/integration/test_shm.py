"""Same-host shared memory (:mod:`dataflow.client.shmring`, :mod:`dataflow.server.shmserve`):
batches land in a segment the loader made in ``/dev/shm``, with every guarantee of the TCP
path. Real servers on loopback share this host and user, so ``shared_memory="auto"`` uses it;
each test proves it was used (or not) from the counters, and that every sample arrived exactly
once, and that no segment of this process is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from netns import servers_on
from srvtools import repo_env, wait_for

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.shm import SHM_DIR, Geometry, Segment

SLOW = '''
import os, time

def slow(batch):
    time.sleep(float(os.environ["SLOW_S"]))
    return batch
'''


def _segments(pid: int | None = None) -> set[str]:
    """Segments in /dev/shm of this user (of process ``pid`` when given)."""
    mine = f"dataflow-{os.getuid()}-"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)
            and (pid is None or n.split("-")[3] == str(pid))}


def _loader(endpoints, **kw) -> DataLoader:
    return DataLoader(endpoints, **{"batch_size": 8, "rank": 0, "world_size": 1,
                                    "shuffle": False, "prefetch": 2, "timeout": 20, **kw})


def _epoch(dl: DataLoader) -> list[dict]:
    return [{k: v.clone() for k, v in b.items()} for b in dl]


def _ids(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


@pytest.mark.timeout(90)
def test_whole_epochs_through_shared_memory_are_exact_and_equal_tcp(demo_data,
                                                                     servers) -> None:
    demo = demo_data("arrow")
    paths = [str(p) for p in demo.paths]
    a, b = servers(paths, workers=2), servers(paths, workers=1)
    # no read-ahead: every batch received is delivered, so the counts can be compared
    with _loader([a.endpoint, b.endpoint], shuffle=True, seed=3, read_ahead=False) as dl:
        assert _segments(os.getpid())  # one per server session
        epochs = []
        for epoch in range(2):
            dl.set_epoch(epoch)
            epochs.append(_epoch(dl))
            assert sorted(_ids(epochs[-1])) == list(range(dl.index.total))
        stats = dl.stats()
        assert stats["shm_sessions"] == 2
        assert stats["shm_batches"] == stats["delivered"] == sum(map(len, epochs))
    assert not _segments(os.getpid())
    with _loader([a.endpoint, b.endpoint], shuffle=True, seed=3,
                 shared_memory="off") as dl:
        dl.set_epoch(1)
        tcp = _epoch(dl)
        assert dl.stats()["shm_batches"] == 0 and dl.stats()["shm_sessions"] == 0
    assert len(tcp) == len(epochs[1])
    for x, y in zip(tcp, epochs[1], strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k].numpy(), y[k].numpy()), k


@pytest.mark.timeout(90)
def test_a_killed_server_fails_over_exactly_and_leaves_no_segment(demo_data, servers,
                                                                  tmp_path) -> None:
    (tmp_path / "slow_transform.py").write_text(SLOW)
    paths = [str(p) for p in demo_data("arrow").paths]
    a, b = (servers(paths, env={**repo_env(str(tmp_path)), "SLOW_S": delay},
                    extra_args=["--transform", "slow_transform:slow"]) for delay in ("0.02", "0.3"))
    with _loader([a.endpoint, b.endpoint], grace=1) as dl:
        it = iter(dl)
        ids = [i for _ in range(4) for i in next(it)["id"].tolist()]
        assert dl.stats()["shm_sessions"] == 2
        os.kill(b.pid, signal.SIGKILL)
        ids += [i for batch in it for i in batch["id"].tolist()]
        assert ids == list(range(dl.index.total))
        wait_for(lambda: dl.stats()["servers_lost"] == 1, 30, "the killed server to be lost")
        stats = dl.stats()
        assert stats["rerequested"] >= 1 and stats["shm_batches"] > 0
        assert len(_segments(os.getpid())) == 1  # the lost server's was unlinked
    assert not _segments(os.getpid())


TRAINER = """
import sys
from dataflow.client import DataLoader
dl = DataLoader(sys.argv[1], batch_size=8, rank=0, world_size=1, shuffle=False, prefetch=2,
                timeout=20)
it = iter(dl)
next(it)
print(dl.stats()["shm_sessions"], flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(90)
def test_a_killed_trainers_segment_is_removed_by_the_next_loader(demo_data, servers) -> None:
    server = servers([str(p) for p in demo_data("arrow").paths])
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, server.endpoint],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
        left = _segments(proc.pid)
        assert len(left) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait(10)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
    assert _segments(proc.pid) == left  # nobody unlinked it: SIGKILL
    with _loader(server.endpoint) as dl:
        assert not _segments(proc.pid)  # removed at start
        assert _ids(_epoch(dl)) == list(range(dl.index.total))
        assert dl.stats()["shm_batches"] > 0
    assert not _segments(os.getpid())


@pytest.mark.timeout(90)
def test_a_refusing_server_uses_tcp_frames_exactly(demo_data, servers, raw_client) -> None:
    paths = [str(p) for p in demo_data("arrow").paths]
    refusing = servers(paths, extra_args=["--shared-memory", "refuse"])
    sharing = servers(paths)
    with _loader([refusing.endpoint, sharing.endpoint], read_ahead=False) as dl:
        assert _ids(_epoch(dl)) == list(range(dl.index.total))
        stats = dl.stats()
        assert stats["shm_sessions"] == 1  # only the sharing server's
        assert 0 < stats["shm_batches"] < stats["delivered"]
        assert len(_segments(os.getpid())) == 1  # the refused segment was unlinked at once
    assert raw_client(refusing.endpoint).stats()["shm_sessions"] == 0


@dataclass(frozen=True)
class OtherShm:
    """127.0.0.1 in a mount namespace of its own with a fresh tmpfs on /dev/shm: a server
    that cannot see this process's segments, as on another host or in another container."""

    ns: str = "a private /dev/shm"
    ip: str = "127.0.0.1"

    def exec_args(self, argv: list[str]) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh", *argv]


def _no_unshare() -> str | None:
    if os.geteuid() != 0:
        return "a mount namespace needs root"
    probe = subprocess.run(OtherShm().exec_args(["true"]), capture_output=True, timeout=10)
    return None if probe.returncode == 0 else f"unshare failed: {probe.stderr[-200:]!r}"


@pytest.mark.timeout(90)
def test_a_server_that_cannot_see_the_segment_uses_tcp_frames(demo_data) -> None:
    why = _no_unshare()
    if why:
        pytest.skip(why)
    paths = [str(p) for p in demo_data("arrow").paths]
    with servers_on([OtherShm()], paths, 0) as endpoints, _loader(endpoints) as dl:
        assert _ids(_epoch(dl)) == list(range(dl.index.total))
        assert dl.stats()["shm_sessions"] == 0 and dl.stats()["shm_batches"] == 0
        assert not _segments(os.getpid())  # unlinked once the INDEX proved nothing


NAME = "dataflow-{uid}-1-{pid}-" + "ab" * 16


@pytest.mark.timeout(60)
def test_malformed_or_unproved_shared_memory_requests_never_hurt_the_server(
        demo_data, servers, raw_client) -> None:
    server = servers([str(p) for p in demo_data("arrow").paths])
    c = raw_client(server.endpoint)
    # a segment that does not exist: the session is served in TCP frames
    offer = wire.ShmOffer(NAME.format(uid=os.getuid(), pid=os.getpid()), 2, 4096)
    index = c.call(wire.Hello(2, "probe", shm=offer))
    assert isinstance(index, wire.Index) and index.shm == ""
    for slot, match in ((0, "no shared-memory segment"), (wire.MAX_SHM_SLOTS - 1,
                                                          "no shared-memory segment")):
        reply = c.call(wire.Request(1, [[0, 0, 2]], slot=slot))
        assert isinstance(reply, wire.ErrorMsg) and reply.kind is wire.ErrorKind.PROTOCOL
        assert match in reply.message
    header = json.dumps({"magic": wire.MAGIC, "version": wire.VERSION, "kind": 3, "req_id": 2,
                         "slot": -2, "n": 1}).encode()
    c.send_raw([header, np.array([[0, 0, 2]], dtype="<i8").tobytes()])
    reply = c.recv()
    assert isinstance(reply, wire.ErrorMsg) and "REQUEST header field `slot`" in reply.message
    reply = c.call(wire.Request(3, [[0, 0, 2]]))
    assert isinstance(reply, wire.BatchMsg) and reply.shm is None and reply.size == 2
    # a real segment of this user, offered by a raw client: proved, and a slot out of range
    seg = Segment(Geometry(2, 4096))
    try:
        d = raw_client(server.endpoint)
        index = d.call(wire.Hello(2, "probe", shm=wire.ShmOffer(seg.name, 2, 4096)))
        assert isinstance(index, wire.Index) and index.shm == seg.nonce.hex()
        reply = d.call(wire.Request(1, [[0, 0, 2]], slot=2))
        assert isinstance(reply, wire.ErrorMsg) and "has 2" in reply.message
        reply = d.call(wire.Request(2, [[0, 0, 2]], slot=1))
        assert isinstance(reply, wire.BatchMsg) and reply.shm is not None
        assert reply.shm.slot == 1 and reply.data == ()
        # another session offering the same segment is not given it: TCP frames
        e = raw_client(server.endpoint)
        index = e.call(wire.Hello(2, "copycat", shm=wire.ShmOffer(seg.name, 2, 4096)))
        assert isinstance(index, wire.Index) and index.shm == ""
        refused = e.call(wire.Request(1, [[0, 0, 2]], slot=0))
        assert isinstance(refused, wire.ErrorMsg) and "no shared-memory segment" in refused.message
        layout = wire.BatchLayout.of(reply)
        where = {s.name: (s, off) for s, off in zip(reply.arrays, layout.offsets, strict=True)}
        spec, off = where["id"]
        ids = np.frombuffer(seg.slot(1, off + spec.nbytes)[off:], dtype=spec.dtype)
        assert ids.tolist() == [0, 1]
        # a batch bigger than a slot comes in frames
        reply = d.call(wire.Request(3, [[0, 0, 60]], slot=0))
        assert isinstance(reply, wire.BatchMsg) and reply.shm is None and reply.size == 60
    finally:
        seg.close()
    assert server.proc.poll() is None
    assert raw_client(server.endpoint).stats()["shm_sessions"] == 1


@pytest.mark.timeout(90)
def test_requests_are_sized_to_a_slot_while_replies_land_in_shared_memory(demo_data, servers,
                                                                          raw_client) -> None:
    """Slots of a page (4 KiB, the least): fewer than 4 batches fit, so each batch goes alone
    through shared memory; over TCP 8 go a request (up to 32 MiB)."""
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=1)
    probe = raw_client(server.endpoint)
    probe.stats()
    with _loader([server.endpoint], shared_memory="off") as dl:
        first = next(iter(dl))
    slot = 4096
    assert 4 * sum(t.numel() * t.element_size() for t in first.values()) > slot
    seen = {}
    for mode in ("auto", "off"):
        before = probe.stats()["requests"]
        with _loader([server.endpoint], shared_memory=mode, shared_memory_slot_bytes=slot,
                     read_ahead=False) as dl:
            batches = _epoch(dl)
            assert sorted(_ids(batches)) == list(range(dl.index.total))
            assert (dl.stats()["shm_batches"] == len(batches)) == (mode == "auto")
        seen[mode] = (probe.stats()["requests"] - before, len(batches))
    (shm_requests, n), (tcp_requests, m) = seen["auto"], seen["off"]
    assert n == m >= 32
    assert shm_requests == n and tcp_requests <= 1 + (n - 1 + 7) // 8 + 2, seen
