"""The connection guard's decisions: which connections to cut; peer address keys."""

from __future__ import annotations

import pytest

from dataflow.server.guard import normal_address, over_limits


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
