"""The fixed TCP ports a server is told to listen on, checked free before it starts.

A server binds its client port once the dataset index is loaded, and its readers bind their
data ports in processes of their own, where a port taken would only show as a reader that
died at start. So every fixed port (``--bind``'s, each reader's of ``--data-ports``,
``--metrics-port``) is bound and released once first, and one that is taken stops the start
at once with an error naming the flag, the port and the reader.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from dataflow.errors import ServerStartError
from dataflow.server.config import ServerConfig

WILDCARD_HOSTS = {"*": "0.0.0.0"}


@dataclass(frozen=True)
class Claim:
    """One fixed port the server will listen on: ``port`` on ``host``, for ``what`` (the flag
    and, for a reader, its number)."""

    what: str
    host: str
    port: int


def claims(config: ServerConfig) -> list[Claim]:
    """The fixed ports of ``config``, in the order the server binds them (port 0 and ipc://
    endpoints claim nothing)."""
    out = []
    if config.bind.startswith("tcp://"):
        host = config.bind.removeprefix("tcp://").rpartition(":")[0]
        if config.bind_port:
            out.append(Claim("--bind", host, config.bind_port))
        if config.data_ports is not None:
            out += [Claim(f"--data-ports (reader {i})", host, config.data_ports + i)
                    for i in range(config.workers)]
    if config.metrics_port:
        out.append(Claim("--metrics-port", config.metrics_bind, config.metrics_port))
    return out


def check_free(claim: Claim) -> None:
    """Bind ``claim``'s port (as a listener, with ``SO_REUSEADDR`` as ZeroMQ binds) and release
    it. Only a port taken (or one this user may not bind) fails here; a host that is no address
    or name (ZeroMQ also takes an interface name), or any other error, is left to the bind
    itself.

    Raises:
        ServerStartError: the port is taken or not this user's to bind, naming it.
    """
    host = WILDCARD_HOSTS.get(claim.host, claim.host).strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        address = socket.getaddrinfo(host, claim.port, family, socket.SOCK_STREAM,
                                     flags=socket.AI_PASSIVE)[0][4]
    except socket.gaierror:
        return
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(1)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ServerStartError(f"{claim.what}: port {claim.port} on {claim.host} is taken "
                                       f"({e.strerror}); another process listens there: stop "
                                       "it or choose another port") from e
            if e.errno == errno.EACCES:
                raise ServerStartError(f"{claim.what}: port {claim.port} on {claim.host} may not "
                                       f"be bound by this user ({e.strerror}): choose a port "
                                       "above 1023") from e


def check_ports(config: ServerConfig) -> None:
    """Check every fixed port of ``config`` free (:func:`check_free`).

    Raises:
        ServerStartError: the first port taken, naming it.
    """
    for claim in claims(config):
        check_free(claim)
