"""The connection guard's decisions: which connections to cut; peer address keys."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from dataflow.server.guard import GUARD_MS, InboundGuard, normal_address, over_limits
from dataflow.server.peerlog import RateLimitedLog


def test_each_connection_over_its_limit_is_cut() -> None:
    cut = over_limits({3: 101, 4: 100, 5: -20}, limit=100, total_limit=1000)
    assert [fd for fd, _ in cut] == [3]
    assert "holds 101 bytes" in cut[0][1] and "limit 100" in cut[0][1]


def test_beyond_the_total_the_connections_holding_the_most_are_cut() -> None:
    held = {fd: 10 * fd for fd in range(1, 11)}  # 550 bytes in all
    cut = over_limits(held, limit=100, total_limit=300)
    assert [fd for fd, _ in cut] == [10, 9, 8]  # 550 - 100 - 90 - 80 = 280 <= 300
    assert all("all connections hold" in why for _, why in cut)
    assert over_limits(held, limit=100, total_limit=550) == []


def test_connections_cut_for_their_own_limit_count_no_more_toward_the_total() -> None:
    cut = over_limits({1: 500, 2: 60, 3: 50}, limit=100, total_limit=100)
    assert [fd for fd, _ in cut] == [1, 2]


@pytest.mark.parametrize("raw, key", [
    ("10.1.2.3", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("fe80::1", "fe80::1"),
    ("localhost:1000:1000:4242", "uid:1000"),
])
def test_peer_addresses_are_keyed_by_ip_or_local_user(raw, key) -> None:
    assert normal_address(raw) == key


@pytest.mark.timeout(30)
def test_bytes_are_looked_at_once_per_guard_interval_and_a_connection_over_is_cut() -> None:
    """A peer whose message libzmq holds unread is cut at the first look at the bytes, which
    comes at most every GUARD_MS whatever the calls (a clock passed in)."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    client = ctx.socket(zmq.DEALER)
    counters = {"connections_cut": 0}
    guard = InboundGuard(router, 64 * 1024, 8, tcp=True, counters=counters,
                         peer_log=RateLimitedLog(logging.getLogger("test_guard")))
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        t0 = 1000.0
        guard.check(t0)  # looks at the bytes (none yet): the next look is GUARD_MS later
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send(b"\0" * (256 * 1024))  # never received by the application
        deadline = time.monotonic() + 20
        while not len(guard) and time.monotonic() < deadline:
            guard.monitor.poll(1000)
            guard.check(t0)
        assert len(guard) == 1, "the connection was not reported accepted"
        assert router.poll(20_000), "the message did not arrive"
        guard.check(t0 + GUARD_MS / 1000 / 2)
        assert counters["connections_cut"] == 0 and len(guard) == 1
        guard.check(t0 + GUARD_MS / 1000)
        assert counters["connections_cut"] == 1 and len(guard) == 0
    finally:
        guard.close()
        client.close(linger=0)
        router.close(linger=0)
