"""The attacks of a shared network on a server (issue 16), each against real server processes on
loopback: the server lives, its memory stays within the formula for its flags (docs/architecture.md,
Memory), it counts what it refused or cut, and a DataLoader gets an exact epoch during or after
the attack.

Attackers come from other loopback addresses (127.0.0.2, ...) than the DataLoader (127.0.0.1),
as they would from other hosts: the caps per peer address tell them apart.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch
import zmq
from srvtools import (
    RawClient,
    peak_rss_bytes,
    pid_alive,
    reset_peak_rss,
    rss_bytes,
    wait_for,
    zmtp_connect,
    zmtp_frame,
)

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.demo import DemoResult, DemoSpec, make_demo
from dataflow.server import ServerHandle

MiB = 1024 * 1024
SLACK = 40 * MiB  # Python heap and allocator noise of a process serving for a while
EMPTY = zmtp_frame(b"", more=False)
PING = b"\x04\x07\x04PING\x00\x00"  # a ZMTP 3.1 PING command with a TTL of 0


@pytest.fixture(scope="module")
def big_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """4 Arrow shards of ~200 samples of 3x64x64 images: a batch of 100 is ~1.3 MB."""
    return make_demo(str(tmp_path_factory.mktemp("big-demo")),
                     DemoSpec(fmt="arrow", shards=4, samples_per_shard=200, uneven=False,
                              image_shape=(3, 64, 64)), progress=None)


def _epoch_ids(endpoint: str, batch_size: int = 16) -> list[int]:
    with DataLoader(endpoint, batch_size=batch_size, rank=0, world_size=1, timeout=30) as dl:
        return sorted(torch.cat([b["id"] for b in dl]).tolist())


def _stats(endpoint: str) -> dict:
    """STATS through a fresh session (one kept open could be freed by short timeouts)."""
    probe = RawClient(endpoint)
    try:
        return probe.stats()
    finally:
        probe.send(wire.Bye())
        probe.close()


def _pids(server: ServerHandle) -> list[int]:
    return [server.pid, *server.ready["worker_pids"]]


def _warm(server: ServerHandle, pids: list[int]) -> dict[int, int]:
    """Serve one epoch (readers import pyarrow and map the shards on their first read), then
    the RSS of each of ``pids``, whose peaks are reset: what an attack may add is measured
    from there."""
    _epoch_ids(server.endpoint)
    before = {pid: rss_bytes(pid) for pid in pids}
    for pid in pids:
        reset_peak_rss(pid)
    return before


def _from(address: str, endpoint: str) -> str:
    """``endpoint`` reached from local address ``address`` (ZeroMQ's source syntax)."""
    return f"tcp://{address}:0;{endpoint.removeprefix('tcp://')}"


def _flood_then_reset(endpoint: str, connections: int, messages: int) -> None:
    """Stock DEALERs (with ZMTP heartbeats, like the DataLoader's) each send a flood of empty
    messages, then close without lingering: the issue's reproduction."""
    ctx = zmq.Context.instance()
    socks = []
    for _ in range(connections):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 100)
        sock.connect(endpoint)
        socks.append(sock)
    for sock in socks:
        for _ in range(messages):
            sock.send(b"")
    time.sleep(0.5)
    for sock in socks:
        sock.close(linger=0)


