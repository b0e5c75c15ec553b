"""Prometheus metrics scraped over HTTP from real servers and DataLoaders: counts match."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import threading

import pytest
import zmq
from prometheus_client import CollectorRegistry
from srvtools import RawClient, scrape, wait_for, write_damaged_parquet

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import MetricsError, ServerUnavailable
from dataflow.exporter import DISTRIBUTION, MAX_CONNECTIONS
from dataflow.server import launch


def _raw_batches(client: RawClient, requests: list[tuple[int, int, int]]) -> int:
    """Send one REQUEST per range and return the bytes of the BATCH replies received."""
    for i, rng in enumerate(requests):
        client.send(wire.Request(i + 1, (rng,)))
    got = 0
    poller = zmq.Poller()
    for sock in client.data:
        poller.register(sock, zmq.POLLIN)
    for _ in requests:
        events = dict(poller.poll(10_000))
        assert events, "no reply within 10 s"
        frames = next(iter(events)).recv_multipart()
        assert isinstance(wire.decode(frames), wire.BatchMsg)
        got += sum(len(f) for f in frames)
    return got


@pytest.mark.timeout(90)
def test_an_epoch_is_counted_on_the_server_and_on_the_client(servers, tmp_path) -> None:
    path = str(tmp_path / "p.parquet")
    write_damaged_parquet(path)
    server = servers([path], extra_args=["--on-error", "skip", "--metrics-port", "0"])
    port = server.ready["metrics_port"]
    raw = RawClient(server.endpoint)
    try:
        assert isinstance(raw.call(wire.Hello(4, "metrics probe")), wire.Index)
        nbytes = _raw_batches(raw, [(0, 0, 8), (0, 8, 16)])
        wait_for(lambda: scrape(port)[("dataflow_sent_bytes_total", ())] == nbytes, 10,
                 "the probe's reply bytes in /metrics")
        got = scrape(port)
        assert got[("dataflow_replies_total", ())] == 2
        assert got[("dataflow_sent_samples_total", ())] == 16
        assert got[("dataflow_sessions", ())] == 1
        label = next(labels for name, labels in got if name == "dataflow_session_credits")
        assert dict(label)["client"] == "metrics probe"
    finally:
        raw.close()

    registry = CollectorRegistry()
    with DataLoader(server.endpoint, batch_size=8, rank=1, world_size=2, timeout=30,
                    metrics=registry, read_ahead=False) as dl:  # the server counts one epoch
        batches = [b["x"] for b in dl]
        stats = dl.stats()
        rank = {"rank": "1"}
        samples = sum(len(x) for x in batches)
        assert dl.metrics_port is None and samples + stats["skipped"] == 30
        assert registry.get_sample_value("dataflow_client_blocked_seconds_count",
                                         rank) == len(dl) == len(batches)
        assert registry.get_sample_value("dataflow_client_batches_total", rank) == len(dl)
        assert registry.get_sample_value("dataflow_client_bytes_total", rank) == 8 * samples
        assert registry.get_sample_value("dataflow_client_skipped_total", rank) == stats[
            "skipped"] > 0
    assert registry.get_sample_value("dataflow_client_batches_total", rank) is None, \
        "close() leaves the user's registry"
    wait_for(lambda: scrape(port)[("dataflow_replies_total", ())] == 2 + len(batches), 10,
             "the epoch's replies in /metrics")
    got = scrape(port)
    assert got[("dataflow_sent_samples_total", ())] == 16 + samples
    assert got[("dataflow_skipped_samples_total", (("shard", "p.parquet"),))] == stats["skipped"]
    # every reply answered an admitted request: the latency histogram counted each once
    assert got[("dataflow_request_seconds_count", ())] == 2 + len(batches)
    assert got[("dataflow_request_seconds_bucket", (("le", "+Inf"),))] == 2 + len(batches)
    assert 0 < got[("dataflow_request_seconds_sum", ())] < 60


@pytest.mark.timeout(90)
def test_malformed_refused_and_reader_restarts_are_counted(demo_data, servers,
                                                           raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--metrics-port", "0"])
    port = server.ready["metrics_port"]
    attacker = raw_client(server.endpoint)
    attacker.send_raw([b"\x00garbage"])
    assert isinstance(attacker.recv(), wire.ErrorMsg)
    attacker.send(wire.Request(5, ((0, 0, 1),)))  # before HELLO
    assert isinstance(attacker.recv(), wire.ErrorMsg)
    os.kill(server.ready["worker_pids"][0], signal.SIGKILL)
    wait_for(lambda: scrape(port)[("dataflow_worker_restarts_total", ())] == 1, 30,
             "the reader's restart in /metrics")
    got = scrape(port)
    assert got[("dataflow_malformed_messages_total", ())] == 1
    assert got[("dataflow_refusals_total", (("what", "request"),))] == 1
    assert got[("dataflow_refusals_total", (("what", "session"),))] == 0
    assert got[("dataflow_workers", ())] == 1
    assert got[("process_open_fds", ())] > 0  # the front process's own
    assert any(name == "dataflow_build_info" for name, _ in got)

    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=30,
                    metrics=0) as dl:
        n = sum(1 for _ in dl)
        client = scrape(dl.metrics_port)
        assert client[("dataflow_client_batches_total", (("rank", "0"),))] == n == len(dl)
        assert client[("dataflow_client_blocked_seconds_count", (("rank", "0"),))] == n
        assert client[("dataflow_client_blocked_seconds_bucket",
                       (("le", "+Inf"), ("rank", "0")))] == n
        assert client[("process_resident_memory_bytes", ())] > 1 << 20
        build = next(dict(labels) for name, labels in client if name == "dataflow_build_info")
        assert set(build) == {"version", "python", "pyzmq", "libzmq"}
        assert build["version"] == importlib.metadata.version(DISTRIBUTION) != "unknown"
        port_of_client = dl.metrics_port
    with pytest.raises(OSError):
        scrape(port_of_client)


@pytest.mark.timeout(60)
def test_a_taken_metrics_port_fails_the_start_naming_it(demo_data) -> None:
    demo = demo_data("arrow")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerUnavailable,  # checked before indexing, naming the flag
                           match=f"--metrics-port: port {port} on 127.0.0.1 is taken"):
            launch([str(p) for p in demo.paths], workers=1, timeout=60,
                   extra_args=["--metrics-port", str(port)])
        # Before any HELLO: no server needed to fail.
        with pytest.raises(MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            DataLoader("tcp://127.0.0.1:9", batch_size=8, rank=0, world_size=1, timeout=30,
                       metrics=port)  # loopback by default, as the server's --metrics-bind
        with pytest.raises(MetricsError, match=f"cannot serve metrics on 0.0.0.0:{port}"):
            DataLoader("tcp://127.0.0.1:9", batch_size=8, rank=0, world_size=1, timeout=30,
                       metrics=f"0.0.0.0:{port}")


def _idle_connections(port: int, n: int) -> list[socket.socket]:
    made = []
    try:
        for _ in range(n):
            made.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except BaseException:
        for s in made:
            s.close()
        raise
    return made


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.timeout(90)
def test_idle_connections_to_metrics_cost_no_thread_and_leave_scrapes_working(
        demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--metrics-port", "0"])
    port = server.ready["metrics_port"]
    assert scrape(port)[("dataflow_workers", ())] == 1

    def count(what: str) -> int:
        return len(os.listdir(f"/proc/{server.pid}/{what}"))

    threads, fds = count("task"), count("fd")
    idle = _idle_connections(port, 500)
    try:
        assert scrape(port)[("dataflow_workers", ())] == 1
        # One serving thread whatever the connections (a thread each held 504 before); at
        # most MAX_CONNECTIONS of them open, the longest idle closed to make room.
        assert count("task") <= threads + 1, (threads, count("task"))
        assert count("fd") <= fds + MAX_CONNECTIONS + 2, (fds, count("fd"))
        assert all(_closed_by_peer(s) for s in idle[:400])
    finally:
        for s in idle:
            s.close()

    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=30,
                    metrics=0) as dl:
        threads = threading.active_count()
        idle = _idle_connections(dl.metrics_port, 500)
        try:
            assert scrape(dl.metrics_port)[("dataflow_client_batches_total", (("rank", "0"),))] == 0
            assert threading.active_count() == threads
        finally:
            for s in idle:
                s.close()


@pytest.mark.timeout(60)
def test_a_hellos_client_text_reaches_the_label_as_printable_ascii(demo_data, servers,
                                                                   raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--metrics-port", "0"])
    evil = raw_client(server.endpoint)
    name = "\x1b[2J\x1b[31mrank 0\u202egpj.exe\n" + "\u200f" * 200
    assert isinstance(evil.call(wire.Hello(2, name)), wire.Index)

    def labels() -> list[str]:
        return [dict(lab)["client"] for metric, lab in scrape(server.ready["metrics_port"])
                if metric == "dataflow_session_credits"]

    wait_for(lambda: len(labels()) == 1, 10, "the session in /metrics")
    label = labels()[0]
    assert label.startswith("\\x1b[2J\\x1b[31mrank 0\\u202egpj.exe\\n\\u200f")
    assert len(label) <= 64 and all(" " <= ch <= "~" for ch in label)
