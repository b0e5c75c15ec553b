"""The session handshake with the servers, as pure state machines (no sockets).

Per server (:class:`Join`): the client sends HELLO on its control connection; the server
answers INDEX (the dataset index, credits, a session token and its readers' data endpoints);
the client connects one data connection per reader, says HEARTBEAT on each, and waits for each
reader's HEARTBEAT answer, so no reply can find its connection missing. A server that joins
again after it was lost (restarted) must serve the dataset it served before.

The first handshake (:class:`Handshake`) is done when every server joined; it fails at
``deadline``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataflow import wire
from dataflow.errors import DatasetMismatchError, ProtocolError, RemoteError, ServerUnavailable
from dataflow.index import DatasetIndex

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


class Join:
    """Progress of the handshake with one server.

    Args:
        endpoint: the server.
        fingerprint: the dataset it must serve (a server joining again), or None (the first
            handshake: the DataLoader compares the servers' datasets itself).

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoint: str, fingerprint: str | None = None) -> None:
        self.endpoint = endpoint
        self._fingerprint = fingerprint
        self.index: wire.Index | None = None
        self.waiting: dict[int, str] = {}

    def on_control(self, msg: wire.Message) -> list[str]:
        """A message from the server's control connection.

        Returns:
            The data endpoints to connect (its INDEX arrived), in reader order; each reader
            is then awaited.

        Raises:
            RemoteError: the server answered with an ERROR.
            ProtocolError: anything but INDEX, a second INDEX, or an INDEX without readers.
            DatasetMismatchError: the server serves another dataset than ``fingerprint``.
        """
        if isinstance(msg, wire.ErrorMsg):
            raise RemoteError(self.endpoint, str(msg.kind), msg.message)
        if not isinstance(msg, wire.Index):
            raise ProtocolError(f"{self.endpoint}: expected INDEX, got {wire.kind_of(msg).name}")
        if self.index is not None:
            raise ProtocolError(f"{self.endpoint}: a second INDEX during the handshake")
        if not msg.data or not msg.session:
            raise ProtocolError(f"{self.endpoint}: INDEX names no reader data endpoints")
        if self._fingerprint is not None:
            theirs = DatasetIndex.from_json(msg.index_json).fingerprint
            if theirs != self._fingerprint:
                raise DatasetMismatchError(f"{self.endpoint} now serves dataset {theirs}, not "
                                           f"{self._fingerprint}")
        self.index = msg
        data = [reachable(d, self.endpoint) for d in msg.data]
        self.waiting = dict(enumerate(data))
        return data

    def on_data(self, reader: int, msg: wire.Message) -> None:
        """A message on data connection ``reader``.

        Raises:
            RemoteError: the reader answered with an ERROR.
            ProtocolError: anything but the awaited HEARTBEAT.
        """
        if isinstance(msg, wire.ErrorMsg):
            raise RemoteError(self.endpoint, str(msg.kind), msg.message)
        if not isinstance(msg, wire.Heartbeat) or reader not in self.waiting:
            raise ProtocolError(f"{self.endpoint}: expected HEARTBEAT on reader connection "
                                f"{reader}, got {wire.kind_of(msg).name}")
        del self.waiting[reader]

    @property
    def done(self) -> bool:
        return self.index is not None and not self.waiting


class Handshake:
    """Progress of the first handshake with servers ``endpoints``.

    Args:
        endpoints: the servers, in the order their numbers refer to.
        deadline: time (same clock as the ``now`` arguments) by which it must be done.
        timeout: the seconds ``deadline`` stands for (for messages).

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoints: Sequence[str], deadline: float, timeout: float) -> None:
        self._joins = [Join(e) for e in endpoints]
        self._deadline = deadline
        self._timeout = timeout

    def on_control(self, server: int, msg: wire.Message) -> list[str]:
        """A message from ``server``'s control connection (see :meth:`Join.on_control`)."""
        return self._joins[server].on_control(msg)

    def on_data(self, server: int, reader: int, msg: wire.Message) -> None:
        """A message on data connection ``reader`` of ``server`` (see :meth:`Join.on_data`)."""
        self._joins[server].on_data(reader, msg)

    @property
    def done(self) -> bool:
        return all(j.done for j in self._joins)

    @property
    def indexes(self) -> tuple[wire.Index, ...]:
        """Every server's INDEX, in server order (once :attr:`done`)."""
        if not self.done:
            raise ProtocolError("handshake not finished")
        return tuple(j.index for j in self._joins if j.index is not None)

    def check(self, now: float) -> None:
        """Raise once ``deadline`` has passed before the handshake is done.

        Raises:
            ServerUnavailable: naming the servers that did not answer HELLO, or whose reader
                connections did not answer.
        """
        if self.done or now < self._deadline:
            return
        silent = [j.endpoint for j in self._joins if j.index is None]
        if silent:
            raise ServerUnavailable(", ".join(silent),
                                    f"no answer to HELLO within {self._timeout} s")
        waiting = [j for j in self._joins if j.waiting]
        raise ServerUnavailable(", ".join(j.endpoint for j in waiting),
                                f"{sum(len(j.waiting) for j in waiting)} reader data "
                                f"connection(s) not answered within {self._timeout} s")

    def left(self, now: float) -> float:
        """Seconds until the deadline (never negative)."""
        return max(self._deadline - now, 0.0)
