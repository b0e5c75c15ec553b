"""The session handshake with every server, as a pure state machine (no sockets).

Per server: the client sends HELLO on its control connection; the server answers INDEX (the
dataset index, credits, a session token and its readers' data endpoints); the client connects
one data connection per reader, says HEARTBEAT on each, and waits for each reader's HEARTBEAT
answer, so no reply can find its connection missing. The handshake is done when every server
answered INDEX and every data connection answered; it fails at ``deadline``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataflow import wire
from dataflow.errors import ProtocolError, RemoteError, ServerUnavailable

WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")


def reachable(data_endpoint: str, server_endpoint: str) -> str:
    """The address to connect to for a reader's advertised data endpoint.

    A server bound to a wildcard address (``tcp://0.0.0.0:5555``) advertises its readers'
    endpoints with that wildcard host; the client reaches them at the host it used for the
    server itself.
    """
    scheme, _, rest = data_endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or host not in WILDCARD_HOSTS:
        return data_endpoint
    server_host = server_endpoint.partition("://")[2].rpartition(":")[0]
    return f"tcp://{server_host}:{port}"


class Handshake:
    """Progress of the handshake with servers ``endpoints``.

    Args:
        endpoints: the servers, in the order their numbers refer to.
        deadline: time (same clock as the ``now`` arguments) by which it must be done.
        timeout: the seconds ``deadline`` stands for (for messages).

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoints: Sequence[str], deadline: float, timeout: float) -> None:
        self._endpoints = list(endpoints)
        self._deadline = deadline
        self._timeout = timeout
        self._indexes: list[wire.Index | None] = [None] * len(endpoints)
        self._waiting: dict[tuple[int, int], str] = {}

    def on_control(self, server: int, msg: wire.Message) -> list[str]:
        """A message from ``server``'s control connection during the handshake.

        Returns:
            The data endpoints to connect for this server (its INDEX arrived), in reader
            order; each is then awaited as ``(server, reader)``.

        Raises:
            RemoteError: the server answered with an ERROR.
            ProtocolError: anything but INDEX, a second INDEX, or an INDEX without readers.
        """
        endpoint = self._endpoints[server]
        if isinstance(msg, wire.ErrorMsg):
            raise RemoteError(endpoint, str(msg.kind), msg.message)
        if not isinstance(msg, wire.Index):
            raise ProtocolError(f"{endpoint}: expected INDEX, got {wire.kind_of(msg).name}")
        if self._indexes[server] is not None:
            raise ProtocolError(f"{endpoint}: a second INDEX during the handshake")
        if not msg.data or not msg.session:
            raise ProtocolError(f"{endpoint}: INDEX names no reader data endpoints")
        self._indexes[server] = msg
        data = [reachable(d, endpoint) for d in msg.data]
        for reader in range(len(data)):
            self._waiting[(server, reader)] = data[reader]
        return data

    def on_data(self, server: int, reader: int, msg: wire.Message) -> None:
        """A message on data connection ``reader`` of ``server`` during the handshake.

        Raises:
            RemoteError: the reader answered with an ERROR.
            ProtocolError: anything but the awaited HEARTBEAT.
        """
        endpoint = self._endpoints[server]
        if isinstance(msg, wire.ErrorMsg):
            raise RemoteError(endpoint, str(msg.kind), msg.message)
        if not isinstance(msg, wire.Heartbeat) or (server, reader) not in self._waiting:
            raise ProtocolError(f"{endpoint}: expected HEARTBEAT on reader connection "
                                f"{reader}, got {wire.kind_of(msg).name}")
        del self._waiting[(server, reader)]

    @property
    def done(self) -> bool:
        return not self._waiting and all(i is not None for i in self._indexes)

    @property
    def indexes(self) -> tuple[wire.Index, ...]:
        """Every server's INDEX, in server order (once :attr:`done`)."""
        if not self.done:
            raise ProtocolError("handshake not finished")
        return tuple(i for i in self._indexes if i is not None)

    def check(self, now: float) -> None:
        """Raise once ``deadline`` has passed before the handshake is done.

        Raises:
            ServerUnavailable: naming the servers that did not answer HELLO, or whose reader
                connections did not answer.
        """
        if self.done or now < self._deadline:
            return
        silent = [e for e, i in zip(self._endpoints, self._indexes, strict=True) if i is None]
        if silent:
            raise ServerUnavailable(", ".join(silent),
                                    f"no answer to HELLO within {self._timeout} s")
        servers = sorted({self._endpoints[s] for s, _ in self._waiting})
        raise ServerUnavailable(", ".join(servers), f"{len(self._waiting)} reader data "
                                f"connection(s) not answered within {self._timeout} s")

    def left(self, now: float) -> float:
        """Seconds until the deadline (never negative)."""
        return max(self._deadline - now, 0.0)
