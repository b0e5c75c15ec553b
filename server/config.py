"""Loader server configuration: a frozen dataclass validated on construction (the command line
that makes one: :mod:`dataflow.server.flags`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.convert.columns import ReadOptions
from dataflow.errors import ConfigError
from dataflow.exporter import MAX_PORT, check_metrics_address
from dataflow.readers.tar.options import DEFAULT_OPTIONS, TarOptions
from dataflow.security import ServerCurve
from dataflow.server.cpus import usable_cpus
from dataflow.server.ledger import CREDIT_SLACK
from dataflow.server.openshards import (
    OWN_DESCRIPTORS,
    SEGMENT_DESCRIPTORS,
    SHARD_DESCRIPTORS,
)
from dataflow.storage.remote import RemoteConfig
from dataflow.wire import MAX_BATCH_SIZE

DEFAULT_BIND = "tcp://127.0.0.1:0"
PEER_QUEUE_MARGIN = 16
DEFAULT_MAX_CREDITS = 64
DEFAULT_CLIENT_TTL = 10.0
DEFAULT_WORKER_QUEUE = 2
DEFAULT_MAX_SESSIONS = 256
MAX_PLAN_WINDOW = 1 << 20
DEFAULT_SESSION_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_REQUEST_SAMPLES = 65536
DEFAULT_MAX_REPLY_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_INBOUND_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_INBOUND_TOTAL = 32 * 1024 * 1024
DEFAULT_MAX_SESSIONS_PER_ADDRESS = 32
DEFAULT_SESSION_START_TIMEOUT = 30.0
DEFAULT_MAX_WINDOW_SAMPLES = 1 << 18
DEFAULT_MAX_UNSENT_BYTES = 2 * 1024**3
MAX_OPEN_SHARDS = 65536
MIN_TCP_TIMEOUT_S = 10.0
MAX_SESSIONS = 65536
MAX_REPLY_BYTES = 2 * 1024**3
MAX_INBOUND_TOTAL = 64 * 1024**3
MAX_UNSENT_BYTES = 1024**4
RANGE_BYTES = 24
HEADER_ROOM = 64 * 1024
MAX_WORKERS = 256
MAX_CACHE_BYTES = 2**50
DEFAULT_CACHE_DISK_BYTES = 10 * 1024**3
MAX_DEFAULT_WORKERS = 32
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ON_ERROR = ("raise", "skip")
DEFAULT_METRICS_BIND = "127.0.0.1"
DEFAULT_INDEX_WORKERS = 8
PROGRESS_MODES = ("auto", "on", "off")
INT_FIELDS = (
    ("workers", 1, MAX_WORKERS), ("max_credits", 1, 4096), ("worker_queue", 1, 64),
    ("max_sessions", 1, MAX_SESSIONS), ("max_sessions_per_address", 1, MAX_SESSIONS),
    ("max_request_samples", 1, MAX_BATCH_SIZE), ("max_window_samples", 1, MAX_BATCH_SIZE),
    ("max_reply_bytes", 1, MAX_REPLY_BYTES), ("max_inbound_bytes", 1, MAX_REPLY_BYTES),
    ("max_inbound_total", 1, MAX_INBOUND_TOTAL), ("max_unsent_bytes", 1, MAX_UNSENT_BYTES),
    ("index_workers", 1, 256),
    ("cache_memory", 0, MAX_CACHE_BYTES), ("cache_disk_bytes", 1, MAX_CACHE_BYTES),
    ("cache_plan_window", 0, MAX_PLAN_WINDOW),
)
"""The integer fields of :class:`ServerConfig` and their ranges ``(name, lo, hi)``."""


def default_workers() -> int:
    """Reader processes by default: one per CPU this process may use (its affinity, capped by
    its cgroup's CPU quota: :func:`~dataflow.server.cpus.usable_cpus`), at most 32."""
    return min(usable_cpus(), MAX_DEFAULT_WORKERS)


@dataclass(frozen=True)
class ServerConfig:
    """Validated settings of one loader server.

    Attributes:
        data: dataset specs (paths, dirs, globs, brace ranges, fsspec URLs).
        bind: ZeroMQ endpoint clients connect to; port 0 picks a free port.
        workers: reader processes.
        transform: optional ``module:function`` applied to every batch in the workers.
        transform_path: directory the transform's module is also looked for in, after
            ``sys.path`` (:mod:`dataflow.server.transform`); None: ``sys.path`` only.
        cache_dir: local cache directory for remote shards and tar indexes.
        max_open_shards: shards each reader process keeps open (the least recently used
            closed first): two file descriptors and a map each, and a tar's member index in
            memory; None (``auto``): every shard, as far as the open-file limit allows
            (:mod:`dataflow.server.openshards`).
        log_level: logging level name.
        max_credits: most credits granted to one client; a client may keep up to twice its
            credits outstanding (see :mod:`dataflow.server.ledger`).
        client_ttl: seconds of silence after which a client whose connection is closed has its
            state freed (a silent client with a live connection keeps its session).
        worker_queue: tasks queued per worker (one being read + the rest waiting).
        on_error: reader policy for damaged samples (``raise`` or ``skip``).
        tar: WebDataset conventions of tar shards: the ``__key__`` field, samples missing a
            field (:class:`~dataflow.readers.TarOptions`).
        exit_with_parent: stop when the process that started the server exits.
        shared_memory: let a client on this host, of this user, receive batches in the
            shared-memory segment it offers (:mod:`dataflow.server.shmserve`); False: TCP
            frames only (``--shared-memory refuse``).
        max_sessions: most sessions at once; a HELLO beyond is refused (SERVER_BUSY).
        session_idle_timeout: seconds after which a session that sent nothing at all (not
            even a HEARTBEAT) is freed, even with its connection open, and told so.
        max_request_samples: most samples one REQUEST may name for a client whose HELLO
            declares no ``batch_size``, and the most a HELLO may declare; a REQUEST of several
            batches carries as many as fit (:func:`~dataflow.server.admission.admit_hello`).
        max_reply_bytes: most bytes of one reply; a larger batch is answered with an ERROR.
        max_inbound_bytes: most bytes one client connection may have sent that the server has
            not received as whole messages (e.g. a multipart message never finished); the
            connection is cut beyond it. Also the largest frame accepted (``MAXMSGSIZE``).
        max_inbound_total: most such bytes over all client connections of the frontend
            together; beyond it the connections holding the most are cut.
        max_sessions_per_address: most sessions of one peer address (an IP address; on ipc, a
            local user); a HELLO beyond is refused (SERVER_BUSY). Its share of
            ``max_sessions`` is also the address's share of ``max_unsent_bytes``.
        session_start_timeout: seconds a new session has to attach a data connection to a
            reader; a session that did not is freed and told so.
        max_window_samples: most samples one session may have requested and not received
            (its credits x its request size): a HELLO asking for more is granted fewer
            credits, at least one.
        max_unsent_bytes: most bytes of replies the readers hold that ZeroMQ has not written
            to a client yet; requests wait (not refused) while it, or an address's share of
            it, is used.
        curve: CURVE keys of every client link (:mod:`dataflow.security`); None: clear text.
        data_ports: the first TCP port of the readers' data sockets: reader ``i`` binds
            ``data_ports + i`` on ``bind``'s host (ports to publish from a container, or to
            name in a firewall or NetworkPolicy); None: free ports the kernel picks.
        metrics_port: TCP port of the Prometheus ``/metrics`` endpoint (0: a free one); None:
            no endpoint.
        metrics_bind: IP address the metrics endpoint listens on.
        read: which columns are served and how (:mod:`dataflow.convert.columns`).
        split: the split of a Hugging Face DatasetDict root.
        remote: storage options and local cache size for remote shards.
        index_workers: shards opened at once while the dataset index is built.
        progress: indexing progress bar on stderr: ``on``, ``off``, or ``auto`` (on when
            stderr is a terminal).
        cache_memory: bytes of decoded samples the readers cache, together (each reader
            ``cache_memory // workers``: :attr:`reader_cache_memory`); only a ``Stages``
            transform's decode stage is cached (:mod:`dataflow.server.samplecache`); 0: none.
        cache_disk: directory of the caches' disk tier (:mod:`dataflow.server.diskcache`:
            every decoded sample, shared by the readers; needs ``cache_memory``); None: none.
        cache_disk_bytes: most bytes of the disk tier's files, the readers together (each an
            equal share).
        cache_plan_window: most samples a REQUEST may announce in its ``ahead`` (the rows its
            session reads next): the readers' caches then evict by Belady's rule over the
            announced windows (:mod:`dataflow.server.eviction`; needs ``cache_memory``);
            0: least recently used, and clients announce nothing.
    """

    data: tuple[str, ...]
    bind: str = DEFAULT_BIND
    workers: int = 1
    transform: str | None = None
    transform_path: str | None = None
    cache_dir: str | None = None
    max_open_shards: int | None = None
    log_level: str = "INFO"
    max_credits: int = DEFAULT_MAX_CREDITS
    client_ttl: float = DEFAULT_CLIENT_TTL
    worker_queue: int = DEFAULT_WORKER_QUEUE
    on_error: str = "raise"
    tar: TarOptions = DEFAULT_OPTIONS
    exit_with_parent: bool = False
    shared_memory: bool = True
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT
    max_request_samples: int = DEFAULT_MAX_REQUEST_SAMPLES
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES
    max_inbound_bytes: int = DEFAULT_MAX_INBOUND_BYTES
    max_inbound_total: int = DEFAULT_MAX_INBOUND_TOTAL
    max_sessions_per_address: int = DEFAULT_MAX_SESSIONS_PER_ADDRESS
    session_start_timeout: float = DEFAULT_SESSION_START_TIMEOUT
    max_window_samples: int = DEFAULT_MAX_WINDOW_SAMPLES
    max_unsent_bytes: int = DEFAULT_MAX_UNSENT_BYTES
    curve: ServerCurve | None = None
    data_ports: int | None = None
    metrics_port: int | None = None
    metrics_bind: str = DEFAULT_METRICS_BIND
    read: ReadOptions = ReadOptions()
    split: str | None = None
    remote: RemoteConfig = RemoteConfig()
    index_workers: int = DEFAULT_INDEX_WORKERS
    progress: str = "auto"
    cache_memory: int = 0
    cache_disk: str | None = None
    cache_disk_bytes: int = DEFAULT_CACHE_DISK_BYTES
    cache_plan_window: int = 0

    def __post_init__(self) -> None:
        if not self.data or not all(isinstance(d, str) and d for d in self.data):
            raise ConfigError(f"`data` must be one or more non-empty specs. Found: {self.data!r}")
        if not self.bind.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"`bind` must be a tcp:// or ipc:// endpoint. Found: {self.bind!r}")
        for name, lo, hi in INT_FIELDS:
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo, hi))
        if self.max_open_shards is not None:
            object.__setattr__(self, "max_open_shards", check_int(
                "max_open_shards", self.max_open_shards, 1, MAX_OPEN_SHARDS))
        if self.transform is not None:
            module, _, func = self.transform.partition(":")
            if not module or not func:
                raise ConfigError("`transform` must look like `module:function`. "
                                  f"Found: {self.transform!r}")
        if self.transform_path is not None and not os.path.isdir(self.transform_path):
            raise ConfigError("`transform_path` must be an existing directory. "
                              f"Found: {self.transform_path!r}")
        if self.cache_disk is not None and not self.reader_cache_memory:
            raise ConfigError("`cache_disk` needs `cache_memory` of at least a byte a reader "
                              f"(the disk tier holds what memory evicts). Found: "
                              f"{self.cache_memory}")
        if self.cache_plan_window and not self.reader_cache_memory:
            raise ConfigError("`cache_plan_window` needs `cache_memory` of at least a byte a "
                              f"reader (it chooses what the cache evicts). Found: "
                              f"{self.cache_memory}")
        if self.cache_disk is not None and not os.path.isdir(self.cache_disk):
            raise ConfigError(f"`cache_disk` must be an existing directory. Found: "
                              f"{self.cache_disk!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"`log_level` must be one of {LOG_LEVELS}. Found: {self.log_level!r}")
        if not self.client_ttl > 0:
            raise ConfigError(f"`client_ttl` must be > 0 seconds. Found: {self.client_ttl}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"`on_error` must be one of {ON_ERROR}. Found: {self.on_error!r}")
        if not self.session_idle_timeout > self.client_ttl:
            raise ConfigError("`session_idle_timeout` must be greater than `client_ttl` "
                              f"({self.client_ttl} s). Found: {self.session_idle_timeout}")
        least = self.max_request_samples * RANGE_BYTES + HEADER_ROOM
        if not least <= self.max_inbound_bytes <= MAX_REPLY_BYTES:
            raise ConfigError(f"`max_inbound_bytes` must be in [{least}, {MAX_REPLY_BYTES}] "
                              f"(the largest REQUEST of `max_request_samples` ranges must fit). "
                              f"Found: {self.max_inbound_bytes}")
        if not self.max_inbound_bytes <= self.max_inbound_total <= MAX_INBOUND_TOTAL:
            raise ConfigError(f"`max_inbound_total` must be in [`max_inbound_bytes` "
                              f"({self.max_inbound_bytes}), {MAX_INBOUND_TOTAL}]. "
                              f"Found: {self.max_inbound_total}")
        if not self.session_start_timeout > 0:
            raise ConfigError("`session_start_timeout` must be > 0 seconds. "
                              f"Found: {self.session_start_timeout}")
        if self.metrics_port is not None:
            object.__setattr__(self, "metrics_port",
                               check_metrics_address(self.metrics_port, self.metrics_bind))
        if self.data_ports is not None:
            self._check_data_ports()
        if self.progress not in PROGRESS_MODES:
            raise ConfigError(f"`progress` must be one of {PROGRESS_MODES}. "
                              f"Found: {self.progress!r}")

    def _check_data_ports(self) -> None:
        if not self.bind.startswith("tcp://"):
            raise ConfigError(f"`data_ports` needs a tcp:// `bind` (an ipc:// server's readers "
                              f"bind ipc paths). Found: {self.bind!r}")
        first = check_int("data_ports", self.data_ports, 1, MAX_PORT - self.workers + 1)
        object.__setattr__(self, "data_ports", first)
        last = first + self.workers - 1
        for name, port in (("bind", self.bind_port), ("metrics_port", self.metrics_port or 0)):
            if first <= port <= last:
                raise ConfigError(f"`data_ports` ({first}-{last}: one port per reader) must "
                                  f"not include the `{name}` port. Found: {port}")

    @property
    def bind_port(self) -> int:
        """``bind``'s TCP port (0: a free one, or an ipc:// endpoint)."""
        port = self.bind.rpartition(":")[2]
        return int(port) if self.bind.startswith("tcp://") and port.isdigit() else 0

    @property
    def zmq_bind(self) -> str:
        """``bind`` in ZeroMQ's spelling: port 0 becomes ``*`` (an ephemeral port)."""
        if self.bind.startswith("tcp://") and self.bind.endswith(":0"):
            return self.bind[:-2] + ":*"
        return self.bind

    def data_bind(self, slot: int) -> str:
        """Where reader ``slot`` binds its data socket: ``bind``'s host on port
        ``data_ports + slot`` (on a free port without ``data_ports``), or ``bind``'s ipc path
        with a ``.w<slot>`` suffix."""
        if self.bind.startswith("tcp://"):
            port = "*" if self.data_ports is None else str(self.data_ports + slot)
            return f"{self.bind[: self.bind.rindex(':')]}:{port}"
        return f"{self.bind}.w{slot}"

    @property
    def max_connections(self) -> int:
        """Client connections a server process (frontend or reader) keeps at once; more are
        cut as they come. Room for a reconnecting client's old connection to close."""
        return 2 * self.max_sessions + 64

    @property
    def peer_queue(self) -> int:
        """Messages a server process queues for one peer (its send high-water mark): the
        most replies a client may have outstanding (twice its credits) and room for control
        messages."""
        return CREDIT_SLACK * self.max_credits + PEER_QUEUE_MARGIN

    @property
    def address_sessions(self) -> int:
        """Sessions one peer address may hold (``max_sessions_per_address``, at most
        ``max_sessions``)."""
        return min(self.max_sessions_per_address, self.max_sessions)

    @property
    def address_connections(self) -> int:
        """Client connections one peer address may keep open to one server process."""
        return 2 * self.address_sessions + 16

    @property
    def address_unsent_bytes(self) -> int:
        """An address's share of ``max_unsent_bytes``: its share of the sessions."""
        return max(1, self.max_unsent_bytes * self.address_sessions // self.max_sessions)

    @property
    def tcp_timeout_s(self) -> float:
        """Seconds after which the kernel closes a client connection whose peer vanished or
        stopped reading: ``max(client_ttl, 10)`` (TCP keepalive and ``TCP_USER_TIMEOUT``)."""
        return max(self.client_ttl, MIN_TCP_TIMEOUT_S)

    @property
    def reader_cache_memory(self) -> int:
        """Bytes of decoded samples each reader caches: its equal share of ``cache_memory``."""
        return self.cache_memory // self.workers

    @property
    def reader_cache_disk_bytes(self) -> int:
        """Bytes of disk-tier files each reader keeps: its equal share of
        ``cache_disk_bytes``."""
        return self.cache_disk_bytes // self.workers

    @property
    def descriptors(self) -> int:
        """File descriptors a server process needs before the dataset is indexed: its client
        connections, each session's shared-memory segment, its own, and the shards a reader
        keeps open when their number is given (``auto``:
        :func:`~dataflow.server.openshards.open_shards` once the shards are known)."""
        return (self.max_connections + SEGMENT_DESCRIPTORS * self.max_sessions
                + OWN_DESCRIPTORS + SHARD_DESCRIPTORS * (self.max_open_shards or 0))

    @property
    def level(self) -> int:
        return getattr(logging, self.log_level)
