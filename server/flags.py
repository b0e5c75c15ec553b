"""The loader server's command line: its flags, parsed into a :class:`ServerConfig`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from dataflow.errors import ConfigError
from dataflow.readers.tar.options import MISSING_FIELD, TarOptions
from dataflow.security import server_curve
from dataflow.server.config import (
    DEFAULT_BIND,
    DEFAULT_CLIENT_TTL,
    DEFAULT_INDEX_WORKERS,
    DEFAULT_MAX_CREDITS,
    DEFAULT_MAX_INBOUND_BYTES,
    DEFAULT_MAX_INBOUND_TOTAL,
    DEFAULT_MAX_REPLY_BYTES,
    DEFAULT_MAX_REQUEST_SAMPLES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_ADDRESS,
    DEFAULT_MAX_UNSENT_BYTES,
    DEFAULT_MAX_WINDOW_SAMPLES,
    DEFAULT_METRICS_BIND,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_SESSION_START_TIMEOUT,
    DEFAULT_WORKER_QUEUE,
    LOG_LEVELS,
    ON_ERROR,
    PROGRESS_MODES,
    ServerConfig,
    default_workers,
)
from dataflow.server.dataflags import add_data_flags, read_options
from dataflow.server.openshards import AUTO_CAP
from dataflow.storage.remote import (
    ENV_STORAGE_OPTIONS,
    RemoteConfig,
    parse_size,
    parse_storage_options,
)

SERVE_HELP = ("Serve batches of a sharded dataset to dataflow DataLoader clients over ZeroMQ. "
              "Prints one JSON line {\"event\": \"ready\", \"endpoint\": ...} on stdout when "
              "ready; logs go to stderr. SIGTERM/SIGINT stop it cleanly.")


def _open_shards(text: str) -> int | None:
    """``--max-open-shards``: a number, or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None


