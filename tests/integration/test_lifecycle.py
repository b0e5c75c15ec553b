"""Server lifecycle: clean SIGTERM shutdown, worker replacement, STATS."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from prometheus_client import CollectorRegistry
from srvtools import pid_alive, repo_env, wait_for

from dataflow.client import DataLoader, MixtureLoader, Source
from dataflow.errors import LoaderClosedError, ServerUnavailable
from dataflow.server import launch


@pytest.mark.timeout(60)
def test_sigterm_exits_cleanly_without_orphans(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    workers = server.ready["worker_pids"]
    assert len(workers) == 2 and all(pid_alive(p) for p in workers)
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, timeout=20) as dl:
        next(iter(dl))
        start = time.monotonic()
        assert server.close(grace=10) == 0
        assert time.monotonic() - start < 5
    assert not any(pid_alive(p) for p in workers)
    assert not pid_alive(server.pid)


@pytest.mark.timeout(60)
def test_dead_worker_is_replaced(demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=1)
    os.kill(server.ready["worker_pids"][0], signal.SIGKILL)
    probe = raw_client(server.endpoint)
    deadline = time.monotonic() + 20
    while probe.stats()["worker_restarts"] == 0:
        assert time.monotonic() < deadline, "worker not replaced"
        time.sleep(0.1)
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, timeout=20) as dl:
        ids = [i for b in dl for i in b["id"].tolist()]
    assert sorted(ids) == list(range(demo.total))
    stats = probe.stats()
    assert stats["workers"] == 1 and stats["worker_restarts"] == 1
    assert "worker_pids" not in stats


_LAUNCHER = textwrap.dedent("""
    import json, sys
    from dataflow.server import launch
    handle = launch(sys.argv[1:], workers=1, timeout=60)
    print(json.dumps([handle.pid, *handle.ready["worker_pids"]]), flush=True)
    sys.stdin.read()
""")


@pytest.mark.timeout(60)
def test_launched_server_exits_when_its_launcher_is_killed(tmp_path, demo_data) -> None:
    demo = demo_data("arrow")
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, *map(str, demo.paths)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    pids: list[int] = []
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        assert all(pid_alive(p) for p in pids)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in pids), "server outlived the process that launched it"
    finally:
        launcher.kill()
        for p in pids:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_server_that_cannot_start_reports_its_error(tmp_path) -> None:
    spec = str(tmp_path / "missing-*.tar")
    with pytest.raises(ServerUnavailable, match=r"(?s)exited with code 1.*matches no shard"):
        launch([spec], workers=1, timeout=60)


SLEEPY = """
import time

def sleepy(batch):
    time.sleep(5)
    return batch
"""


@pytest.mark.timeout(60)
def test_close_from_another_thread_makes_a_waiting_next_raise_loader_closed(
        demo_data, servers, tmp_path) -> None:
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    server = servers([str(p) for p in demo_data("arrow").paths], env=repo_env(str(tmp_path)),
                     extra_args=["--transform", "sleepy:sleepy"])
    raised: list[BaseException] = []
    dl = DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, timeout=30)
    waiting = threading.Event()

    def consume() -> None:
        it = iter(dl)
        waiting.set()
        try:
            next(it)  # the server's transform takes 5 s: this waits
        except BaseException as e:
            raised.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert waiting.wait(10)
    time.sleep(0.3)
    dl.close()
    consumer.join(20)
    assert not consumer.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], LoaderClosedError), raised
    with pytest.raises(LoaderClosedError):
        iter(dl)


def _zmq_io_threads() -> int:
    """ZeroMQ I/O threads of this process (libzmq names them ``ZMQbg/IO/<n>``)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().startswith("ZMQbg/IO/")
        except OSError:
            pass  # the thread ended meanwhile
    return count


@pytest.mark.timeout(60)
def test_io_threads_are_the_loaders_own_and_end_with_it(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    before = _zmq_io_threads()
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, timeout=20,
                    shuffle=False, io_threads=3) as dl:
        assert _zmq_io_threads() == before + 3
        ids = [i for b in dl for i in b["id"].tolist()]
        kept = next(iter(dl))  # a batch that outlives the loader (and its context)
    assert sorted(ids) == list(range(demo.total))
    assert _zmq_io_threads() == before
    assert kept["id"].tolist() == list(range(8))


@pytest.mark.timeout(60)
def test_a_loader_dropped_without_close_stops_its_io_threads_at_once(demo_data,
                                                                    servers) -> None:
    """No reference cycle holds a loader: dropped, it is freed at once (not by the cyclic
    garbage collector, which may run its finalizer on one of its own I/O threads), and its
    I/O threads end."""
    endpoint = servers([str(p) for p in demo_data("arrow").paths]).endpoint
    sources = [Source(endpoint, 1, name="a"), Source(endpoint, 1, name="b")]
    makers = (lambda: DataLoader(endpoint, batch_size=8, rank=0, world_size=1, timeout=20),
              lambda: MixtureLoader(sources, batch_size=8, rank=0, world_size=1, timeout=20),
              lambda: MixtureLoader(sources, batch_size=8, rank=0, world_size=1, timeout=20,
                                    metrics=CollectorRegistry()))
    gc.disable()
    try:
        for make in makers:
            loader = make()
            next(iter(loader))
            assert _client_io_threads()
            del loader
            wait_for(lambda: not _client_io_threads(), 10, "the dropped loader's I/O threads "
                     "to end")
    finally:
        gc.enable()


def _client_io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dataflow-client-io"]