def _pings_then_reset(endpoint: str, connections: int, units: int) -> None:
    """Raw peers whose floods carry ZMTP PINGs, reset (RST) while the server still has their
    input queued: libzmq 4.3.5 aborts answering such a PING when its inbound queue was full."""
    socks = [zmtp_connect(endpoint) for _ in range(connections)]
    payload = (EMPTY * 8 + PING) * units
    for sock in socks:
        sock.settimeout(2)
        try:
            sock.sendall(payload)
        except TimeoutError:
            pass  # the server reads slower than this sends: its queue is full, as wanted
    time.sleep(0.3)
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["frontend", "reader"])
def test_floods_reset_with_pings_queued_never_abort_a_server(target, demo_data,
                                                              servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    endpoint = server.endpoint if target == "frontend" else server.ready["data_endpoints"][0]
    for _ in range(2):
        _flood_then_reset(endpoint, connections=20, messages=20_000)
        _pings_then_reset(endpoint, connections=10, units=20_000)
        time.sleep(1.5)  # the abort came ~1 s after the reset
        assert all(pid_alive(pid) for pid in _pids(server)), server.stderr_tail(2000)
    assert _epoch_ids(server.endpoint) == list(range(demo.total))
    stats = _stats(server.endpoint)
    assert stats["worker_restarts"] == 0
    if target == "frontend":  # what it read before a connection closed, it answered
        assert stats["malformed"] > 0


OLD_GREETINGS = {
    # ZMTP 1.0: a length-prefixed empty identity, then a message frame "hi".
    "zmtp1": b"\x01\x00" + b"\x03\x00hi",
    # ZMTP 2.0: signature, revision 1, socket type DEALER, empty identity, a final frame "hi".
    "zmtp2": b"\xff" + b"\0" * 8 + b"\x7f\x01\x05" + b"\x00\x00" + b"\x00\x02hi",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", ["frontend", "reader"])
def test_peers_speaking_zmtp_1_or_2_are_refused_not_fatal(target, demo_data, servers) -> None:
    """libzmq attaches no metadata (file descriptor, peer address) to the messages of a ZMTP
    1.0 or 2.0 peer: reading them used to raise in the frontend's and the readers' loops."""
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    endpoint = server.endpoint if target == "frontend" else server.ready["data_endpoints"][0]
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    for _ in range(3):
        for greeting in OLD_GREETINGS.values():
            with socket.create_connection((host, int(port)), 10) as peer:
                peer.sendall(greeting * 50)
                time.sleep(0.2)
    assert all(pid_alive(pid) for pid in _pids(server)), server.stderr_tail(2000)
    assert _epoch_ids(server.endpoint) == list(range(demo.total))
    stats = _stats(server.endpoint)
    assert stats["worker_restarts"] == 0
    if target == "frontend":
        assert stats["malformed"] > 0
    wait_for(lambda: "accepts ZMTP 3.0 or later only" in server.stderr_tail(20_000), 10,
             "the refusal in the log")


@pytest.mark.timeout(60)
def test_requests_repeating_whole_shards_are_refused_naming_the_ranges(demo_data, servers,
                                                                       raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    attacker = raw_client(_from("127.0.0.2", server.endpoint))
    assert isinstance(attacker.call(wire.Hello(64, "repeats")), wire.Index)
    whole = np.tile(np.array([[0, 0, demo.sizes[0]]], dtype=np.int64), (145, 1))  # 3.5 KB
    for req_id in range(48):
        attacker.send(wire.Request(req_id, whole))
    refusals = [attacker.recv() for _ in range(48)]
    named = (f"ranges 0 [0, {demo.sizes[0]}) and 1 [0, {demo.sizes[0]}) of shard "
             f"{os.path.basename(demo.paths[0])} overlap")
    assert all(isinstance(r, wire.ErrorMsg) and r.kind is wire.ErrorKind.PROTOCOL
               and named in r.message for r in refusals), refusals[0]
    assert _epoch_ids(server.endpoint) == list(range(demo.total))
    stats = _stats(server.endpoint)
    assert stats["refused"] == 48 and stats["requests"] > 0
    # The DataLoader's epoch and its read-ahead (up to a whole next epoch of this small one:
    # 4 requests of up to 8 batches of 16); the attacker's 48 x 8,700 samples: none.
    assert demo.total <= stats["samples_sent"] <= 2 * demo.total


class Hoarder:
    """Sessions from ``address`` whose data connections never read, but stay open: each asks,
    on a thread, for batches of ``batch`` distinct samples as fast as its credits come back,
    until :meth:`stop`; :meth:`close` closes its connections."""

    def __init__(self, endpoint: str, data: list[str], address: str, sessions: int,
                 batch: int) -> None:
        self._batch = batch
        self._stop = threading.Event()
        self._clients: list[RawClient] = []
        self._raw: list[socket.socket] = []
        for k in range(sessions):
            c = RawClient(_from(address, endpoint), routing_id=b"hoarder-%d" % k)
            self._clients.append(c)
            c.send(wire.Hello(4, "hoarder", batch_size=batch))
            index = wire.decode(c.sock.recv_multipart())
            assert isinstance(index, wire.Index), index
            for ep in data:  # raw data connections: nothing they are sent is ever read
                sock = zmtp_connect(ep, identity=index.session.encode(), source=address)
                sock.sendall(zmtp_frame(bytes(wire.encode(wire.Heartbeat())[0]), more=False))
                self._raw.append(sock)
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        req_id = 0
        while not self._stop.is_set():
            for c in self._clients:
                c.send(wire.Request(req_id, ((req_id % 4, 0, self._batch),)))
                req_id += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def close(self) -> None:
        self.stop()
        for c in self._clients:
            c.close()
        for sock in self._raw:
            sock.close()


@pytest.mark.timeout(120)
def test_replies_a_client_never_reads_stay_within_the_unsent_bytes(big_demo, servers) -> None:
    workers, queue, reply = 2, 2, 2 * MiB
    unsent = 4 * MiB
    server = servers([str(p) for p in big_demo.paths], workers=workers,
                     extra_args=["--max-unsent-bytes", str(unsent), "--max-sessions", "8",
                                 "--max-sessions-per-address", "2", "--max-credits", "4",
                                 "--max-reply-bytes", str(reply), "--worker-queue", str(queue),
                                 "--client-ttl", "1"])
    readers = server.ready["worker_pids"]
    before = _warm(server, readers)
    hoarder = Hoarder(server.endpoint, server.ready["data_endpoints"], "127.0.0.2",
                      sessions=2, batch=100)
    peak_unsent = 0
    try:
        wait_for(lambda: _stats(server.endpoint)["unsent_bytes"] >= unsent // 4, 30,
                 "the attacker's replies to pile up unread")
        ids = _epoch_ids(server.endpoint)
        for _ in range(10):
            peak_unsent = max(peak_unsent, _stats(server.endpoint)["unsent_bytes"])
            time.sleep(0.1)
        hoarder.stop()
        stopped = time.monotonic()
        # Its connections stay open, unread: the kernel closes them (TCP_USER_TIMEOUT,
        # max(--client-ttl, 10) s, checked at zero-window probes that back off) and ZeroMQ
        # lets go of what it queued for them.
        wait_for(lambda: _stats(server.endpoint)["unsent_bytes"] == 0, 60,
                 "the unread replies to be dropped with their connections")
        print(f"unread replies dropped {time.monotonic() - stopped:.1f} s after the last "
              "request")
    finally:
        hoarder.close()
    assert ids == list(range(big_demo.total))
    bound = unsent + workers * queue * reply
    assert peak_unsent <= bound, peak_unsent
    growth = sum(peak_rss_bytes(pid) - before[pid] for pid in readers)
    print(f"readers' RSS growth {growth / MiB:.1f} MiB; unsent peak {peak_unsent / MiB:.1f} "
          f"MiB (bound {bound / MiB:.0f} MiB)")
    assert growth <= unsent + workers * (queue + 1) * reply + workers * SLACK, growth


@pytest.mark.timeout(60)
def test_requests_of_a_session_without_data_connection_are_never_read(demo_data,
                                                                      servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths],
                     extra_args=["--session-start-timeout", "3", "--client-ttl", "1",
                                 "--session-idle-timeout", "4"])
    ctx = zmq.Context.instance()
    blind = ctx.socket(zmq.DEALER)  # HELLO and requests, never a data connection
    blind.setsockopt(zmq.LINGER, 0)
    blind.connect(_from("127.0.0.2", server.endpoint))
    idle = RawClient(_from("127.0.0.3", server.endpoint))  # attaches, never requests
    try:
        blind.send_multipart(wire.encode(wire.Hello(4, "blind")))
        assert blind.poll(10_000) and isinstance(wire.decode(blind.recv_multipart()), wire.Index)
        for req_id in range(8):
            blind.send_multipart(wire.encode(wire.Request(req_id, ((req_id % 7, 0, 4),))))
        wait_for(lambda: _stats(server.endpoint)["requests"] == 8, 10, "the requests admitted")
        stats = _stats(server.endpoint)
        assert (stats["queued"], stats["in_flight"], stats["samples_sent"]) == (8, 0, 0)
        assert isinstance(idle.call(wire.Hello(4, "idle")), wire.Index)
        assert _epoch_ids(server.endpoint) == list(range(demo.total))
        assert blind.poll(10_000)
        told = wire.decode(blind.recv_multipart())
        while isinstance(told, wire.Heartbeat):  # probes of a silent connection
            assert blind.poll(10_000)
            told = wire.decode(blind.recv_multipart())
        assert isinstance(told, wire.ErrorMsg) and told.kind is wire.ErrorKind.UNKNOWN_CLIENT
        assert "no data connection to a reader within 3.0 s" in told.message
        idle.send(wire.Heartbeat())
        told = idle.recv(timeout=10)
        while isinstance(told, wire.Heartbeat):
            idle.send(wire.Heartbeat())  # alive, but asks for nothing
            told = idle.recv(timeout=10)
        assert isinstance(told, wire.ErrorMsg) and "no REQUEST within 4.0 s" in told.message
    finally:
        blind.close(linger=0)
        idle.close()
    stats = _stats(server.endpoint)
    assert stats["sessions_unattached_expired"] == 1 and stats["sessions_unused_expired"] == 1
    assert stats["requests"] >= 8 and stats["queued"] == 0


@pytest.mark.timeout(60)
def test_one_peer_cannot_hold_every_session(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths],
                     extra_args=["--max-sessions", "6", "--max-sessions-per-address", "2",
                                 "--session-start-timeout", "2"])
    ctx = zmq.Context.instance()
    socks = []
    try:
        for k in range(6):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(_from("127.0.0.2", server.endpoint))
            sock.send_multipart(wire.encode(wire.Hello(4, f"squatter {k}")))
            socks.append(sock)
        replies = []
        for sock in socks:
            assert sock.poll(10_000)
            replies.append(wire.decode(sock.recv_multipart()))
        busy = [r for r in replies if isinstance(r, wire.ErrorMsg)]
        assert sum(isinstance(r, wire.Index) for r in replies) == 2 and len(busy) == 4
        assert all(r.kind is wire.ErrorKind.SERVER_BUSY and "--max-sessions-per-address"
                   in r.message for r in busy)
        assert _epoch_ids(server.endpoint) == list(range(demo.total))
        wait_for(lambda: _stats(server.endpoint)["sessions_unattached_expired"] == 2, 20,
                 "the squatters' sessions to expire")
    finally:
        for sock in socks:
            sock.close(linger=0)
    assert _stats(server.endpoint)["address_sessions_refused"] == 4


@pytest.mark.timeout(120)
def test_fresh_routing_ids_buy_no_more_than_one_address_may_hold(big_demo, servers) -> None:
    workers, queue, reply, unsent = 2, 2, 2 * MiB, 4 * MiB
    server = servers([str(p) for p in big_demo.paths], workers=workers,
                     extra_args=["--max-credits", "4", "--max-sessions-per-address", "2",
                                 "--max-sessions", "8", "--max-unsent-bytes", str(unsent),
                                 "--max-reply-bytes", str(reply)])
    pids = _pids(server)
    before = _warm(server, pids)
    admitted = 0
    for k in range(60):  # HELLO -> requests -> BYE, a new connection each time
        c = RawClient(_from("127.0.0.2", server.endpoint), routing_id=b"churn-%d" % k)
        try:
            assert isinstance(c.call(wire.Hello(4, "churn", batch_size=100)), wire.Index)
            for req_id in range(8):
                c.send(wire.Request(req_id, ((req_id % 4, 0, 100),)))
            time.sleep(0.05)  # long enough for readers to take its requests
            c.send(wire.Bye())
            admitted += 8
        finally:
            c.close()
    assert _epoch_ids(server.endpoint) == list(range(big_demo.total))
    stats = _stats(server.endpoint)
    growth = {pid: peak_rss_bytes(pid) - before[pid] for pid in pids}
    print(f"churn: {stats['requests']} requests admitted, {stats['refused']} refused, "
          f"{stats['samples_sent']} samples sent; RSS "
          f"growth (MiB) {[round(g / MiB, 1) for g in growth.values()]}")
    readers = sum(growth[pid] for pid in pids[1:])
    assert readers <= unsent + workers * (queue + 1) * reply + workers * SLACK, growth
    assert growth[server.pid] <= SLACK, growth
    wait_for(lambda: _stats(server.endpoint)["unsent_bytes"] == 0, 30,
             "the churned sessions' replies to be dropped")


@pytest.mark.timeout(120)
def test_unfinished_messages_on_many_connections_stay_within_the_inbound_total(
        demo_data, servers) -> None:
    demo = demo_data("arrow")
    limit, total = 4 * MiB, 8 * MiB
    server = servers([str(p) for p in demo.paths],
                     extra_args=["--max-inbound-bytes", str(limit),
                                 "--max-inbound-total", str(total)])
    before = _warm(server, [server.pid])[server.pid]
    chunk = zmtp_frame(b"\0" * (64 * 1024), more=True)
    per_connection = limit - 64 * 1024  # each under its own limit
    socks, cut = [], 0
    for k in range(120):  # 4 addresses x 30 connections: ~470 MiB unfinished in all
        sock = zmtp_connect(server.endpoint, source=f"127.0.0.{2 + k % 4}")
        socks.append(sock)
        try:
            for _ in range(per_connection // len(chunk)):
                sock.sendall(chunk)
        except OSError:
            cut += 1
    time.sleep(0.5)
    growth = peak_rss_bytes(server.pid) - before
    for sock in socks:
        sock.close()
    stats = _stats(server.endpoint)
    print(f"{len(socks)} connections, {stats['connections_cut']} cut; frontend RSS growth "
          f"{growth / MiB:.1f} MiB")
    assert stats["connections_cut"] >= 100
    assert growth <= total + 3 * SLACK, growth  # plus what arrived within one 20 ms check
    assert _epoch_ids(server.endpoint) == list(range(demo.total))


@pytest.mark.timeout(60)
def test_stats_asked_without_reading_the_replies_are_refused_not_queued(demo_data,
                                                                        servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    before = _warm(server, [server.pid])[server.pid]
    peer = zmtp_connect(server.endpoint, source="127.0.0.2")
    try:
        hello, stats = (b"".join(zmtp_frame(bytes(f), more=i < len(frames) - 1)
                                 for i, f in enumerate(frames))
                        for frames in (wire.encode(wire.Hello(1, "nosy")),
                                       wire.encode(wire.Stats())))
        peer.sendall(hello + stats * 10_000)  # and never reads a reply
        wait_for(lambda: _stats(server.endpoint)["refused"] > 0, 30,
                 "STATS refused once a reply waits unwritten")
    finally:
        peer.close()
    growth = peak_rss_bytes(server.pid) - before
    print(f"frontend RSS growth {growth / MiB:.1f} MiB")
    assert growth <= SLACK, growth
    assert _epoch_ids(server.endpoint) == list(range(demo.total))


@pytest.mark.timeout(120)
def test_stats_asked_one_at_a_time_are_always_answered(demo_data, servers, raw_client) -> None:
    """A client that reads each reply before it asks again is never refused, however late
    pyzmq's release thread learns that its replies were written (a busy frontend: a flood)."""
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    flood = threading.Thread(target=_flood_then_reset, args=(server.endpoint, 4, 20_000))
    flood.start()
    probe = raw_client(server.endpoint)
    try:
        replies = [probe.stats() for _ in range(300)]  # each asserts a StatsReply
    finally:
        flood.join()
    assert len(replies) == 300
    assert _stats(server.endpoint)["refused"] == 0


@pytest.mark.timeout(60)
def test_on_ipc_a_local_user_is_one_peer_address(tmp_path, demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], bind=f"ipc://{tmp_path}/server.sock",
                     extra_args=["--max-sessions-per-address", "2"])
    first = RawClient(server.endpoint)
    try:
        assert isinstance(first.call(wire.Hello(1, "first")), wire.Index)
        assert _epoch_ids(server.endpoint) == list(range(demo.total))  # the second session
        second = RawClient(server.endpoint)
        try:
            with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1,
                            timeout=30) as dl:
                busy = second.call(wire.Hello(1, "third"))
                assert len(dl) > 0
        finally:
            second.close()
        assert isinstance(busy, wire.ErrorMsg) and busy.kind is wire.ErrorKind.SERVER_BUSY
        assert "--max-sessions-per-address" in busy.message
    finally:
        first.close()
