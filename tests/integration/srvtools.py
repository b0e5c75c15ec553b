"""Helpers for integration tests: a raw protocol client and /proc probes."""

from __future__ import annotations

import os

import zmq

from dataflow import wire


class RawClient:
    """A bare DEALER speaking the wire protocol directly (for protocol-level tests).

    On an INDEX it connects data DEALERs to the readers (as the DataLoader does) and waits for
    their HEARTBEAT answers; :meth:`recv` returns the next message from any of its sockets.
    """

    def __init__(self, endpoint: str) -> None:
        self.sock = self._socket()
        self.sock.connect(endpoint)
        self.data: list[zmq.Socket] = []
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
        if isinstance(msg, wire.Index) and not self.data:
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
        reply = self.call(wire.Stats())
        assert isinstance(reply, wire.StatsReply)
        return dict(reply.counters)

    def close(self) -> None:
        for sock in (self.sock, *self.data):
            sock.close(linger=0)


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
