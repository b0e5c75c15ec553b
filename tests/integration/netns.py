"""Network namespaces for multi-host and network-fault tests (needs root + ``ip``).

* :func:`veth_pair`: two namespaces joined by one veth pair (addresses in 10.199.0.0/16);
* :func:`network`: N "hosts", each a namespace with one link (``eth0``, 10.198.0.<i+1>/24) to a
  bridge inside a dedicated "switch" namespace, so every host reaches every other; a host's
  link can be cut. Each host also gets its own name resolution: ``ip netns exec`` bind-mounts
  ``/etc/netns/<ns>/*`` over ``/etc/*``, so a process started in the host sees a ``hosts`` file
  the test writes (:meth:`Network.set_names`), ``hosts: files`` in ``nsswitch.conf`` (no DNS
  server is ever asked) and ``multi on`` in ``host.conf`` (``getaddrinfo`` returns every
  address of a name). glibc reads the file at every lookup, so a rewrite is seen by the next
  one: the resolver is the test's, for real.

Only the namespaces (and ``/etc/netns/<ns>`` folders) created here are touched: the host's
interfaces never are; everything is deleted on exit.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO

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


_tags = itertools.count()


@dataclass(frozen=True)
class Host:
    """Namespace ``ns`` whose link to the switch is ``eth0`` with address ``ip``."""

    ns: str
    ip: str

    def exec_args(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]


@dataclass(frozen=True)
class Network:
    """Hosts joined by a bridge in namespace ``switch``."""

    switch: str
    hosts: tuple[Host, ...]

    def cut(self, host: Host) -> None:
        """Take ``host``'s link down (packets are lost, nothing is reset)."""
        _ip("-n", host.ns, "link", "set", "eth0", "down")

    def mend(self, host: Host) -> None:
        _ip("-n", host.ns, "link", "set", "eth0", "up")

    def set_names(self, names: dict[str, Sequence[Host]]) -> None:
        """Make each name resolve to its hosts' addresses, in every host (written in place:
        the bind mounts of running processes see the new content)."""
        lines = "".join(f"{h.ip} {name}\n" for name, hosts in names.items() for h in hosts)
        for host in self.hosts:
            with open(f"/etc/netns/{host.ns}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + lines)


@contextmanager
def network(count: int) -> Iterator[Network]:
    """``count`` hosts on one bridge; the namespaces and their files are always deleted."""
    tag = f"{os.getpid() % 100000}-{next(_tags)}"
    net = Network(f"dfw-{tag}", tuple(Host(f"dfh-{tag}-{i}", f"10.198.0.{i + 1}")
                                      for i in range(count)))
    made: list[str] = []
    try:
        for ns in (net.switch, *(h.ns for h in net.hosts)):
            _delete(ns)  # left by a killed earlier run with the same pid
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", net.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", net.switch, "link", "set", "br0", "up")
        for i, host in enumerate(net.hosts):
            etc = f"/etc/netns/{host.ns}"
            os.makedirs(etc, exist_ok=True)
            for name, text in (("hosts", "127.0.0.1 localhost\n"),
                               ("nsswitch.conf", "hosts: files\n"), ("host.conf", "multi on\n")):
                with open(f"{etc}/{name}", "w") as f:
                    f.write(text)
            _ip("link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name",
                f"port{i}", "netns", net.switch)
            _ip("-n", net.switch, "link", "set", f"port{i}", "master", "br0")
            _ip("-n", net.switch, "link", "set", f"port{i}", "up")
            _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")
        yield net
    finally:
        for ns in made:
            _delete(ns)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


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
    with servers_on([Host(pair.server, pair.server_ip)], data, port, extra_args) as endpoints:
        yield endpoints[0]


@contextmanager
def servers_on(hosts: Sequence[Host], data: Sequence[str], port: int,
               extra_args: Sequence[str] = (), env: dict[str, str] | None = None
               ) -> Iterator[list[str]]:
    """A loader server in each host, bound to ``host.ip:port`` (``env`` added to their
    environment), all started at once; yields their endpoints once each printed its ready
    line, stops them on exit."""
    with ExitStack() as stack:
        procs = []
        for host in hosts:
            argv = [sys.executable, "-c", SERVER_BOOTSTRAP, "--data", *data, "--bind",
                    f"tcp://{host.ip}:{port}", "--workers", "1", "--exit-with-parent",
                    *extra_args]
            log = stack.enter_context(tempfile.TemporaryFile("w+"))
            proc = subprocess.Popen(host.exec_args(argv), stdout=subprocess.PIPE, stderr=log,
                                    stdin=subprocess.DEVNULL, text=True,
                                    env={**os.environ, **(env or {})})
            stack.callback(_stop, proc)
            procs.append((host, proc, log))
        yield [_ready(*started) for started in procs]


def _ready(host: Host, proc: subprocess.Popen, log: IO[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the test's timeout
    if '"ready"' not in line:
        proc.wait(10)
        log.seek(0)
        raise RuntimeError(f"server in {host.ns} did not start: {line!r}\n"
                           f"{log.read()[-4000:]}")
    return json.loads(line)["endpoint"]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
