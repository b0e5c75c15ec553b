"""An HTTP endpoint serving one Prometheus registry at ``/metrics``, with an explicit lifecycle.

Used by the loader server (``--metrics-port``, which also answers ``/healthz``: see
:data:`Health`) and by the DataLoader (``metrics=PORT``). One
daemon thread serves every connection from a selector loop, so peers cost no thread of their
own: at most ``max_connections`` are open (a new one closes the one open longest without
progress), each must send its request within ``timeout`` seconds and take its response at
least that often, and each is closed after its one response (``Connection: close``). Any number
of idle or slow peers thus hold one thread, ``max_connections`` sockets and as many buffers of
at most :data:`MAX_REQUEST_BYTES` plus one response. A scrape runs the registry's collectors on
that thread: what they read must be safe to read from another thread (see
:mod:`dataflow.server.metrics` and :mod:`dataflow.client.metrics`).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import ipaddress
import logging
import platform
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType

import zmq
from prometheus_client import CollectorRegistry, Info, ProcessCollector
from prometheus_client.exposition import choose_encoder, gzip_accepted

from dataflow.checks import check_int
from dataflow.errors import ConfigError, MetricsError

MAX_PORT = 65535
JOIN_S = 5.0
MAX_CONNECTIONS = 32
TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 8192
BACKLOG = 128
PATHS = (b"/metrics", b"/")
HEALTH_PATH = b"/healthz"

Health = Callable[[], tuple[bool, str]]
"""What ``/healthz`` answers: ``(healthy, one line saying why)``, 200 or 503 with that line.
Called on the endpoint's thread, so it must be safe to call from another thread."""

DISTRIBUTION = "dataflow-loader"
"""The project's name on PyPI (``pip install dataflow-loader``; the package is ``dataflow``)."""

log = logging.getLogger(__name__)


