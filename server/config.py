"""Loader server configuration: command-line flags validated into a frozen dataclass."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.columns import ReadOptions
from dataflow.errors import ConfigError
from dataflow.exporter import check_metrics_address
from dataflow.readers.tar import DEFAULT_OPTIONS, TarOptions
from dataflow.readers.tarindex import MISSING_FIELD
from dataflow.remote import ENV_STORAGE_OPTIONS, RemoteConfig, parse_size, parse_storage_options
from dataflow.security import ServerCurve, server_curve
from dataflow.server.dataflags import add_data_flags, read_options
from dataflow.server.ledger import CREDIT_SLACK
from dataflow.wire import MAX_BATCH_SIZE

DEFAULT_BIND = "tcp://127.0.0.1:0"
PEER_QUEUE_MARGIN = 16
DEFAULT_MAX_CREDITS = 64
DEFAULT_CLIENT_TTL = 10.0
DEFAULT_WORKER_QUEUE = 2
DEFAULT_MAX_SESSIONS = 256
DEFAULT_SESSION_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_REQUEST_SAMPLES = 65536
DEFAULT_MAX_REPLY_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_INBOUND_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_INBOUND_TOTAL = 32 * 1024 * 1024
DEFAULT_MAX_SESSIONS_PER_ADDRESS = 32
DEFAULT_SESSION_START_TIMEOUT = 30.0
DEFAULT_MAX_WINDOW_SAMPLES = 1 << 18
DEFAULT_MAX_UNSENT_BYTES = 2 * 1024**3
MIN_TCP_TIMEOUT_S = 10.0
MAX_SESSIONS = 65536
MAX_REPLY_BYTES = 2 * 1024**3
MAX_INBOUND_TOTAL = 64 * 1024**3
MAX_UNSENT_BYTES = 1024**4
RANGE_BYTES = 24
HEADER_ROOM = 64 * 1024
MAX_WORKERS = 256
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
)
"""The integer fields of :class:`ServerConfig` and their ranges ``(name, lo, hi)``."""


def default_workers() -> int:
    """Reader processes by default: one per CPU, at least 1, at most 32."""
    return max(1, min(os.cpu_count() or 1, 32))


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
        max_sessions: most sessions at once; a HELLO beyond is refused (SERVER_BUSY).
        session_idle_timeout: seconds after which a session that sent nothing at all (not
            even a HEARTBEAT) is freed, even with its connection open, and told so.
        max_request_samples: most samples one REQUEST may name for a client whose HELLO
            declares no ``batch_size``, and the most a HELLO may declare.
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
        metrics_port: TCP port of the Prometheus ``/metrics`` endpoint (0: a free one); None:
            no endpoint.
        metrics_bind: IP address the metrics endpoint listens on.
        read: which columns are served and how (:mod:`dataflow.columns`).
        split: the split of a Hugging Face DatasetDict root.
        remote: storage options and local cache size for remote shards.
        index_workers: shards opened at once while the dataset index is built.
        progress: indexing progress bar on stderr: ``on``, ``off``, or ``auto`` (on when
            stderr is a terminal).
    """

    data: tuple[str, ...]
    bind: str = DEFAULT_BIND
    workers: int = 1
    transform: str | None = None
    transform_path: str | None = None
    cache_dir: str | None = None
    log_level: str = "INFO"
    max_credits: int = DEFAULT_MAX_CREDITS
    client_ttl: float = DEFAULT_CLIENT_TTL
    worker_queue: int = DEFAULT_WORKER_QUEUE
    on_error: str = "raise"
    tar: TarOptions = DEFAULT_OPTIONS
    exit_with_parent: bool = False
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
    metrics_port: int | None = None
    metrics_bind: str = DEFAULT_METRICS_BIND
    read: ReadOptions = ReadOptions()
    split: str | None = None
    remote: RemoteConfig = RemoteConfig()
    index_workers: int = DEFAULT_INDEX_WORKERS
    progress: str = "auto"

    def __post_init__(self) -> None:
        if not self.data or not all(isinstance(d, str) and d for d in self.data):
            raise ConfigError(f"`data` must be one or more non-empty specs. Found: {self.data!r}")
        if not self.bind.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"`bind` must be a tcp:// or ipc:// endpoint. Found: {self.bind!r}")
        for name, lo, hi in INT_FIELDS:
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo, hi))
        if self.transform is not None:
            module, _, func = self.transform.partition(":")
            if not module or not func:
                raise ConfigError("`transform` must look like `module:function`. "
                                  f"Found: {self.transform!r}")
        if self.transform_path is not None and not os.path.isdir(self.transform_path):
            raise ConfigError("`transform_path` must be an existing directory. "
                              f"Found: {self.transform_path!r}")
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
        if self.progress not in PROGRESS_MODES:
            raise ConfigError(f"`progress` must be one of {PROGRESS_MODES}. "
                              f"Found: {self.progress!r}")

    @property
    def zmq_bind(self) -> str:
        """``bind`` in ZeroMQ's spelling: port 0 becomes ``*`` (an ephemeral port)."""
        if self.bind.startswith("tcp://") and self.bind.endswith(":0"):
            return self.bind[:-2] + ":*"
        return self.bind

    def data_bind(self, slot: int) -> str:
        """Where reader ``slot`` binds its data socket: ``bind``'s host on a free port, or
        ``bind``'s ipc path with a ``.w<slot>`` suffix."""
        if self.bind.startswith("tcp://"):
            return self.bind[: self.bind.rindex(":")] + ":*"
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
    def descriptors(self) -> int:
        """File descriptors a server process may need: its client connections and its own."""
        return self.max_connections + 256

    @property
    def level(self) -> int:
        return getattr(logging, self.log_level)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dataflow-server",
        description="Serve batches of a sharded dataset to dataflow DataLoader clients over "
                    "ZeroMQ. Prints one JSON line {\"event\": \"ready\", \"endpoint\": ...} on "
                    "stdout when ready; logs go to stderr. SIGTERM/SIGINT stop it cleanly.",
        epilog="`dataflow-server health --endpoint ENDPOINT` probes a running server (exit 0 "
               "when it answers); see `dataflow-server health --help`.",
    )
    p.add_argument("--data", nargs="+", required=True, metavar="SPEC",
                   help="dataset specs: shard paths, directories, globs, brace ranges "
                        "(train-{000000..000127}.tar) or fsspec URLs")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="ENDPOINT",
                   help="endpoint clients connect to; port 0 picks a free port, reported in the "
                        "ready line (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help=f"reader processes (default: one per CPU, here {default_workers()})")
    p.add_argument("--transform", default=None, metavar="MODULE:FUNCTION",
                   help="function f(batch, ctx) -> batch (or f(batch)) run on every batch in "
                        "the reader processes (e.g. decoding, augmentation); ctx carries the "
                        "epoch, the global batch index and a per-batch seed (the API: "
                        "dataflow.transform); its errors reach the client naming the batch")
    p.add_argument("--transform-path", default=None, metavar="DIR",
                   help="directory the --transform module is looked for in when it is not "
                        "on sys.path (only that module; the directory is not added to "
                        "sys.path) (default: the directory the server starts in)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="local cache for remote shards and tar member indexes")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option for the fsspec filesystem of remote shards, repeatable, e.g. "
                        "endpoint_url=http://127.0.0.1:9000, anon=true, "
                        "client_kwargs.region_name=eu-west-1 (a value is read as JSON when it "
                        f"parses); over the JSON object in ${ENV_STORAGE_OPTIONS}")
    p.add_argument("--cache-size", default="8G", metavar="BYTES",
                   help="most bytes of remote shard data cached on disk under --cache-dir "
                        "(least recently used evicted first); e.g. 512M, 20G "
                        "(default: %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                   help="logging level (default: %(default)s)")
    p.add_argument("--max-credits", type=int, default=DEFAULT_MAX_CREDITS, metavar="N",
                   help="most credits granted to one client (it may keep up to twice as many "
                        "requests outstanding); bounds server memory (default: %(default)s)")
    p.add_argument("--client-ttl", type=float, default=DEFAULT_CLIENT_TTL, metavar="SECONDS",
                   help="free a client's state once it has been silent this long and its "
                        "connection is closed (a killed client's connection closes at once; "
                        "the kernel closes one whose host vanished, or that stopped reading, "
                        "after max(this, 10) s: TCP keepalive and TCP_USER_TIMEOUT) "
                        "(default: %(default)s)")
    p.add_argument("--worker-queue", type=int, default=DEFAULT_WORKER_QUEUE, metavar="N",
                   help="tasks queued per worker process (default: %(default)s)")
    p.add_argument("--on-error", default="raise", choices=ON_ERROR,
                   help="damaged samples: fail the request (raise) or skip them "
                        "(default: %(default)s)")
    wds = p.add_argument_group("WebDataset tar shards")
    wds.add_argument("--key-field", action="store_true",
                     help="serve each sample's key (its members' path up to the first dot "
                          "of the file name) as the text field __key__")
    wds.add_argument("--missing-field", default="error", choices=MISSING_FIELD,
                     help="a sample lacking a field most samples of its shard have: damaged "
                          "(error: --on-error decides), left out and counted as skipped "
                          "(skip), or served with the field filled (fill: empty bytes or "
                          "text, -1 for integer fields, zeros for .npy arrays) "
                          "(default: %(default)s)")
    caps = p.add_argument_group(
        "caps", "bounds on what one peer can make the server hold; each refusal or cut is "
                "counted in STATS")
    caps.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, metavar="N",
                      help="most client sessions at once; a HELLO beyond is refused with an "
                           "ERROR ServerBusy, and connections beyond 2 x N + 64 are cut "
                           "(STATS sessions_refused, connections_cut) (default: %(default)s)")
    caps.add_argument("--max-sessions-per-address", type=int,
                      default=DEFAULT_MAX_SESSIONS_PER_ADDRESS, metavar="N",
                      help="most sessions of one peer address (IP address; on ipc, local "
                           "user); a HELLO beyond is refused with an ERROR ServerBusy "
                           "(STATS address_sessions_refused); the address may also keep at most "
                           "2 x N + 16 connections to each server process, N x 2 x "
                           "--max-credits requests outstanding (STATS refused), and N / "
                           "--max-sessions of --max-unsent-bytes (default: %(default)s)")
    caps.add_argument("--session-idle-timeout", type=float,
                      default=DEFAULT_SESSION_IDLE_TIMEOUT, metavar="SECONDS",
                      help="free a session that sent nothing (not even a HEARTBEAT; clients "
                           "send one a second) for this long, even with its connection open, "
                           "or that sent no REQUEST this long after its HELLO, and tell it "
                           "with an ERROR UnknownClient (STATS sessions_idle_expired, "
                           "sessions_unused_expired) (default: %(default)s)")
    caps.add_argument("--session-start-timeout", type=float,
                      default=DEFAULT_SESSION_START_TIMEOUT, metavar="SECONDS",
                      help="free a session that attached no data connection to a reader this "
                           "long after its HELLO (the DataLoader attaches at once), and tell it "
                           "with an ERROR UnknownClient (STATS sessions_unattached_expired); "
                           "until it attached, its requests wait unread "
                           "(default: %(default)s)")
    caps.add_argument("--max-window-samples", type=int, default=DEFAULT_MAX_WINDOW_SAMPLES,
                      metavar="N",
                      help="most samples one session may have requested and not received: a "
                           "HELLO whose credits x batch_size (else --max-request-samples) is "
                           "larger is granted fewer credits, at least one "
                           "(default: %(default)s)")
    caps.add_argument("--max-unsent-bytes", type=int, default=DEFAULT_MAX_UNSENT_BYTES,
                      metavar="BYTES",
                      help="most bytes of replies the readers hold that are not yet written to "
                           "their clients; no request is handed to a reader while it is used, "
                           "nor one of an address using its share (see "
                           "--max-sessions-per-address); requests wait, they are not refused; "
                           "the kernel cuts a client that stops reading after max(--client-ttl,"
                           " 10) s (default: %(default)s)")
    caps.add_argument("--max-request-samples", type=int, default=DEFAULT_MAX_REQUEST_SAMPLES,
                      metavar="N",
                      help="most samples in one REQUEST of a client whose HELLO declares no "
                           "batch_size, and the largest batch_size a HELLO may declare; a "
                           "REQUEST of more samples than its session allows, or naming a "
                           "sample twice (overlapping ranges), is refused before any read "
                           "(STATS refused) (default: %(default)s)")
    caps.add_argument("--max-reply-bytes", type=int, default=DEFAULT_MAX_REPLY_BYTES,
                      metavar="BYTES",
                      help="most bytes of one reply; a larger batch is answered with an ERROR "
                           "ReadFailed (STATS replies_too_large) (default: %(default)s)")
    caps.add_argument("--max-inbound-bytes", type=int, default=DEFAULT_MAX_INBOUND_BYTES,
                      metavar="BYTES",
                      help="most bytes one tcp client connection may have sent that the "
                           "server has not received as whole messages (a multipart message "
                           "never finished), and the largest frame; the connection is cut "
                           "beyond (STATS connections_cut) (default: %(default)s)")
    caps.add_argument("--max-inbound-total", type=int, default=DEFAULT_MAX_INBOUND_TOTAL,
                      metavar="BYTES",
                      help="most such bytes over all client connections together; beyond, the "
                           "connections holding the most are cut (STATS connections_cut). "
                           "libzmq keeps up to ~33 bytes of memory per byte received (an empty "
                           "frame is 2 bytes on the wire, 64 in memory) (default: %(default)s)")
    sec = p.add_argument_group(
        "security", "CurveZMQ on every client link (control and data): encrypted, and only "
                    "clients whose public key is allowed get a session or data; keys from "
                    "`python -m dataflow keygen`; both flags or neither")
    sec.add_argument("--curve-secret-key", default=None, metavar="PATH",
                     help="this server's secret key file (NAME.key_secret, mode 0600: refused "
                          "when others may read it); clients need its public NAME.key")
    sec.add_argument("--curve-allowed-keys", default=None, metavar="DIR",
                     help="directory of the client public keys (*.key) accepted, read at "
                          "start (refused when others may write it); refusals are logged and "
                          "counted (STATS auth_refused)")
    mon = p.add_argument_group(
        "metrics", "Prometheus metrics (STATS counters, queue depths, sessions' credit use, "
                   "skipped samples per shard) over HTTP at /metrics")
    mon.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                     help="serve /metrics on this TCP port; 0 picks a free one, reported as "
                          "metrics_port in the ready line (default: no metrics endpoint)")
    mon.add_argument("--metrics-bind", default=DEFAULT_METRICS_BIND, metavar="ADDR",
                     help="IP address the metrics endpoint listens on; use 0.0.0.0 (or the "
                          "pod IP) for a Prometheus on another host. It has no "
                          "authentication, so it stays on loopback unless asked "
                          "(default: %(default)s)")
    start = p.add_argument_group(
        "start-up", "the dataset index (every shard's sample count) is cached under "
                    "--cache-dir/datasets and reused while no shard changed; otherwise every "
                    "shard is opened, in a thread pool")
    start.add_argument("--index-workers", type=int, default=DEFAULT_INDEX_WORKERS, metavar="N",
                       help="shards opened at once while indexing; more helps remote shards "
                            "(object-store latency), not local ones (default: %(default)s)")
    start.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                       help="indexing progress bar (tqdm) on stderr, drawn once indexing "
                            "takes over 1 s: auto draws it only when stderr is a terminal, "
                            "never into a log file (default: %(default)s)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the process that started this server exits, even if it "
                        "was killed (for servers started by a script, a test or the bench)")
    add_data_flags(p)
    return p


