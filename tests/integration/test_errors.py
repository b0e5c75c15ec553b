"""Server-side errors reach the client as RemoteError; dead servers as ServerUnavailable."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time

import pytest
import zmq
from srvtools import pid_alive, repo_env

from dataflow.client import DataLoader
from dataflow.errors import RemoteError, ServerUnavailable
from dataflow.server import launch
from dataflow.wire import ErrorKind

TRANSFORM = '''
def fail_on_big_id(batch):
    if (batch["id"] >= 100).any():
        raise ValueError("transform refuses ids >= 100")
    return batch
'''


@pytest.mark.timeout(60)
def test_transform_error_reaches_client(demo_data, servers, tmp_path) -> None:
    (tmp_path / "my_transform.py").write_text(TRANSFORM)
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], env=repo_env(str(tmp_path)),
                     extra_args=["--transform", "my_transform:fail_on_big_id"])
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, shuffle=False,
                    timeout=20) as dl:
        got = []
        with pytest.raises(RemoteError, match="transform refuses ids >= 100") as info:
            for batch in dl:
                got.extend(batch["id"].tolist())
    assert info.value.kind is ErrorKind.READ_FAILED and info.value.endpoint == server.endpoint
    # Named: the transform, the batch (epoch, global index, shard ranges), the cause.
    # Batch 12 of the unshuffled order holds ids 96-103, the first over 99.
    assert re.match(r"TransformError: transform 'my_transform:fail_on_big_id' on batch 12 of "
                    r"epoch 0 \(train-\d+\.arrow\[\d+:\d+\].*\): ValueError: transform refuses",
                    info.value.remote_message), info.value.remote_message
    assert got == list(range(len(got))) and len(got) <= 100


@pytest.mark.timeout(60)
def test_corrupt_shard_reaches_client(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    paths = [shutil.copy(p, tmp_path) for p in demo.paths]
    server = servers(paths)
    victim = paths[3]
    with open(victim, "r+b") as f:
        f.write(b"\x00garbage" * (os.path.getsize(victim) // 8))
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, timeout=20) as dl:
        with pytest.raises(RemoteError) as info:
            for _ in dl:
                pass
    assert os.path.basename(victim) in str(info.value)


@pytest.mark.timeout(60)
def test_killed_server_gives_server_unavailable(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    workers = server.ready["worker_pids"]
    with DataLoader(server.endpoint, batch_size=4, rank=0, world_size=1, prefetch=2,
                    timeout=3) as dl:
        it = iter(dl)
        next(it)
        os.kill(server.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match=server.endpoint.replace(".", r"\.")):
            for _ in it:
                pass
        assert time.monotonic() - start < 30  # bounded by `timeout` (3 s), on a loaded machine
    deadline = time.monotonic() + 20  # readers look for their parent twice a second
    while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in workers), "workers outlived their killed server"


@pytest.mark.timeout(30)
def test_no_server_gives_server_unavailable() -> None:
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match="tcp://127.0.0.1:9"):
        DataLoader("tcp://127.0.0.1:9", batch_size=4, rank=0, world_size=1, timeout=1.5)
    assert time.monotonic() - start < 8


@pytest.mark.timeout(30)
def test_launch_reports_server_stderr(tmp_path) -> None:
    with pytest.raises(ServerUnavailable, match="nothing-here"):
        launch([str(tmp_path / "nothing-here-*.arrow")], workers=1, timeout=20)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("peer", ["nobody listening", "silent router"])
def test_unanswered_hello_gives_server_unavailable(peer: str) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    if peer == "nobody listening":
        sock.close()
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match=re.escape(endpoint) + ".*HELLO"):
            DataLoader(endpoint, batch_size=4, rank=0, world_size=1, timeout=1.5)
        assert time.monotonic() - start < 10
    finally:
        sock.close()
