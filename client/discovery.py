"""Where a DataLoader's servers are: a static list, a DNS name, or a registry file.

One setting names the servers (the DataLoader's ``servers`` argument, else the
``DATAFLOW_SERVERS`` environment variable, read by the DataLoader only):

* a static list: ``tcp://a:5555,tcp://b:5555`` (or a Python list of endpoints);
* ``dns+tcp://NAME:PORT``: every A/AAAA record of ``NAME`` is a server on ``PORT`` (a
  Kubernetes headless Service gives one record per ready pod), resolved with
  ``socket.getaddrinfo`` and re-resolved every ``resolve_interval`` seconds;
* ``file:///PATH``: a file on a shared filesystem listing one endpoint per line (blank lines
  and ``#`` comments ignored), re-read on the same interval.

The two dynamic forms are looked up by :class:`Watcher` on its own thread, so a slow DNS never
stalls the I/O thread; what the results mean (joins, leaves) is decided by the pure
:class:`~dataflow.client.membership.Membership`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dataflow.errors import ConfigError, ServerUnavailable

ENV_VAR = "DATAFLOW_SERVERS"
DNS_SCHEME = "dns+tcp://"
FILE_SCHEME = "file://"
DEFAULT_RESOLVE_INTERVAL = 10.0
RETRY_S = 1.0  # between lookups while the first one finds no server

GetAddrInfo = Callable[..., Sequence[tuple]]
Lookup = Callable[[], tuple[str, ...]]


def _check_endpoint(endpoint: object, given: object) -> None:
    if not isinstance(endpoint, str) or "://" not in endpoint or not endpoint.strip():
        raise ConfigError("`servers` must be endpoints like tcp://host:port, or one "
                          f"dns+tcp://name:port or file:///path. Found: {given!r}")
    if endpoint.startswith((DNS_SCHEME, FILE_SCHEME)):
        raise ConfigError(f"`servers`: {endpoint} must be the only entry (a name or a file "
                          f"stands for every server). Found: {given!r}")


@dataclass(frozen=True)
class ServerSource:
    """The servers' setting, parsed and validated on construction.

    Attributes:
        spec: the setting as given (named in errors).
        endpoints: the static endpoints (empty for a name or a file).
        host, port: the DNS name and port of ``dns+tcp://``.
        path: the registry file of ``file://``.
    """

    spec: str
    endpoints: tuple[str, ...] = ()
    host: str = ""
    port: int = 0
    path: str = ""

    def __post_init__(self) -> None:
        kinds = sum(map(bool, (self.endpoints, self.host, self.path)))
        if kinds != 1:
            raise ConfigError(f"`servers` must name servers one way. Found: {self.spec!r}")
        for endpoint in self.endpoints:
            _check_endpoint(endpoint, self.spec)
        if len(set(self.endpoints)) != len(self.endpoints):
            raise ConfigError(f"`servers` must not repeat an endpoint. Found: {self.spec!r}")
        if self.host and not 0 < self.port < 65536:
            raise ConfigError(f"`servers`: {self.spec} needs a port in 1..65535. "
                              f"Found: {self.port}")

    @property
    def dynamic(self) -> bool:
        """Whether the servers are looked up again while the loader runs."""
        return not self.endpoints


def parse_servers(servers: object) -> ServerSource:
    """The :class:`ServerSource` for a ``servers`` argument or ``DATAFLOW_SERVERS`` value.

    Raises:
        ConfigError: anything but an endpoint string, a comma-separated list of them, a
            list/tuple of them, ``dns+tcp://name:port`` or ``file:///path`` (a torch
            ``Dataset`` passed where the servers go is refused at once, never iterated).
    """
    if isinstance(servers, (list, tuple)) and all(isinstance(s, str) for s in servers):
        if len(servers) == 1:
            return parse_servers(servers[0])
        return ServerSource(",".join(servers), endpoints=tuple(servers))
    if not isinstance(servers, str):
        raise ConfigError("`servers` must be an endpoint like tcp://host:port or a list of "
                          f"them. Found: {type(servers).__name__} {repr(servers)[:80]}")
    spec = servers.strip()
    if spec.startswith(DNS_SCHEME):
        host, _, port = spec.removeprefix(DNS_SCHEME).rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"`servers` must be dns+tcp://name:port. Found: {spec!r}")
        return ServerSource(spec, host=host, port=int(port))
    if spec.startswith(FILE_SCHEME):
        path = spec.removeprefix(FILE_SCHEME)
        if not path.startswith("/"):
            raise ConfigError(f"`servers` must be file:///absolute/path. Found: {spec!r}")
        return ServerSource(spec, path=path)
    return ServerSource(spec, endpoints=tuple(e.strip() for e in spec.split(",")))


def servers_setting(servers: object, env_value: str | None) -> ServerSource:
    """The :class:`ServerSource` of the ``servers`` argument, else (None) of the value of
    ``DATAFLOW_SERVERS`` (``env_value``, read by the caller: the entry point).

    Raises:
        ConfigError: neither is given, or the one used is malformed (naming the variable when
            it came from there).
    """
    if servers is not None:
        return parse_servers(servers)
    if env_value is None:
        raise ConfigError(f"`servers` not given and {ENV_VAR} is not set")
    try:
        return parse_servers(env_value)
    except ConfigError as e:
        raise ConfigError(f"{ENV_VAR}={env_value!r}: {e}") from e


def _endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def lookup(source: ServerSource, getaddrinfo: GetAddrInfo = socket.getaddrinfo
           ) -> tuple[str, ...]:
    """The servers ``source`` names now, sorted (a static list as given).

    Raises:
        ServerUnavailable: the name does not resolve or the file cannot be read or holds a
            bad line (naming the name, the file and the line).
    """
    if source.endpoints:
        return source.endpoints
    if source.host:
        try:
            infos = getaddrinfo(source.host, source.port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ServerUnavailable(source.spec, f"does not resolve: {e}") from e
        return tuple(sorted({_endpoint(info[4][0], source.port) for info in infos}))
    try:
        with open(source.path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise ServerUnavailable(source.spec, f"cannot be read: {e}") from e
    found = [line for line in lines if line]
    for number, line in enumerate(lines, 1):
        if line and (not line.startswith("tcp://") or line.count(":") < 2):
            raise ServerUnavailable(source.spec, f"line {number} is not an endpoint like "
                                                 f"tcp://host:port: {line!r}")
    return tuple(sorted(set(found)))


def first_lookup(source: ServerSource, find: Lookup, timeout: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[str, ...]:
    """The servers to start with: ``find()`` retried every :data:`RETRY_S` until it names at
    least one server.

    Raises:
        ServerUnavailable: none was found within ``timeout`` seconds (naming the setting and
            the last lookup's error).
    """
    deadline = clock() + timeout
    while True:
        try:
            found = find()
            why = "names no server"
        except ServerUnavailable as e:
            found, why = (), str(e)
        if found:
            return found
        left = deadline - clock()
        if left <= 0:
            raise ServerUnavailable(source.spec, f"no server found within {timeout} s "
                                                 f"(last lookup: {why})")
        sleep(min(RETRY_S, left))


class Watcher:
    """Runs ``find`` on its own thread when asked, so the I/O thread never blocks on DNS.

    Args:
        find: the lookup (see :func:`lookup`).
        wake: called after each lookup (wakes the I/O thread; must not block).

    Thread invariant: :meth:`ask`, :meth:`result` and :meth:`close` are called by the I/O
    thread; the lookup runs on the watcher's thread; the result and ``wake`` (which must not
    block) happen under ``_lock``.
    """

    def __init__(self, find: Lookup, wake: Callable[[], None]) -> None:
        self._find = find
        self._wake = wake
        self._lock = threading.Lock()
        self._asked = threading.Event()
        self._stop = threading.Event()
        self._result: tuple[tuple[str, ...] | None, str] | None = None
        self._thread = threading.Thread(target=self._run, name="dataflow-client-discovery",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def ask(self) -> None:
        """Start a lookup (its result is then available from :meth:`result`)."""
        self._asked.set()

    def result(self) -> tuple[tuple[str, ...] | None, str] | None:
        """The finished lookup's servers (None when it failed) and its error message, once;
        None while no lookup finished since the last call."""
        with self._lock:
            out, self._result = self._result, None
            return out

    def close(self) -> None:
        """Stop the thread (a lookup under way is left to finish on its own, and ``wake`` is
        never called after this returns); idempotent."""
        with self._lock:
            self._stop.set()
        self._asked.set()
        if self._thread.is_alive():
            self._thread.join(0.5)

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._stop.is_set():
                return
            try:
                result: tuple[tuple[str, ...] | None, str] = (self._find(), "")
            except ServerUnavailable as e:
                result = (None, str(e))
            except Exception as e:  # reported as a failed lookup, never a silent death
                result = (None, f"lookup failed: {type(e).__name__}: {e}")
            with self._lock:
                if self._stop.is_set():
                    return
                self._result = result
                self._wake()
