"""Start a loader server as a subprocess and wait until it is ready (tests, benches, scripts)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import IO

from dataflow.errors import ServerUnavailable

# `python -m dataflow.server` with the caller's working directory left off sys.path (as
# `python -P` does on 3.11+): a `dataflow/` or `dataflow.py` beside the caller is never run.
SERVER_BOOTSTRAP = ("import sys; del sys.path[0]; from dataflow.server.__main__ import main; "
                    "sys.exit(main(sys.argv[1:]))")
CLOSE_GRACE_S = 10.0
STDERR_TAIL = 4000


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _cleanup(proc: subprocess.Popen, log: IO[bytes]) -> None:
    _stop(proc, CLOSE_GRACE_S)
    log.close()


class ServerHandle:
    """A running ``python -m dataflow.server`` subprocess.

    Attributes:
        endpoint: the endpoint clients connect to (real port, never 0).
        pid: the server's process id.
        ready: the server's ready line (endpoint, pid, workers, shards, samples, fingerprint,
            worker_pids).
        proc: the subprocess.
    """

    def __init__(self, proc: subprocess.Popen, ready: dict, log: IO[bytes]) -> None:
        self.proc = proc
        self.ready = ready
        self.endpoint: str = ready["endpoint"]
        self.pid: int = proc.pid
        self._log = log
        self._finalizer = weakref.finalize(self, _cleanup, proc, log)

    def stderr_tail(self, n: int = STDERR_TAIL) -> str:
        """The last ``n`` characters of the server's log (stderr)."""
        return _tail(self._log, n)

    def close(self, grace: float = CLOSE_GRACE_S) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` s); idempotent.

        Returns:
            The server's exit code.
        """
        if self._finalizer.alive:
            _stop(self.proc, grace)
            self._finalizer()
        return self.proc.returncode

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _tail(log: IO[bytes], n: int) -> str:
    try:
        size = os.fstat(log.fileno()).st_size
        return os.pread(log.fileno(), n, max(0, size - n)).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def launch(
    data: Sequence[str],
    *,
    workers: int | None = None,
    bind: str = "tcp://127.0.0.1:0",
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> ServerHandle:
    """Start ``python -m dataflow.server`` and wait for its ready line.

    The server is the installed ``dataflow.server``, whatever the caller's working directory
    holds: the working directory is not on the child's ``sys.path``.

    The server stops by itself when this process exits, even when it is killed
    (``--exit-with-parent``).

    Args:
        data: dataset specs (``--data``).
        workers: reader processes (``--workers``); the server's default when None.
        bind: endpoint to bind (port 0: a free port).
        extra_args: more command-line flags.
        timeout: seconds to wait for the ready line.
        env: extra environment variables.
        cwd: the server's working directory (where a ``--transform`` module is looked for
            when it is not on ``sys.path``); this process's when None.

    Raises:
        ServerUnavailable: the server exited or was not ready within ``timeout`` seconds; the
            message holds the tail of its stderr.
    """
    cmd = [sys.executable, "-c", SERVER_BOOTSTRAP, "--data", *data, "--bind", bind,
           "--exit-with-parent"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    cmd += list(extra_args)
    # An anonymous file: nothing is left behind, even if this process is killed.
    log = tempfile.TemporaryFile(prefix="dataflow-server-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log,
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                            cwd=cwd)
    try:
        ready = _wait_ready(proc, timeout)
    except BaseException:
        _cleanup(proc, log)
        raise
    if isinstance(ready, str):
        tail = _tail(log, STDERR_TAIL)
        _cleanup(proc, log)
        raise ServerUnavailable(bind, f"server {ready}; its stderr ends with:\n{tail}")
    return ServerHandle(proc, ready, log)


def _wait_ready(proc: subprocess.Popen, timeout: float) -> dict | str:
    """The server's ready line, or why there is none."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"not ready after {timeout} s"
            if sel.select(min(left, 0.5)):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    proc.wait(5)
                    return f"exited with code {proc.returncode} before it was ready"
                buf += chunk
    line = buf.split(b"\n", 1)[0]
    try:
        ready = json.loads(line)
    except ValueError:
        ready = None
    if not isinstance(ready, dict) or ready.get("event") != "ready":
        return f"printed an unexpected first line on stdout: {line[:200]!r}"
    return ready
