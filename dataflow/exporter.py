"""An HTTP endpoint serving one Prometheus registry at ``/metrics``, with an explicit lifecycle.

Used by the loader server (``--metrics-port``) and by the DataLoader (``metrics=PORT``). The
endpoint runs on daemon threads of :mod:`prometheus_client` (one per scrape); what it reads
must be safe to read from another thread (see :mod:`dataflow.server.metrics` and
:mod:`dataflow.client.metrics`).
"""

from __future__ import annotations

import ipaddress
import threading
from types import TracebackType
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from dataflow.errors import ConfigError, MetricsError

MAX_PORT = 65535
JOIN_S = 5.0


def check_metrics_address(port: int, bind: str, what: str) -> None:
    """Validate a metrics port (0: an ephemeral one) and bind address.

    Raises:
        ConfigError: naming ``what`` (the flag or option).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise ConfigError(f"`{what}` port must be an integer in [0, {MAX_PORT}]. Found: {port!r}")
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise ConfigError(f"`{what}` bind address must be an IPv4 or IPv6 address. "
                          f"Found: {bind!r}") from None


class MetricsExporter:
    """Serves ``registry`` at ``http://bind:port/metrics`` until :meth:`close`.

    Args:
        registry: what is served.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        bind: IP address to listen on.

    Raises:
        MetricsError: the address cannot be bound (e.g. the port is taken).
    """

    def __init__(self, registry: CollectorRegistry, port: int, bind: str) -> None:
        try:
            server, thread = start_http_server(port, bind, registry)
        except OSError as e:
            raise MetricsError(f"cannot serve metrics on {bind}:{port}: {e}") from e
        self._server: WSGIServer | None = server
        self._thread: threading.Thread = thread
        self.port: int = server.server_port

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(JOIN_S)

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
