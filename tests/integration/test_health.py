"""The health probe (`dataflow-server health`, and :func:`probe` in process for repeats) against
real servers: healthy, no session left, dead, silent, refused; and the server's ``/healthz``
(``--http``): 200 while it serves, 503 naming why once a reader slot has no reader."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from srvtools import wait_for

from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable
from dataflow.security import ClientCurve, generate_keys
from dataflow.server.health import HealthConfig, probe, probe_http

PROBE_TIMEOUT_S = 20.0


def _health(*args: str, entry: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dataflow.server", *entry, "health", *args],
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S + 30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(90)
def test_a_serving_server_is_healthy_and_keeps_no_session(demo_data, servers,
                                                          raw_client) -> None:
    server = servers([str(p) for p in demo_data("arrow").paths])
    done = _health("--endpoint", server.endpoint, "--timeout", str(PROBE_TIMEOUT_S))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"healthy: {server.endpoint} answers the dataflow protocol\n"
    for _ in range(3):
        probe(HealthConfig(server.endpoint, PROBE_TIMEOUT_S))
    stats = raw_client(server.endpoint).stats()
    assert stats["clients"] == 1  # the stats client's own session; the probes left none
    assert stats["malformed"] == 0
    server.close(grace=10)
    with pytest.raises(ServerUnavailable, match=f"^{server.endpoint}: could not connect"):
        probe(HealthConfig(server.endpoint, 2.0))


@pytest.mark.timeout(60)
def test_nothing_listening_is_unhealthy_with_a_reason() -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    done = _health("--endpoint", endpoint, "--timeout", "1")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"unhealthy: {endpoint}: could not connect (nothing listening "
                           "there, or unreachable) within 1 s\n")


@pytest.mark.timeout(60)
def test_a_silent_peer_is_unhealthy() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ServerUnavailable, match=f"^{endpoint}: connected, but no answer"):
            probe(HealthConfig(endpoint, 1.0))


@pytest.mark.timeout(90)
def test_curve_probe_needs_an_allowed_key(tmp_path: Path, demo_data, servers) -> None:
    server_public, server_secret = generate_keys(str(tmp_path / "server"), "server")
    _, probe_secret = generate_keys(str(tmp_path / "allowed"), "probe")
    probe_secret = probe_secret.rename(tmp_path / "probe.key_secret")
    _, stranger_secret = generate_keys(str(tmp_path / "other"), "stranger")
    server = servers([str(p) for p in demo_data("arrow").paths],
                     extra_args=["--curve-secret-key", str(server_secret),
                                 "--curve-allowed-keys", str(tmp_path / "allowed")])
    ok = _health("--endpoint", server.endpoint, "--timeout", str(PROBE_TIMEOUT_S),
                 "--curve-secret-key", str(probe_secret), "--curve-server-key", str(server_public))
    assert ok.returncode == 0, ok.stderr
    stranger = ClientCurve(str(stranger_secret), str(server_public))
    with pytest.raises(ServerUnavailable, match="authentication refused"):
        probe(HealthConfig(server.endpoint, PROBE_TIMEOUT_S, stranger))
    with pytest.raises(ServerUnavailable):
        probe(HealthConfig(server.endpoint, 2.0))


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.timeout(90)
def test_healthz_is_ok_while_the_server_serves(demo_data, servers) -> None:
    server = servers([str(p) for p in demo_data("arrow").paths], workers=2,
                     extra_args=["--metrics-port", "0"])
    port = server.ready["metrics_port"]
    url = f"http://127.0.0.1:{port}/healthz"
    assert _healthz(port) == (200, "ok: serving with 2 readers, 0 sessions\n")
    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=30) as dl:
        next(iter(dl))
        wait_for(lambda: _healthz(port) == (200, "ok: serving with 2 readers, 1 sessions\n"),
                 30, "the session in /healthz")
    wait_for(lambda: _healthz(port)[1] == "ok: serving with 2 readers, 0 sessions\n", 30,
             "the session closed in /healthz")
    for entry in ((), ("container",)):  # the image's entrypoint runs the probe too
        done = _health("--http", url, "--timeout", str(PROBE_TIMEOUT_S), entry=entry)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"healthy: {url}: ok: serving with 2 readers, 0 sessions\n"
    server.close(grace=10)
    done = _health("--http", url, "--timeout", "2")
    assert done.returncode == 1 and done.stderr.startswith(f"unhealthy: {url}: no answer"), (
        done.stderr)


@pytest.mark.timeout(120)
def test_healthz_is_503_naming_a_reader_slot_without_a_reader(demo_data, servers,
                                                              tmp_path: Path) -> None:
    """A reader is killed after its --transform module was deleted: each replacement fails to
    import it and exits, so the slot stays without a serving reader (until the server gives
    up restarting), and /healthz says so."""
    (tmp_path / "gone.py").write_text("def keep(batch):\n    return batch\n")
    server = servers([str(p) for p in demo_data("arrow").paths], workers=1, cwd=tmp_path,
                     extra_args=["--metrics-port", "0", "--transform", "gone:keep"])
    port = server.ready["metrics_port"]
    assert _healthz(port)[0] == 200
    (tmp_path / "gone.py").unlink()
    os.kill(server.ready["worker_pids"][0], signal.SIGKILL)
    reason = ("unhealthy: 0 of 1 readers serving (a reader exited; its replacement is not "
              "serving yet)\n")
    wait_for(lambda: _healthz(port) == (503, reason), 60, "/healthz turning 503")
    with pytest.raises(ServerUnavailable, match=r"answered 503: unhealthy: 0 of 1 readers"):
        probe_http(f"http://127.0.0.1:{port}/healthz", PROBE_TIMEOUT_S)
