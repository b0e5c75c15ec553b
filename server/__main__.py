"""``python -m dataflow.server`` / ``dataflow-server``: one loader server until SIGTERM/SIGINT;
``dataflow-server health ...`` probes one (:mod:`dataflow.server.health`);
``dataflow-server container ...`` is one with a container's defaults, the loader image's
entrypoint (:mod:`dataflow.server.container`)."""

from __future__ import annotations

import json
import logging
import os
import resource
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import zmq

from dataflow.errors import DataflowError, ServerStartError
from dataflow.index.cache import load_index
from dataflow.index.scan import ScanOptions, resolve_dataset
from dataflow.server import container, health
from dataflow.server.config import ServerConfig
from dataflow.server.diskcache import remove_server_directory, server_directory
from dataflow.server.flags import parse_args
from dataflow.server.frontend import STOPPING_LINGER_MS, Frontend
from dataflow.server.metrics import ServerMetrics
from dataflow.server.openshards import member_index_bytes, open_shards
from dataflow.server.pool import WorkerPool
from dataflow.server.ports import check_ports
from dataflow.server.tasks import WorkerSpec, indexed_shards
from dataflow.server.transform import load_transform
from dataflow.server.worker import DataCaps
from dataflow.storage.remote import session
from dataflow.storage.sources import is_local

log = logging.getLogger("dataflow.server")

READY_TIMEOUT_S = 120.0


class _StopFlag:
    """Set by SIGTERM/SIGINT, or true once ``parent`` has exited; polled by the serving loop."""

    def __init__(self, parent: int | None = None) -> None:
        self.set = False
        self._parent = parent

    def __call__(self) -> bool:
        if not self.set and self._parent is not None and os.getppid() != self._parent:
            log.info("parent process %d exited; shutting down", self._parent)
            self.set = True
        return self.set

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        log.info("received signal %d; shutting down", signum)
        self.set = True


