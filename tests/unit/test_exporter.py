"""The /metrics endpoint on loopback: answers, bounded connections, timeouts, lifecycle."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.registry import Collector

from dataflow.errors import ConfigError
from dataflow.exporter import MAX_REQUEST_BYTES, MetricsExporter


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("fuzz_things", "things", registry=reg).inc(3)
    return reg


@pytest.fixture
def exporter(registry: CollectorRegistry) -> Iterator[MetricsExporter]:
    with MetricsExporter(registry, 0, "127.0.0.1", max_connections=8, timeout=30) as ex:
        yield ex


def _get(port: int, path: str = "/metrics", **headers: str) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_scrape_gets_the_registry(exporter: MetricsExporter) -> None:
    status, headers, body = _get(exporter.port)
    assert status == 200 and b"fuzz_things_total 3.0" in body
    assert headers["Content-Type"].startswith("text/plain") and headers["Connection"] == "close"
    status, headers, body = _get(exporter.port, "/metrics", **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and b"fuzz_things_total" in gzip.decompress(body)
    status, headers, _ = _get(exporter.port, "/metrics",
                              Accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")


def test_other_requests_get_an_error_status(exporter: MetricsExporter) -> None:
    assert _get(exporter.port, "/nope")[0] == 404
    head = _raw(exporter.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert _raw(exporter.port, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert _raw(exporter.port, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    long = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (2 * MAX_REQUEST_BYTES)
    assert _raw(exporter.port, long).startswith(b"HTTP/1.1 431")


def test_healthz_answers_what_the_health_check_says(registry: CollectorRegistry) -> None:
    said = [(True, "serving")]
    with MetricsExporter(registry, 0, "127.0.0.1", health=lambda: said[-1]) as ex:
        status, _, body = _get(ex.port, "/healthz")
        assert (status, body) == (200, b"ok: serving\n")
        said.append((False, "1 of 2 readers serving"))
        status, headers, body = _get(ex.port, "/healthz?verbose")
        assert (status, body) == (503, b"unhealthy: 1 of 2 readers serving\n")
        assert headers["Connection"] == "close"
        head = _raw(ex.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable") and head.endswith(b"\r\n\r\n")
        said.append(None)  # type: ignore[arg-type]  # a judge that breaks: a 500, not a crash
        status, _, body = _get(ex.port, "/healthz")
        assert status == 500 and body.startswith(b"the health check failed: TypeError")
        assert _get(ex.port)[0] == 200
    with MetricsExporter(registry, 0, "127.0.0.1") as ex:  # the trainer's: no /healthz
        assert _get(ex.port, "/healthz")[0] == 404


def test_idle_connections_hold_no_thread_and_never_block_a_scrape(
        exporter: MetricsExporter) -> None:
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
            for _ in range(100)]
    try:
        assert _get(exporter.port)[0] == 200
        assert threading.active_count() == threads
        # Only the 8 most recent stay open: the others were closed to make room.
        for s in idle[:80]:
            assert _closed_by_peer(s)
    finally:
        for s in idle:
            s.close()


def test_a_silent_connection_is_closed_after_the_timeout(registry: CollectorRegistry) -> None:
    with MetricsExporter(registry, 0, "127.0.0.1", timeout=0.2) as ex, \
            socket.create_connection(("127.0.0.1", ex.port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
        assert _closed_by_peer(s)  # else recv times out (10 s) and raises


class Broken(Collector):
    def collect(self) -> Iterator:
        raise RuntimeError("boom")


def test_a_failing_collector_fails_its_scrape_only(registry: CollectorRegistry) -> None:
    broken = Broken()
    registry.register(broken)
    with MetricsExporter(registry, 0, "127.0.0.1") as ex:
        status, _, body = _get(ex.port)
        assert status == 500 and b"RuntimeError: boom" in body
        registry.unregister(broken)
        assert _get(ex.port)[0] == 200


class Slow(Collector):
    """Holds the endpoint's thread in a scrape, so what peers do meanwhile is seen at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def collect(self) -> Iterator:
        time.sleep(self.seconds)
        return iter(())


def test_a_connection_dropped_for_a_newer_one_while_it_had_data_keeps_the_endpoint_up(
        registry: CollectorRegistry) -> None:
    """A new connection that closes the oldest one (``max_connections``) in the same round of
    events as that one's data: the data is not read from the closed socket, and the endpoint
    keeps serving."""
    with MetricsExporter(registry, 0, "127.0.0.1", max_connections=2, timeout=30) as ex:
        oldest = socket.create_connection(("127.0.0.1", ex.port), timeout=10)
        oldest.sendall(b"GET /metrics HTTP/1.1\r\n")  # unfinished: the endpoint waits for more
        _get(ex.port)  # the endpoint has read it (it answers in order)
        slow = Slow(0.5)
        registry.register(slow)
        scrape = socket.create_connection(("127.0.0.1", ex.port), timeout=10)
        scrape.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # the thread is in the slow scrape
        time.sleep(0.2)
        newer = socket.create_connection(("127.0.0.1", ex.port), timeout=10)  # listener ready
        oldest.sendall(b"Host: x\r\n")  # then the oldest connection
        try:
            assert scrape.recv(12) == b"HTTP/1.1 200"
            assert _closed_by_peer(oldest)  # closed to make room for the newer one
            registry.unregister(slow)
            assert _get(ex.port)[0] == 200
        finally:
            for s in (oldest, scrape, newer):
                s.close()


def test_close_releases_the_port_and_is_idempotent(registry: CollectorRegistry) -> None:
    ex = MetricsExporter(registry, 0, "127.0.0.1")
    idle = socket.create_connection(("127.0.0.1", ex.port), timeout=10)
    try:
        ex.close()
        ex.close()
        assert _closed_by_peer(idle)
        with pytest.raises(OSError):
            _get(ex.port)
    finally:
        idle.close()
    with pytest.raises(ConfigError, match="max_connections"):
        MetricsExporter(registry, 0, "127.0.0.1", max_connections=0)
