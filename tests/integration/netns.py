"""Two network namespaces joined by a veth pair, for network-fault tests (needs root + ``ip``).

Only the namespaces created here are touched: the host's interfaces never are. Addresses are
in 10.199.0.0/16, inside the namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from dataflow.server.launch import SERVER_BOOTSTRAP


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@dataclass(frozen=True)
class Pair:
    """Namespaces ``server`` and ``client``, joined by veth ``server_dev`` <-> ``client_dev``."""

    server: str
    client: str
    server_dev: str
    client_dev: str
    server_ip: str
    client_ip: str

    def exec_args(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *argv]

    def cut(self) -> None:
        """Take the client's end of the link down (packets are lost, nothing is reset)."""
        _ip("-n", self.client, "link", "set", self.client_dev, "down")

    def mend(self) -> None:
        _ip("-n", self.client, "link", "set", self.client_dev, "up")


@contextmanager
def veth_pair() -> Iterator[Pair]:
    """Make the two namespaces; they are always deleted on exit."""
    tag = f"{os.getpid() % 100000}"
    subnet = os.getpid() % 250 + 1
    pair = Pair(f"dfs-{tag}", f"dfc-{tag}", f"dfs{tag}", f"dfc{tag}",
                f"10.199.{subnet}.1", f"10.199.{subnet}.2")
    made: list[str] = []
    try:
        for ns in (pair.server, pair.client):
            _delete(ns)  # left by a killed earlier run with the same pid
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", pair.server_dev, "netns", pair.server, "type", "veth", "peer", "name",
            pair.client_dev, "netns", pair.client)
        for ns, dev, addr in ((pair.server, pair.server_dev, pair.server_ip),
                              (pair.client, pair.client_dev, pair.client_ip)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield pair
    finally:
        for ns in made:
            _delete(ns)


def _delete(ns: str) -> None:
    """Delete namespace ``ns`` (and the veth end in it) if it exists."""
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@contextmanager
def server_in(pair: Pair, data: Sequence[str], port: int,
              extra_args: Sequence[str] = ()) -> Iterator[str]:
    """A loader server in ``pair.server`` bound to ``pair.server_ip:port``; yields its
    endpoint once it printed its ready line, stops it on exit."""
    bind = f"tcp://{pair.server_ip}:{port}"
    argv = [sys.executable, "-c", SERVER_BOOTSTRAP, "--data", *data, "--bind", bind,
            "--workers", "1", "--exit-with-parent", *extra_args]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(pair.exec_args(pair.server, argv), stdout=subprocess.PIPE,
                                stderr=log, stdin=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded by the test's timeout
            if '"ready"' not in line:
                proc.wait(10)
                log.seek(0)
                raise RuntimeError(f"server in {pair.server} did not start: {line!r}\n"
                                   f"{log.read()[-4000:]}")
            yield json.loads(line)["endpoint"]
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
