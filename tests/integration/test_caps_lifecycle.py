"""Start-up and shutdown under the caps: taken ports, SIGKILL, SIGTERM notices, dead readers."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import torch
from srvtools import wait_for

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable
from dataflow.server import launch


@pytest.mark.timeout(60)
def test_a_port_in_use_fails_the_start_at_once_naming_the_endpoint(demo_data) -> None:
    demo = demo_data("arrow")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match="exited with code 1") as info:
            launch([str(p) for p in demo.paths], workers=1, bind=endpoint, timeout=60)
        elapsed = time.monotonic() - start
    assert f"--bind: port {endpoint.rsplit(':', 1)[1]} on 127.0.0.1 is taken" in str(info.value)
    assert "another process listens there" in str(info.value)
    assert elapsed < 15, f"took {elapsed:.1f} s"


def _unix_sockets_of(pid: int) -> list[str]:
    """Paths of the unix sockets ``pid`` holds (abstract names start with ``@``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [row[7] for row in rows if len(row) >= 8 and row[6] in inodes]


@pytest.mark.timeout(60)
def test_a_sigkilled_server_leaves_no_files_behind(tmp_path, demo_data, servers) -> None:
    demo = demo_data("arrow")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = servers([str(p) for p in demo.paths], workers=2, env={"TMPDIR": str(tmp)})
    named = _unix_sockets_of(server.pid)
    assert named and all(path.startswith("@dataflow-") for path in named), named
    os.kill(server.pid, signal.SIGKILL)
    server.close(grace=5)
    assert list(tmp.iterdir()) == [] and "runtime_dir" not in server.ready


@pytest.mark.timeout(60)
def test_sigterm_tells_every_session_that_the_server_is_stopping(demo_data, servers,
                                                                 raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    clients = [raw_client(server.endpoint) for _ in range(3)]
    for c in clients:
        assert isinstance(c.call(wire.Hello(1)), wire.Index)
    assert server.close(grace=10) == 0
    for c in clients:
        notice = c.recv(timeout=10)
        assert isinstance(notice, wire.ErrorMsg), notice
        assert notice.kind is wire.ErrorKind.SERVER_STOPPING and notice.req_id == -1


@pytest.mark.timeout(90)
def test_tasks_of_a_killed_reader_are_served_by_its_replacement(demo_data, servers,
                                                                raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=1)
    probe = raw_client(server.endpoint)
    probe.stats()  # its session opens while the reader answers
    reader = server.ready["worker_pids"][0]
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, prefetch=4,
                    timeout=30) as dl:
        # Stopped before the pass asks for anything: whatever the machine's load, the reader
        # then holds exactly --worker-queue (2) requests, none of them served.
        os.kill(reader, signal.SIGSTOP)
        it = iter(dl)
        wait_for(lambda: probe.stats()["in_flight"] == 2, 10, "two tasks at the reader")
        os.kill(reader, signal.SIGKILL)
        ids = torch.cat([b["id"] for b in it]).tolist()
    assert sorted(ids) == list(range(demo.total))
    stats = probe.stats()
    assert stats["worker_restarts"] == 1 and stats["tasks_requeued"] == 2
