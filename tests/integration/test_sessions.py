"""Client sessions survive long pauses and stalled client threads; a lost session is reported.

The bench once saw a fresh DataLoader lose its session: the garbage collector ran a peer
loader's finalizer (torch's ``_MultiProcessingDataLoaderIter.__del__`` joining its worker
processes, 5 s each) on the client's I/O thread, which sent no heartbeat for longer than the
server's ``--client-ttl``; the server freed the session although the client was alive.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from dataflow.client import DataLoader

TTL = "1"

_BLOCKED_IO_THREAD = textwrap.dedent("""
    import gc, subprocess, sys, threading, time
    from dataflow.client import DataLoader

    class JoinsChildInFinalizer:
        '''Cyclic garbage whose finalizer waits for a real child process, like torch's
        DataLoader iterator shutting down its workers.'''

        def __init__(self, seconds):
            self.cycle = self
            self.seconds = seconds
            self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        def __del__(self):
            print("finalizer ran on", threading.current_thread().name, flush=True)
            try:
                self.child.wait(self.seconds)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()

    block_s = float(sys.argv[2])
    pause_s = block_s + 1.0
    with DataLoader(sys.argv[1], batch_size=4, rank=0, world_size=1, shuffle=False,
                    prefetch=2, timeout=30) as dl:
        it = iter(dl)
        ids = next(it)["id"].tolist()
        gc.disable()
        JoinsChildInFinalizer(block_s)
        gc.set_threshold(1)
        gc.enable()
        time.sleep(pause_s)  # allocates nothing: the I/O thread triggers the collection
        gc.set_threshold(700)
        for batch in it:
            ids += batch["id"].tolist()
        print("ids", len(ids), len(set(ids)), flush=True)
""")


@pytest.mark.timeout(60)
def test_session_survives_io_thread_blocked_by_foreign_finalizer(tmp_path, demo_data, servers,
                                                                 raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--client-ttl", TTL])
    done = subprocess.run([sys.executable, "-c", _BLOCKED_IO_THREAD, server.endpoint, "3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "finalizer ran on dataflow-client-io" in done.stdout, done.stdout
    assert f"ids {demo.total} {demo.total}" in done.stdout, done.stdout
    stats = raw_client(server.endpoint).stats()
    assert stats["clients_probed"] >= 1 and stats["clients_expired"] == 0


@pytest.mark.timeout(60)
def test_consumer_pause_longer_than_ttl_keeps_session(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--client-ttl", TTL])
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, shuffle=False,
                    prefetch=2, timeout=20) as dl:
        ids = []
        for i, batch in enumerate(dl):
            ids += batch["id"].tolist()
            if i in (1, 5):
                time.sleep(2.5)
    assert ids == list(range(demo.total))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
