"""The session handshake with one server, as a pure state machine (no sockets).

Per server (:class:`Join`): the client sends HELLO on its control connection once it is up;
the server answers INDEX (the dataset index, credits, a session token and its readers' data
endpoints); the client connects one data connection per reader, says HEARTBEAT on each, and
waits for each reader's HEARTBEAT answer, so no reply can find its connection missing. Until
the join is done, a HEARTBEAT on the control connection is benign (the server probing a
session this client still holds there, or answering a HEARTBEAT sent before), and so is a
second INDEX of the same session (the answer to an earlier HELLO). The first join decides the
dataset; every later one (another server, or one joining again after it was lost) must serve
the same.

The DataLoader starts as soon as one server joined; the others keep joining in the
background (:mod:`dataflow.client.scheduler`).
"""

from __future__ import annotations

from dataflow import wire
from dataflow.errors import ConfigError, DatasetMismatchError, ProtocolError, RemoteError
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
        fingerprint: the dataset it must serve (known once a server joined), or None (the
            first join decides it).

    Attributes:
        index: its INDEX, once it arrived.
        fingerprint: the fingerprint of the dataset it serves, once INDEX arrived.
        waiting: reader number -> data endpoint, for readers not answered yet.

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, endpoint: str, fingerprint: str | None = None) -> None:
        self.endpoint = endpoint
        self._fingerprint = fingerprint
        self.index: wire.Index | None = None
        self.fingerprint = ""
        self.waiting: dict[int, str] = {}

    def on_control(self, msg: wire.Message) -> list[str]:
        """A message from the server's control connection.

        Returns:
            The data endpoints to connect (its INDEX arrived), in reader order; each reader
            is then awaited. Empty for a benign message (a HEARTBEAT, the same session's
            INDEX again).

        Raises:
            RemoteError: the server answered with an ERROR (``ServerBusy``: it holds its
                maximum of sessions).
            ProtocolError: anything else than INDEX or HEARTBEAT, an INDEX of another session
                after the first, an INDEX without readers or without a valid dataset index.
            DatasetMismatchError: the server serves another dataset than ``fingerprint``.
        """
        if isinstance(msg, wire.Heartbeat):
            return []
        if isinstance(msg, wire.ErrorMsg):
            raise RemoteError(self.endpoint, msg.kind, msg.message)
        if not isinstance(msg, wire.Index):
            raise ProtocolError(f"{self.endpoint}: expected INDEX, got {wire.kind_of(msg).name}")
        if self.index is not None:
            if msg.session == self.index.session:
                return []
            raise ProtocolError(f"{self.endpoint}: a second INDEX during the handshake")
        if not msg.data or not msg.session:
            raise ProtocolError(f"{self.endpoint}: INDEX names no reader data endpoints")
        try:
            theirs = DatasetIndex.from_json(msg.index_json).fingerprint
        except ConfigError as e:
            raise ProtocolError(f"{self.endpoint}: INDEX carries no valid dataset index: "
                                f"{e}"[:400]) from e
        if self._fingerprint is not None and theirs != self._fingerprint:
            raise DatasetMismatchError(f"{self.endpoint} serves dataset {theirs}, not "
                                       f"{self._fingerprint}")
        self.index, self.fingerprint = msg, theirs
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
            raise RemoteError(self.endpoint, msg.kind, msg.message)
        if not isinstance(msg, wire.Heartbeat) or reader not in self.waiting:
            raise ProtocolError(f"{self.endpoint}: expected HEARTBEAT on reader connection "
                                f"{reader}, got {wire.kind_of(msg).name}")
        del self.waiting[reader]

    def unanswered(self) -> str:
        """How the wait for the readers stands, for messages: the data endpoints that have not
        answered yet and why that usually is."""
        if self.index is None:
            return "HELLO sent, no INDEX yet"
        if not self.waiting:
            return "INDEX received, every reader connection answered"
        return (f"INDEX received, no answer yet on {len(self.waiting)} of {len(self.index.data)} "
                f"reader data endpoint(s) {', '.join(self.waiting.values())}: unreachable "
                f"from this host? (a firewall, or a server in a container whose --data-ports "
                f"are not published under the same numbers)")

    @property
    def done(self) -> bool:
        return self.index is not None and not self.waiting