def parse_args(argv: Sequence[str] | None = None,
               environ: Mapping[str, str] = os.environ) -> ServerConfig:
    """Parse command-line flags (and ``$DATAFLOW_STORAGE_OPTIONS``); exits with a usage
    message on invalid input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        options = parse_storage_options(ns.storage_option, environ.get(ENV_STORAGE_OPTIONS))
        remote = RemoteConfig.of(options, cache_bytes=parse_size(ns.cache_size))
        return ServerConfig(
            data=tuple(ns.data), bind=ns.bind,
            workers=default_workers() if ns.workers is None else ns.workers,
            transform=ns.transform,
            transform_path=ns.transform_path or (os.getcwd() if ns.transform else None),
            cache_dir=ns.cache_dir, log_level=ns.log_level,
            max_credits=ns.max_credits, client_ttl=ns.client_ttl, worker_queue=ns.worker_queue,
            on_error=ns.on_error,
            tar=TarOptions(keys=ns.key_field, missing_field=ns.missing_field),
            exit_with_parent=ns.exit_with_parent,
            max_sessions=ns.max_sessions, session_idle_timeout=ns.session_idle_timeout,
            max_request_samples=ns.max_request_samples, max_reply_bytes=ns.max_reply_bytes,
            max_inbound_bytes=ns.max_inbound_bytes, max_inbound_total=ns.max_inbound_total,
            max_sessions_per_address=ns.max_sessions_per_address,
            session_start_timeout=ns.session_start_timeout,
            max_window_samples=ns.max_window_samples, max_unsent_bytes=ns.max_unsent_bytes,
            curve=server_curve(ns.curve_secret_key, ns.curve_allowed_keys),
            metrics_port=ns.metrics_port, metrics_bind=ns.metrics_bind,
            read=read_options(ns), split=ns.split, remote=remote,
            index_workers=ns.index_workers, progress=ns.progress,
        )
    except ConfigError as e:
        parser.error(str(e))
