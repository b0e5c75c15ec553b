"""A reader's replies whose client's data connection is missing: they wait in order, per
connection, a bounded number for a bounded time (a pure decision on a fake clock)."""

from __future__ import annotations

from dataflow.server.sender import Unrouted, Waiting
from dataflow.wire.internal import Sent


def _sent(token: bytes, req_id: int) -> Sent:
    return Sent(token, req_id, 100 + req_id)


class Connections:
    """Which tokens have a data connection; records what was handed over, in order."""

    def __init__(self) -> None:
        self.up: set[bytes] = set()
        self.handed: list[tuple[bytes, int]] = []

    def hand(self, w: Waiting) -> bool:
        if w.sent.token not in self.up:
            return False
        self.handed.append((w.sent.token, w.sent.req_id))
        return True


def test_replies_wait_in_order_and_go_once_their_connection_is_up() -> None:
    unrouted, conns = Unrouted(cap=8, wait_s=5.0), Connections()
    for req_id in range(3):
        assert unrouted.add(_sent(b"a", req_id), [b"x"], now=0.0) == []
    unrouted.add(_sent(b"b", 0), [b"x"], now=0.0)
    assert b"a" in unrouted and b"b" in unrouted and b"c" not in unrouted
    assert unrouted.retry(conns.hand, now=1.0) == [] and conns.handed == []
    conns.up.add(b"b")
    assert unrouted.retry(conns.hand, now=2.0) == []
    assert conns.handed == [(b"b", 0)] and b"b" not in unrouted and b"a" in unrouted
    conns.up.add(b"a")
    assert unrouted.retry(conns.hand, now=3.0) == []
    assert conns.handed[1:] == [(b"a", 0), (b"a", 1), (b"a", 2)] and not unrouted


def test_beyond_the_cap_the_oldest_of_that_connection_is_dropped() -> None:
    unrouted = Unrouted(cap=2, wait_s=5.0)
    unrouted.add(_sent(b"other", 9), [b"x"], now=0.0)
    assert unrouted.add(_sent(b"a", 0), [b"x"], now=0.0) == []
    assert unrouted.add(_sent(b"a", 1), [b"x"], now=0.0) == []
    dropped = unrouted.add(_sent(b"a", 2), [b"x"], now=0.0)
    assert [(s.req_id, s.nbytes) for s, _ in dropped] == [(0, 100)]
    assert "more than 2 replies were waiting" in dropped[0][1]
    conns = Connections()
    conns.up.update((b"a", b"other"))
    unrouted.retry(conns.hand, now=1.0)
    assert sorted(conns.handed) == [(b"a", 1), (b"a", 2), (b"other", 9)]


def test_a_reply_past_its_deadline_is_dropped_and_the_next_ones_keep_theirs() -> None:
    unrouted, conns = Unrouted(cap=8, wait_s=5.0), Connections()
    unrouted.add(_sent(b"a", 0), [b"x"], now=0.0)
    unrouted.add(_sent(b"a", 1), [b"x"], now=3.0)
    assert unrouted.retry(conns.hand, now=5.0) == []  # not past its deadline yet
    dropped = unrouted.retry(conns.hand, now=5.5)
    assert [s.req_id for s, _ in dropped] == [0] and "missing for 5.0 s" in dropped[0][1]
    assert b"a" in unrouted
    assert [s.req_id for s, _ in unrouted.retry(conns.hand, now=8.5)] == [1]
    assert not unrouted and conns.handed == []
