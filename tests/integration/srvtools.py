"""Helpers for integration tests: a raw protocol client, /proc probes, a /metrics scrape, raw
ZMTP (:func:`zmtp_connect`, :func:`zmtp_frame`, from :mod:`dataflow.bench.fuzz.zmtp`), fixed
ports (:func:`free_ports`) and a TCP port forwarder (:class:`Forwarder`)."""

from __future__ import annotations

import os
import random
import selectors
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zmq
from prometheus_client.parser import text_string_to_metric_families

from dataflow import wire
from dataflow.bench.fuzz.zmtp import zmtp_connect as zmtp_connect
from dataflow.bench.fuzz.zmtp import zmtp_frame as zmtp_frame


class RawClient:
    """A bare DEALER speaking the wire protocol directly (for protocol-level tests).

    On an INDEX it connects data DEALERs to the readers (as the DataLoader does) and waits for
    their HEARTBEAT answers; :meth:`recv` returns the next message from any of its sockets.
    :meth:`stats` opens a session first when it has none (the server answers STATS only to
    sessions).
    """

    def __init__(self, endpoint: str, routing_id: bytes | None = None) -> None:
        self.sock = self._socket()
        if routing_id is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.connect(endpoint)
        self.data: list[zmq.Socket] = []
        self.session: str | None = None
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    @staticmethod
    def _socket() -> zmq.Socket:
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def send(self, msg: wire.Message) -> None:
        self.sock.send_multipart(wire.encode(msg), copy=False)

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout: float = 10.0) -> wire.Message:
        events = dict(self.poller.poll(int(timeout * 1000)))
        if not events:
            raise TimeoutError(f"no message within {timeout} s")
        msg = wire.decode(next(iter(events)).recv_multipart())
        if isinstance(msg, wire.Index):
            self.session = msg.session
            if not self.data:
                self._attach(msg, timeout)
        return msg

    def _attach(self, index: wire.Index, timeout: float) -> None:
        for endpoint in index.data:
            sock = self._socket()
            sock.setsockopt(zmq.ROUTING_ID, index.session.encode())
            sock.connect(endpoint)
            sock.send_multipart(wire.encode(wire.Heartbeat()))
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError(f"reader {endpoint} did not answer HEARTBEAT")
            assert isinstance(wire.decode(sock.recv_multipart()), wire.Heartbeat)
            self.data.append(sock)
            self.poller.register(sock, zmq.POLLIN)

    def call(self, msg: wire.Message, timeout: float = 10.0) -> wire.Message:
        self.send(msg)
        return self.recv(timeout)

    def stats(self) -> dict:
        if self.session is None:
            assert isinstance(self.call(wire.Hello(1, "stats probe")), wire.Index)
        reply = self.call(wire.Stats())
        assert isinstance(reply, wire.StatsReply), reply
        return dict(reply.counters)

    def close(self) -> None:
        for sock in (self.sock, *self.data):
            sock.close(linger=0)


T = TypeVar("T")


def server_stat(endpoint: str, key: str) -> int:
    """One STATS counter of the server at ``endpoint``, asked by a probe session of its own."""
    probe = RawClient(endpoint)
    try:
        return int(probe.stats()[key])
    finally:
        probe.close()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (reads /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc/<pid>/status (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def repo_env(extra_path: str) -> dict[str, str]:
    """Environment adding ``extra_path`` to PYTHONPATH (for transform modules)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (extra_path, os.environ.get("PYTHONPATH"))
                                          if p)}


def reset_peak_rss(pid: int) -> None:
    """Reset ``pid``'s peak RSS (VmHWM) to its current RSS (/proc/<pid>/clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of ``pid`` since start or :func:`reset_peak_rss` (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_ranks(world: int, body: Callable[[int], T], timeout: float) -> list[T]:
    """Run ``body(rank)`` for every rank of a job in threads; results in rank order. The first
    error raised by a rank is raised here; a rank still running after ``timeout`` fails."""
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    return [results[r] for r in range(world)]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:PORT/metrics``, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def ragged_rows(batch: Mapping[str, np.ndarray], name: str) -> list[np.ndarray]:
    """Each sample's values of ragged field ``name`` of a DataLoader batch (as numpy)."""
    offs = batch[name + ".offsets"]
    return [batch[name][offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]


FIXED_PORTS = (20000, 32000)  # below the kernel's ephemeral range: no outgoing connection's


def free_ports(n: int, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive TCP ports free on ``host``, outside the ephemeral range
    (so only an explicit bind can take one before the test uses them)."""
    rng = random.Random()
    for _ in range(100):
        first = rng.randrange(FIXED_PORTS[0], FIXED_PORTS[1] - n)
        held: list[socket.socket] = []
        try:
            for port in range(first, first + n):
                sock = socket.socket()
                held.append(sock)
                sock.bind((host, port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError(f"no {n} consecutive free ports in {FIXED_PORTS}")


class Forwarder:
    """Forwards every TCP connection made to ``listen`` to ``target``, bytes both ways, as a
    container engine's published port (``docker run -p``) does; one thread. The port it listens
    on is :attr:`port`; :meth:`close` ends every connection (idempotent)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int],
                 family: socket.AddressFamily = socket.AF_INET) -> None:
        self._target = target
        self._listener = socket.create_server(listen, family=family)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                sock = key.fileobj
                if sock is self._wake_r:
                    return
                if sock is self._listener:
                    inbound, _ = self._listener.accept()
                    try:
                        outbound = socket.create_connection(self._target, timeout=10)
                    except OSError:
                        inbound.close()
                        continue
                    for a, b in ((inbound, outbound), (outbound, inbound)):
                        self._peers[a] = b
                        self._sel.register(a, selectors.EVENT_READ)
                    continue
                assert isinstance(sock, socket.socket)
                if sock not in self._peers:  # dropped with its peer earlier in this select
                    continue
                try:
                    data = sock.recv(65536)
                    if data:
                        self._peers[sock].sendall(data)
                        continue
                except OSError:
                    pass
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock)
        self._peers.pop(peer, None)
        for s in (sock, peer):
            self._sel.unregister(s)
            s.close()

    def close(self) -> None:
        if self._wake_w.fileno() < 0:
            return
        self._wake_w.send(b"x")
        self._thread.join(10)
        for sock in list(self._peers):
            if sock in self._peers:
                self._drop(sock)
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_damaged_parquet(path: str) -> None:
    """A Parquet file of 60 rows ``x == row`` (int64) in row groups of 10 whose row group 2
    (rows 20-29) fails its page checksum: one value flipped after writing."""
    pq.write_table(pa.table({"x": np.arange(60, dtype=np.int64)}), path, row_group_size=10,
                   compression="none", use_dictionary=False, write_page_checksum=True)
    col = pq.ParquetFile(path).metadata.row_group(2).column(0)
    with open(path, "r+b") as f:
        f.seek(col.data_page_offset + col.total_compressed_size - 8)
        f.write(b"\x63")
