"""``dataflow-server health``: does a loader server answer the wire protocol, or its
``/healthz``? (exec probes: Docker's ``HEALTHCHECK``, SLURM scripts).

With ``--http URL`` the probe asks the server's ``/healthz`` (on its ``--metrics-port``, see
:mod:`dataflow.server.metrics`): healthy on a 200, unhealthy with the server's line on a 503.
That needs no CURVE keys, and Kubernetes asks the same URL itself (``httpGet``), with no
process per probe.

Otherwise the probe sends one HEARTBEAT on a fresh connection and holds no session: the server
answers a HEARTBEAT from a peer without a session with ``ERROR UnknownClient`` (``req_id ==
-1``) from its frontend thread, the thread that answers every client, and opens nothing for it
(see :mod:`dataflow.server.clients`). That reply, decoded and validated, is the proof of
health; a timeout, a CURVE refusal or any other reply is not. A server still building its
index binds first but answers only once ready, so the probe also tells readiness.

Exit status: 0 healthy (one line on stdout), 1 unhealthy (one line on stderr naming the
endpoint and the reason), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from dataflow import wire
from dataflow.errors import ConfigError, DataflowError, ProtocolError, ServerUnavailable
from dataflow.security import (
    HANDSHAKE_FAILURES,
    ClientCurve,
    client_curve,
    handshake_failure,
    secure_client,
)
from dataflow.wire import ErrorKind

DEFAULT_TIMEOUT_S = 5.0
ENDPOINT_SCHEMES = ("tcp://", "ipc://")
MAX_BODY = 1024


@dataclass(frozen=True)
class HealthConfig:
    """Validated settings of one probe.

    Attributes:
        endpoint: the server's client endpoint (``tcp://HOST:PORT`` or ``ipc://PATH``).
        timeout: seconds to wait for the answer.
        curve: CURVE keys of the probe (its own key pair, allowed by the server, and the
            server's public key); None: clear text.
        http: the server's ``/healthz`` URL: probe that instead of ``endpoint``.
    """

    endpoint: str
    timeout: float = DEFAULT_TIMEOUT_S
    curve: ClientCurve | None = None
    http: str | None = None

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(ENDPOINT_SCHEMES) or self.endpoint in ENDPOINT_SCHEMES:
            raise ConfigError(f"`endpoint` must be tcp://HOST:PORT or ipc://PATH. "
                              f"Found: {self.endpoint!r}")
        if self.http is not None and (not self.http.startswith("http://")
                                      or self.curve is not None):
            raise ConfigError("`http` must be an http:// URL, without CURVE keys (/healthz has "
                              f"none). Found: {self.http!r}")
        if not 0 < self.timeout <= 3600:
            raise ConfigError(f"`timeout` must be in (0, 3600] seconds. Found: {self.timeout}")


def judge(endpoint: str, msg: wire.Message) -> None:
    """Accept the reply to the probe's HEARTBEAT, or say what is wrong with it.

    Raises:
        ServerUnavailable: ``msg`` is not the ``ERROR UnknownClient`` (``req_id == -1``) a
            serving loader answers a session-less HEARTBEAT with.
    """
    if isinstance(msg, wire.ErrorMsg) and msg.kind is ErrorKind.UNKNOWN_CLIENT and msg.req_id == -1:
        return
    if isinstance(msg, wire.ErrorMsg):
        raise ServerUnavailable(endpoint, f"answered the probe with ERROR {msg.kind}: "
                                          f"{msg.message[:200]}")
    raise ServerUnavailable(endpoint, f"answered the probe with {wire.kind_of(msg).name}, "
                                      "not the ERROR UnknownClient a loader server sends")


MONITOR_EVENTS = HANDSHAKE_FAILURES | zmq.EVENT_CONNECTED


class _Watch:
    """What the socket monitor saw: whether TCP connected, and a CURVE refusal if any."""

    def __init__(self, monitor: zmq.Socket, endpoint: str) -> None:
        self._monitor = monitor
        self._endpoint = endpoint
        self.connected = False

    def read(self) -> None:
        """Read the waiting monitor events.

        Raises:
            ServerUnavailable: the server refused the CURVE handshake.
        """
        while True:
            try:
                note = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            refused = handshake_failure(note["event"], note["value"], self._endpoint)
            if refused is not None:
                raise refused
            if note["event"] == zmq.EVENT_CONNECTED:
                self.connected = True

    def silence(self, timeout: float) -> ServerUnavailable:
        """The error for no answer within ``timeout`` seconds."""
        if self.connected:
            why = "connected, but no answer (still starting, or stuck)"
        else:
            why = "could not connect (nothing listening there, or unreachable)"
        return ServerUnavailable(self._endpoint, f"{why} within {timeout:g} s")


def probe(config: HealthConfig) -> None:
    """Send one HEARTBEAT to ``config.endpoint`` and judge the answer; opens no session.

    Raises:
        ServerUnavailable: no valid answer within ``config.timeout`` seconds, a CURVE refusal,
            or an answer that is not a serving loader's (naming the endpoint).
    """
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, config.curve)
    monitor = sock.get_monitor_socket(MONITOR_EVENTS)
    try:
        watch = _Watch(monitor, config.endpoint)
        try:
            sock.connect(config.endpoint)
        except zmq.ZMQError as e:
            raise ServerUnavailable(config.endpoint, f"cannot connect: {e}") from e
        sock.send_multipart(wire.encode(wire.Heartbeat()))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        deadline = time.monotonic() + config.timeout
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            events = dict(poller.poll(max(left_ms, 0)))
            watch.read()
            if sock in events:
                break
            if left_ms <= 0:
                raise watch.silence(config.timeout)
        try:
            msg = wire.decode(sock.recv_multipart())
        except ProtocolError as e:
            raise ServerUnavailable(config.endpoint, f"answered with a malformed message: "
                                                     f"{e}") from e
        judge(config.endpoint, msg)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


def probe_http(url: str, timeout: float) -> str:
    """GET ``url`` (a server's ``/healthz``), never through a proxy; returns its line.

    Raises:
        ServerUnavailable: no 200 within ``timeout`` seconds, naming the URL and the server's
            line (a 503's) or why nothing answered.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.read(MAX_BODY).decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as e:
        said = e.read(MAX_BODY).decode("utf-8", "replace").strip()
        raise ServerUnavailable(url, f"answered {e.code}: {said}") from e
    except (urllib.error.URLError, OSError) as e:
        why = e.reason if isinstance(e, urllib.error.URLError) else e
        raise ServerUnavailable(url, f"no answer within {timeout:g} s ({why})") from e


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dataflow-server health",
        description="Probe a loader server: exit 0 when it answers the wire protocol (or, "
                    "with --http, when its /healthz answers 200), 1 with a one-line reason "
                    "otherwise (for Docker HEALTHCHECK and exec probes). Sends one HEARTBEAT "
                    "on a fresh connection; opens no session.",
    )
    p.add_argument("--endpoint", default="tcp://127.0.0.1:5555", metavar="ENDPOINT",
                   help="the server's client endpoint, as given to its --bind with a "
                        "reachable host (default: %(default)s)")
    p.add_argument("--http", default=None, metavar="URL",
                   help="probe the server's /healthz instead, over HTTP (its --metrics-port, "
                        "e.g. http://127.0.0.1:9100/healthz): healthy on 200, unhealthy with "
                        "the server's reason on 503; needs no CURVE keys (default: the wire "
                        "protocol at --endpoint)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="how long to wait for the answer (default: %(default)s)")
    sec = p.add_argument_group(
        "security", "for a server started with --curve-secret-key: both flags or neither")
    sec.add_argument("--curve-secret-key", default=None, metavar="PATH",
                     help="the probe's own secret key file (NAME.key_secret); its public "
                          "NAME.key must be in the server's --curve-allowed-keys")
    sec.add_argument("--curve-server-key", default=None, metavar="PATH",
                     help="the server's public key file (NAME.key)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> HealthConfig:
    """Parse the probe's flags; exits with a usage message (status 2) on invalid input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return HealthConfig(ns.endpoint, ns.timeout,
                            client_curve(ns.curve_secret_key, ns.curve_server_key), ns.http)
    except ConfigError as e:
        parser.error(str(e))


def main(argv: Sequence[str] | None = None) -> int:
    """``dataflow-server health`` entry point; returns the exit status."""
    config = parse_args(argv)
    try:
        if config.http is not None:
            said = probe_http(config.http, config.timeout)
        else:
            probe(config)
    except DataflowError as e:
        sys.stderr.write(f"unhealthy: {e}\n")
        return 1
    if config.http is not None:
        sys.stdout.write(f"healthy: {config.http}: {said}\n")
    else:
        sys.stdout.write(f"healthy: {config.endpoint} answers the dataflow protocol\n")
    return 0