def build_info() -> dict[str, str]:
    """What ``dataflow_build_info`` says: the versions that shape the wire and the hot path."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"version": version, "python": platform.python_version(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}


def register_process_metrics(registry: CollectorRegistry) -> None:
    """Add to a registry of dataflow's own the process's ``process_*`` metrics (CPU seconds,
    resident memory, open file descriptors, start time) and ``dataflow_build_info``."""
    ProcessCollector(registry=registry)
    Info("dataflow_build", "dataflow's version and the Python and ZeroMQ it runs on",
         registry=registry).info(build_info())


def check_metrics_address(port: object, bind: str, *, port_name: str = "metrics_port",
                          bind_name: str = "metrics_bind") -> int:
    """Validate a metrics port (0: an ephemeral one) and bind address; returns the port.

    Raises:
        ConfigError: naming ``port_name`` or ``bind_name`` (the argument given).
    """
    checked = check_int(port_name, port, 0, MAX_PORT)
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise ConfigError(f"`{bind_name}` must be an IPv4 or IPv6 address. "
                          f"Found: {bind!r}") from None
    return checked


def response(status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8",
             *, head: bool = False, gzipped: bool = False) -> bytes:
    """One HTTP/1.1 response that closes its connection (``head``: headers only)."""
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    if gzipped:
        lines.append("Content-Encoding: gzip")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


def answer(request: bytes, registry: CollectorRegistry, health: Health | None = None) -> bytes:
    """The response to one request head (request line and headers, without the blank line).

    GET or HEAD of ``/metrics`` (or ``/``) gets the registry in the format its ``Accept``
    header picks, gzipped when its ``Accept-Encoding`` allows; of ``/healthz`` (with
    ``health``), 200 or 503 and ``health``'s line; anything else gets an error status naming
    what was wrong. A collector (or ``health``) that raises gives a 500 naming the error.
    """
    lines = request.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return response(HTTPStatus.BAD_REQUEST, b"not an HTTP/1.x request line\n")
    method, target = parts[0], parts[1]
    if method not in (b"GET", b"HEAD"):
        return response(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET and HEAD\n")
    path = target.split(b"?", 1)[0]
    if path == HEALTH_PATH and health is not None:
        return _health_response(health, head=method == b"HEAD")
    if path not in PATHS:
        return response(HTTPStatus.NOT_FOUND, b"metrics are served at /metrics\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    encoder, content_type = choose_encoder(headers.get("accept", ""))
    try:
        body = encoder(registry)
    except Exception as e:  # a collector's bug: this scrape fails, the endpoint keeps serving
        log.exception("metrics: a collector failed")
        return response(HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"a collector failed: {type(e).__name__}: {e}\n".encode())
    gzipped = gzip_accepted(headers.get("accept-encoding", ""))
    return response(HTTPStatus.OK, gzip.compress(body) if gzipped else body, content_type,
                    head=method == b"HEAD", gzipped=gzipped)


def _health_response(health: Health, *, head: bool) -> bytes:
    try:
        healthy, why = health()
    except Exception as e:  # a bug of the judge: this probe fails, the endpoint keeps serving
        log.exception("metrics: the health check failed")
        return response(HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"the health check failed: {type(e).__name__}: {e}\n".encode())
    status = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
    return response(status, f"{'ok' if healthy else 'unhealthy'}: {why}\n".encode(), head=head)


@dataclass
class _Conn:
    """One peer's connection: its request bytes so far, then the response bytes left to send
    (empty once sent: the connection waits for the peer to close its end), and the monotonic
    time by which it must progress."""

    sock: socket.socket
    deadline: float
    inbox: bytearray
    outbox: memoryview | None = None


class MetricsExporter:
    """Serves ``registry`` at ``http://bind:port/metrics`` until :meth:`close`.

    Thread invariant: the serving thread owns the listening socket, the connections and the
    selector, and closes them when it ends; :meth:`close` (any thread) only asks it to end and
    waits for it.

    Args:
        registry: what is served.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        bind: IP address to listen on.
        max_connections: connections open at once; a new one closes the one open longest
            without progress.
        timeout: seconds a connection has to send its request, and at most between two sends
            of its response; it is closed then.
        health: what ``/healthz`` answers; None: no ``/healthz`` (404).

    Raises:
        MetricsError: the address cannot be bound (e.g. the port is taken).
    """

    def __init__(self, registry: CollectorRegistry, port: int, bind: str, *,
                 max_connections: int = MAX_CONNECTIONS, timeout: float = TIMEOUT_S,
                 health: Health | None = None) -> None:
        if max_connections < 1 or timeout <= 0:
            raise ConfigError("`max_connections` must be at least 1 and `timeout` positive. "
                              f"Found: {max_connections}, {timeout}")
        family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
        try:
            listener = socket.create_server((bind, port), family=family, backlog=BACKLOG)
        except OSError as e:
            raise MetricsError(f"cannot serve metrics on {bind}:{port}: {e}") from e
        listener.setblocking(False)
        self.port: int = listener.getsockname()[1]
        self._registry = registry
        self._health = health
        self._max = max_connections
        self._timeout = timeout
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"metrics-{self.port}",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, close every connection and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._closing = True
        self._wake_w.send(b"x")
        self._thread.join(JOIN_S)
        if self._thread.is_alive():
            log.warning("metrics: the endpoint on port %d did not stop within %.0f s (a "
                        "collector still running); it stops when that returns", self.port,
                        JOIN_S)
        self._wake_w.close()

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[socket.socket, _Conn] = {}
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closing:
                wait = (max(0.0, min(c.deadline for c in conns.values()) - time.monotonic())
                        if conns else None)
                for key, _ in sel.select(wait):
                    conn: _Conn | None = key.data  # None: the listener, the wake-up
                    if key.fileobj is self._listener:
                        self._accept(sel, conns)
                    elif conn is not None and conns.get(conn.sock) is conn:
                        # (not a connection closed earlier this round to make room)
                        self._step(sel, conns, conn)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline <= now]:
                    self._drop(sel, conns, conn)
        finally:
            for conn in list(conns.values()):
                self._drop(sel, conns, conn)
            sel.close()
            self._listener.close()
            self._wake_r.close()

    def _accept(self, sel: selectors.BaseSelector, conns: dict[socket.socket, _Conn]) -> None:
        for _ in range(BACKLOG):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: the peer waits in the backlog
                log.warning("metrics: cannot accept a connection: %s", e)
                return
            if len(conns) >= self._max:
                self._drop(sel, conns, min(conns.values(), key=lambda c: c.deadline))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._timeout, bytearray())
            conns[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _step(self, sel: selectors.BaseSelector, conns: dict[socket.socket, _Conn],
              conn: _Conn) -> None:
        """Read the request (until its head is whole), then send the response."""
        try:
            if conn.outbox is None or not conn.outbox:
                data = conn.sock.recv(MAX_REQUEST_BYTES)
                if not data:
                    self._drop(sel, conns, conn)
                    return
                if conn.outbox is not None:  # answered: what more it sends is dropped
                    return
                conn.inbox += data
                end = conn.inbox.find(b"\r\n\r\n")
                if end >= 0:
                    reply = answer(bytes(conn.inbox[:end]), self._registry, self._health)
                elif len(conn.inbox) > MAX_REQUEST_BYTES:
                    reply = response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                     f"request head over {MAX_REQUEST_BYTES} bytes\n".encode())
                else:
                    return
                conn.inbox = bytearray()
                conn.outbox = memoryview(reply)
                sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            sent = conn.sock.send(conn.outbox)
            conn.outbox = conn.outbox[sent:]
            conn.deadline = time.monotonic() + self._timeout
            if not conn.outbox:
                # Close once the peer has read the response and closed its end: closing with
                # bytes of its unread would reset the connection and could lose the response.
                conn.sock.shutdown(socket.SHUT_WR)
                sel.modify(conn.sock, selectors.EVENT_READ, conn)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the peer
            self._drop(sel, conns, conn)

    @staticmethod
    def _drop(sel: selectors.BaseSelector, conns: dict[socket.socket, _Conn],
              conn: _Conn) -> None:
        del conns[conn.sock]
        sel.unregister(conn.sock)
        conn.sock.close()