def hard_descriptors() -> int | None:
    """This process's open-file hard limit (``ulimit -Hn``); None: unlimited."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def reserve_descriptors(needed: int) -> None:
    """Raise this process's open-file limit (inherited by its workers) to ``needed``.

    Raises:
        ServerStartError: the hard limit is lower.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise ServerStartError(f"--max-sessions and --max-open-shards need {needed} file "
                                   f"descriptors per process; the hard limit (ulimit -Hn) is "
                                   f"{hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def serve(config: ServerConfig, stop: _StopFlag, *, progress: bool = False,
          started: float | None = None) -> int:
    """Bind the client endpoint, load or build the index, start workers, print the ready line,
    serve until stopped, then tell every session the server is stopping.

    Args:
        config: the server's settings.
        stop: polled by the serving loop.
        progress: draw the indexing progress bar on stderr.
        started: ``time.monotonic()`` when the process began its work, for the time to ready
            in the log (default: when this call began).
    """
    started = time.monotonic() if started is None else started
    reserve_descriptors(config.descriptors)
    check_ports(config)
    if config.transform:
        load_transform(config.transform, config.transform_path)
    # Abstract-namespace names (Linux): no file exists, so none is left behind, even on SIGKILL.
    backend = f"ipc://@dataflow-{os.getpid()}-{secrets.token_hex(8)}"
    ctx: zmq.Context | None = None
    frontend = None
    pool = None
    metrics = None
    cache_disk = None
    try:
        shards, read = resolve_dataset(list(config.data), split=config.split,
                                       read=config.read, remote=config.remote)
        loaded = load_index(shards, cache_dir=config.cache_dir, on_error=config.on_error,
                            max_workers=config.index_workers, progress=progress,
                            how=ScanOptions(read, config.tar, config.remote))
        index, cache = loaded.index, "hit" if loaded.hit else "miss"
        log.info("dataset: %d shard(s), %d sample(s), fingerprint %s; index in %.2f s "
                 "(index cache %s)", len(index.shards), index.total, index.fingerprint,
                 loaded.seconds, cache)
        opened = open_shards(config.max_open_shards, len(index.shards),
                             replace(config, max_open_shards=None).descriptors,
                             hard_descriptors())
        reserve_descriptors(opened.reserve)
        log.info("each reader keeps up to %d of the %d shard(s) open (--max-open-shards %s); "
                 "tar member indexes of that many take up to ~%.0f MiB, keys aside: once for "
                 "the host where readers can lease the index files (up to %d a reader), else "
                 "in each reader", opened.count, len(index.shards),
                 config.max_open_shards or "auto",
                 member_index_bytes(index.sizes, len(index.schema), opened.count) / 2**20,
                 opened.shared_indexes)
        if opened.advice is not None:
            log.warning("%s", opened.advice)
        if not all(is_local(s) for s in index.shards):
            log.info("remote reads while indexing: %s", session(config.remote).stats())
        data_sndhwm = config.peer_queue
        if config.cache_disk is not None:
            cache_disk = server_directory(config.cache_disk, os.getpid())
        pool = WorkerPool(WorkerSpec(backend, data_sndhwm, index.shards, config.cache_dir,
                                     config.transform, config.on_error, os.getpid(),
                                     config.level, config.max_reply_bytes, index.root,
                                     config.max_connections, config.curve, index.read,
                                     config.transform_path, config.tar, config.remote,
                                     indexed_shards(index), opened.count,
                                     config.reader_cache_memory, cache_disk,
                                     config.reader_cache_disk_bytes,
                                     config.cache_plan_window, config.max_sessions,
                                     opened.shared_indexes),
                          config.workers, config.worker_queue,
                          [config.data_bind(slot) for slot in range(config.workers)],
                          DataCaps(config.address_connections, config.tcp_timeout_s))
        # Reader processes are forked (they share this process's imports) before it has a
        # ZeroMQ context or a metrics thread (see WorkerPool.start: a process running other
        # threads, such as the remote layer's, spawns them instead).
        pool.start(fork=True)
        ctx = zmq.Context()
        if config.metrics_port is not None:
            metrics = ServerMetrics(config.metrics_port, config.metrics_bind)
        frontend = Frontend(config, index, pool, ctx, backend,
                            metrics.publish if metrics is not None else None)
        frontend.wait_ready(READY_TIMEOUT_S, stop)
        if stop():
            return 0
        if metrics is not None:
            metrics.publish(frontend.snapshot())
        ready = {"event": "ready", "endpoint": frontend.endpoint, "pid": os.getpid(),
                 "workers": config.workers, "shards": len(index.shards), "samples": index.total,
                 "fingerprint": index.fingerprint, "worker_pids": pool.pids,
                 "data_endpoints": pool.endpoints, "index_cache": cache,
                 "metrics_port": metrics.port if metrics is not None else None}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        log.info("ready in %.2f s (%d shards, %d samples, index cache %s)",
                 time.monotonic() - started, len(index.shards), index.total, cache)
        log.info("serving on %s with %d worker(s)", frontend.endpoint, config.workers)
        frontend.serve(stop)
        frontend.stopping()
        log.info("stopped; counters %s", frontend.stats())
        return 0
    finally:
        if metrics is not None:
            metrics.close()
        if pool is not None:
            pool.close()
        if frontend is not None:
            frontend.close(STOPPING_LINGER_MS)
        if ctx is not None:
            ctx.term()
        if cache_disk is not None:
            remove_server_directory(cache_disk)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit code."""
    started = time.monotonic()
    args = sys.argv[1:] if argv is None else list(argv)
    in_container = args[:1] == ["container"]
    if in_container:
        args = args[1:]
    if args[:1] == ["health"]:
        return health.main(args[1:])
    config = container.parse_args(args) if in_container else parse_args(args)
    logging.basicConfig(level=config.level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s server[%(process)d] %(message)s")
    stop = _StopFlag(os.getppid() if config.exit_with_parent else None)
    stop.install()
    try:
        progress = config.progress == "on" or (config.progress == "auto"
                                               and sys.stderr.isatty())
        return serve(config, stop, progress=progress, started=started)
    except (DataflowError, OSError, zmq.ZMQError) as e:
        log.error("%s: %s", type(e).__name__, e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
