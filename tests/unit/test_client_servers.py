"""One server's liveness as the client sees it: the pure rules of client/servers.py (fake
clock), without the scheduler around them."""

from __future__ import annotations

import pytest

from dataflow.client.servers import (
    CONTROL,
    ServerRecord,
    State,
    Transition,
    deadline,
    join_backoff,
    transition,
)

RULES = dict(silent_s=3.0, grace=5.0, timeout=10.0)


def _up(now: float = 0.0) -> ServerRecord:
    s = ServerRecord("tcp://a:1", state=State.UP, since=now, heard=now)
    s.next_heartbeat = now + 1.0
    return s


def test_the_join_backoff_doubles_from_one_second_up_to_thirty() -> None:
    assert [join_backoff(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert join_backoff(10**6) == 30.0  # no overflow after a very long outage


def test_a_heartbeat_is_due_every_interval_to_a_joined_server_only() -> None:
    s = _up()
    assert not s.heartbeat_due(0.5, 1.0)
    assert s.heartbeat_due(1.0, 1.0) and s.unanswered == 1.0 and s.next_heartbeat == 2.0
    assert s.heartbeat_due(2.0, 1.0) and s.unanswered == 1.0  # the oldest unanswered one
    s.heard_from(2.5)
    assert s.unanswered is None and s.heard == 2.5
    for state in (State.DOWN, State.JOINING, State.GONE):
        s.enter(state, 3.0)
        assert not s.heartbeat_due(100.0, 1.0)


def test_hello_is_due_once_the_control_connection_is_up_and_the_backoff_passed() -> None:
    s = ServerRecord("tcp://a:1", state=State.DOWN, down_links={CONTROL, 0, 1})
    assert not s.hello_due(0.0)  # not connected
    s.link(CONTROL, True, now=1.0)
    assert s.next_hello == 1.0 and s.link_up == 1.0
    s.next_hello = 5.0
    assert not s.hello_due(4.9)
    assert s.hello_due(5.0) and s.state is State.JOINING and s.since == 5.0
    assert s.down_links == set()  # its readers are connected anew
    assert not s.hello_due(6.0)  # one HELLO per join


def test_a_connection_down_breaks_a_server_and_a_joining_one_is_noted_disconnected() -> None:
    s = _up()
    s.link(0, False, now=1.0)
    assert s.down_links == {0} and s.broken
    joining = ServerRecord("tcp://a:1", state=State.JOINING, note="HELLO sent")
    joining.link(CONTROL, False, now=1.0)
    assert joining.note == "disconnected"


@pytest.mark.parametrize("breakage", ["link", "broken", "silent"])
def test_an_up_server_is_suspected_when_a_connection_broke_or_it_is_silent(
        breakage: str) -> None:
    s = _up()
    assert transition(s, 1.0, **RULES) is None
    if breakage == "link":
        s.down_links.add(CONTROL)
    elif breakage == "broken":
        s.broken = True
    else:
        s.unanswered = 1.0
        assert transition(s, 4.0, **RULES) is None  # unanswered for 3.0 s only
    assert transition(s, 4.1, **RULES) is Transition.SUSPECTED


def test_a_suspect_server_recovers_when_connected_and_heard_from_since_else_is_lost() -> None:
    s = _up()
    s.enter(State.SUSPECT, 1.0)
    s.link_up = 2.0
    assert transition(s, 2.0, **RULES) is None  # not heard from since it came back
    s.heard_from(2.5)
    assert transition(s, 2.5, **RULES) is Transition.RECOVERED
    s.down_links.add(0)
    assert transition(s, 6.0, **RULES) is None
    assert transition(s, 6.1, **RULES) is Transition.LOST  # suspect for longer than grace


def test_a_join_that_takes_longer_than_the_timeout_expires() -> None:
    s = ServerRecord("tcp://a:1", state=State.JOINING, since=1.0)
    assert transition(s, 11.0, **RULES) is None
    assert transition(s, 11.1, **RULES) is Transition.JOIN_EXPIRED
    for state in (State.DOWN, State.GONE):
        s.enter(state, 0.0)
        assert transition(s, 1e9, **RULES) is None


def test_the_deadline_is_the_soonest_rule_due() -> None:
    s = _up()
    assert deadline(s, 0.5, **RULES) == pytest.approx(0.5)  # the next heartbeat
    s.next_heartbeat, s.unanswered = 10.0, 1.0
    assert deadline(s, 2.0, **RULES) == pytest.approx(2.0)  # silent at 4.0
    s.enter(State.SUSPECT, 3.0)
    assert deadline(s, 4.0, **RULES) == pytest.approx(4.0)  # lost at 8.0
    s.enter(State.JOINING, 5.0)
    assert deadline(s, 6.0, **RULES) == pytest.approx(9.0)  # expires at 15.0
    s.enter(State.DOWN, 7.0)
    s.next_hello = 8.0
    assert deadline(s, 7.0, **RULES) == pytest.approx(1.0)
    s.down_links.add(CONTROL)  # not connected: nothing is due until its connection is
    assert deadline(s, 7.0, **RULES) == float("inf")


def test_describe_says_the_state_the_join_under_way_and_the_last_failure() -> None:
    s = ServerRecord("tcp://a:1", state=State.DOWN, note="not connected")
    assert s.describe() == "down (not connected)"
    s.failure, s.note = "busy: full", ""
    assert s.describe() == "down (busy: full)"
    s.enter(State.JOINING, 0.0)
    s.note = "HELLO sent, no answer yet"
    assert s.describe() == "joining (HELLO sent, no answer yet; last try: busy: full)"
    assert _up().describe() == "up"
