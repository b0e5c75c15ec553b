"""Helpers for integration tests: a raw protocol client and /proc probes."""

from __future__ import annotations

import os

import zmq

from dataflow import wire


class RawClient:
    """A bare DEALER speaking the wire protocol directly (for protocol-level tests)."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg: wire.Message) -> None:
        self.sock.send_multipart(wire.encode(msg), copy=False)

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout: float = 10.0) -> wire.Message:
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no message within {timeout} s")
        return wire.decode(self.sock.recv_multipart())

    def call(self, msg: wire.Message, timeout: float = 10.0) -> wire.Message:
        self.send(msg)
        return self.recv(timeout)

    def stats(self) -> dict:
        reply = self.call(wire.Stats())
        assert isinstance(reply, wire.StatsReply)
        return dict(reply.counters)

    def close(self) -> None:
        self.sock.close(linger=0)


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