def _bytes(text: str) -> int:
    """A byte count: ``1000``, ``512M``, ``8G`` (binary units)."""
    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(defaults: Mapping[str, object] | None = None, *, prog: str = "dataflow-server",
                 description: str = SERVE_HELP) -> argparse.ArgumentParser:
    """The server's flags; ``defaults`` replaces some flags' defaults (by ``dest``; ``data``
    makes ``--data`` optional), for ``prog`` (``dataflow-server container``)."""
    defaults = defaults or {}
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="`dataflow-server health --endpoint ENDPOINT` probes a running server (exit 0 "
               "when it answers); see `dataflow-server health --help`. `dataflow-server "
               "container` is the server with a container's defaults (the loader image's "
               "entrypoint); see `dataflow-server container --help`.",
    )
    p.add_argument("--data", nargs="+", required="data" not in defaults, metavar="SPEC",
                   help="dataset specs: shard paths, directories, globs, brace ranges "
                        "(train-{000000..000127}.tar) or fsspec URLs")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="ENDPOINT",
                   help="endpoint clients connect to; port 0 picks a free port, reported in the "
                        "ready line (default: %(default)s)")
    p.add_argument("--data-ports", type=int, default=None, metavar="PORT",
                   help="first TCP port of the reader processes' data sockets: reader i listens "
                        "on PORT+i on the --bind host, and clients connect to each at the host "
                        "they reached the server at; so a container publishes PORT to "
                        "PORT+N-1 under the same numbers (docker run -p), and a firewall or "
                        "NetworkPolicy names them; a port taken stops the start, naming it "
                        "(default: ports the kernel picks, reachable only where clients reach "
                        "every port of the server's host)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="reader processes (default: one per CPU this process may use: its "
                        "affinity (taskset, --cpuset-cpus) capped by its cgroup's CPU quota "
                        f"(--cpus, a CPU limit), at most 32; here {default_workers()})")
    p.add_argument("--max-open-shards", type=_open_shards, default=None, metavar="N|auto",
                   help="shards each reader process keeps open, the least recently used closed "
                        "first: two file descriptors and a map each (the open-file limit is "
                        "raised to match), and for a tar its member index in memory (~100 bytes a "
                        "sample); a shuffled batch reads from as many shards as it has samples, "
                        "so a dataset of more shards than this reopens some for every batch "
                        f"(default: auto, every shard, at most {AUTO_CAP} and what the "
                        "open-file hard limit allows)")
    p.add_argument("--transform", default=None, metavar="MODULE:FUNCTION",
                   help="function f(batch, ctx) -> batch (or f(batch)) run on every batch in "
                        "the reader processes (e.g. decoding, augmentation); ctx carries the "
                        "epoch, the global batch index and a per-batch seed (the API: "
                        "dataflow.transform); its errors reach the client naming the batch; "
                        "or a dataflow.transform.Stages (a deterministic decode, cached with "
                        "--cache-memory, then a random augment)")
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
    p.add_argument("--cache-memory", default="0", metavar="BYTES",
                   help="most bytes of decoded samples the reader processes cache in memory, "
                        "together (each an equal share), when --transform names a Stages "
                        "(a deterministic decode stage, then a random augment): a sample they "
                        "hold is not read nor decoded again, for any session, epoch, seed, "
                        "batch size or world size; least recently used evicted first (see "
                        "--cache-plan-window); e.g. "
                        "512M, 8G (default: %(default)s, no cache)")
    p.add_argument("--cache-disk", default=None, metavar="DIR",
                   help="directory where the readers also write every sample they decode, "
                        "and find those their sibling readers wrote (one server decodes a "
                        "sample about once), in a dataflow-cache-<pid> directory made at start "
                        "and removed at exit; /dev/shm makes a hit a copy (needs "
                        "--cache-memory; default: none)")
    p.add_argument("--cache-disk-bytes", default="10G", metavar="BYTES",
                   help="most bytes of files under --cache-disk, the readers together (each "
                        "an equal share), least recently used removed first "
                        "(default: %(default)s)")
    p.add_argument("--cache-plan-window", type=int, default=0, metavar="SAMPLES",
                   help="plan-aware eviction: each request of a client may announce the next "
                        "SAMPLES (at most) its session reads, and the readers' caches evict "
                        "first what no live announcement names, then what is read furthest "
                        "ahead (Belady's rule over the announced windows), instead of the "
                        "least recently used; a hint only, never a change to what is served. "
                        "Each reader keeps the latest window of at most --max-sessions "
                        "sessions (up to 256 bytes a sample); e.g. 4096 (needs --cache-memory; "
                        "default: %(default)s: least recently used, nothing announced)")
    p.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                   help="logging level (default: %(default)s)")
    p.add_argument("--max-credits", type=int, default=DEFAULT_MAX_CREDITS, metavar="N",
                   help="most credits granted to one client (it may keep up to twice as many "
                        "requests outstanding; the DataLoader uses its prefetch, or one per "
                        "reader); bounds server memory (default: %(default)s)")
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
                "counted in STATS; BYTES as a number or a size (512M, 2G)")
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
    caps.add_argument("--max-unsent-bytes", type=_bytes, default=DEFAULT_MAX_UNSENT_BYTES,
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
                           "REQUEST carries as many of a client's batches as fit (up to the "
                           "HELLO's group); a REQUEST of more samples than its session "
                           "allows, or naming a sample twice (overlapping ranges), is refused "
                           "before any read "
                           "(STATS refused) (default: %(default)s)")
    caps.add_argument("--max-reply-bytes", type=_bytes, default=DEFAULT_MAX_REPLY_BYTES,
                      metavar="BYTES",
                      help="most bytes of one reply; a larger batch is answered with an ERROR "
                           "ReadFailed (STATS replies_too_large) (default: %(default)s)")
    caps.add_argument("--max-inbound-bytes", type=_bytes, default=DEFAULT_MAX_INBOUND_BYTES,
                      metavar="BYTES",
                      help="most bytes one tcp client connection may have sent that the "
                           "server has not received as whole messages (a multipart message "
                           "never finished), and the largest frame; the connection is cut "
                           "beyond (STATS connections_cut) (default: %(default)s)")
    caps.add_argument("--max-inbound-total", type=_bytes, default=DEFAULT_MAX_INBOUND_TOTAL,
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
    p.add_argument("--shared-memory", choices=("allow", "refuse"), default="allow",
                   help="allow: a client on this host running as this user may have its "
                        "batches written into a shared-memory segment it created in /dev/shm "
                        "(mode 0600; this server proves it can open it; the BATCH header still "
                        "travels on the socket); refuse: TCP frames only (default: "
                        "%(default)s)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the process that started this server exits, even if it "
                        "was killed (for servers started by a script, a test or the bench)")
    add_data_flags(p)
    p.set_defaults(**defaults)
    return p


def parse_args(argv: Sequence[str] | None = None,
               environ: Mapping[str, str] = os.environ,
               parser: argparse.ArgumentParser | None = None) -> ServerConfig:
    """Parse command-line flags (and ``$DATAFLOW_STORAGE_OPTIONS``) with ``parser`` (default:
    :func:`build_parser`'s); exits with a usage message on invalid input."""
    parser = parser or build_parser()
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
            max_open_shards=ns.max_open_shards,
            max_credits=ns.max_credits, client_ttl=ns.client_ttl, worker_queue=ns.worker_queue,
            on_error=ns.on_error,
            tar=TarOptions(keys=ns.key_field, missing_field=ns.missing_field),
            exit_with_parent=ns.exit_with_parent, shared_memory=ns.shared_memory == "allow",
            max_sessions=ns.max_sessions, session_idle_timeout=ns.session_idle_timeout,
            max_request_samples=ns.max_request_samples, max_reply_bytes=ns.max_reply_bytes,
            max_inbound_bytes=ns.max_inbound_bytes, max_inbound_total=ns.max_inbound_total,
            max_sessions_per_address=ns.max_sessions_per_address,
            session_start_timeout=ns.session_start_timeout,
            max_window_samples=ns.max_window_samples, max_unsent_bytes=ns.max_unsent_bytes,
            curve=server_curve(ns.curve_secret_key, ns.curve_allowed_keys),
            data_ports=ns.data_ports, metrics_port=ns.metrics_port,
            metrics_bind=ns.metrics_bind,
            read=read_options(ns), split=ns.split, remote=remote,
            index_workers=ns.index_workers, progress=ns.progress,
            cache_memory=parse_size(ns.cache_memory), cache_disk=ns.cache_disk,
            cache_disk_bytes=parse_size(ns.cache_disk_bytes),
            cache_plan_window=ns.cache_plan_window,
        )
    except ConfigError as e:
        parser.error(str(e))
