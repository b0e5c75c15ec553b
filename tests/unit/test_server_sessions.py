"""When a session is freed or probed (a pure decision on a fake clock), and sessions per
peer address."""

from __future__ import annotations

import pytest

from dataflow.server.sessions import Expiry, Session, Sessions, Timeouts

TTL, IDLE, START = 10.0, 300.0, 30.0
TIMEOUTS = Timeouts(TTL, IDLE, START)


def _session(*, opened: float = 0.0, last_seen: float = 0.0, attached: bool = True,
             requested: bool = True, probed: float = float("-inf")) -> Session:
    return Session(b"id", "c", 4, last_seen, opened=opened, attached=attached,
                   requested=requested, probed=probed)


def _due(s: Session, now: float) -> Expiry | None:
    return TIMEOUTS.due(s, now)


@pytest.mark.parametrize("kwargs, now, due", [
    ({}, 5.0, None),
    ({"last_seen": 100.0}, 100.0 + IDLE + 1, Expiry.IDLE),
    ({"attached": False, "last_seen": 29.0}, 29.0, None),
    ({"attached": False, "last_seen": 30.5}, 30.5, Expiry.UNATTACHED),
    ({"requested": False, "last_seen": 299.0}, 299.0, None),
    ({"requested": False, "last_seen": 301.0}, 301.0, Expiry.UNUSED),
    ({"last_seen": 100.0}, 111.0, Expiry.PROBE),
    ({"last_seen": 100.0, "probed": 105.0}, 111.0, None),
    ({"last_seen": 100.0, "probed": 105.0}, 116.0, Expiry.PROBE),
])
def test_expiry(kwargs, now, due) -> None:
    assert _due(_session(**kwargs), now) is due


@pytest.mark.parametrize("due, words", [
    (Expiry.IDLE, "nothing received for 300.0 s (--session-idle-timeout)"),
    (Expiry.UNATTACHED, "within 30.0 s of its HELLO (--session-start-timeout)"),
    (Expiry.UNUSED, "no REQUEST within 300.0 s of its HELLO (--session-idle-timeout)"),
    (Expiry.PROBE, "silent for more than 10.0 s and disconnected"),
])
def test_why_a_session_is_freed_names_the_flag_and_its_value(due: Expiry, words: str) -> None:
    assert words in TIMEOUTS.why(due)


def test_a_live_session_paused_for_long_keeps_its_session() -> None:
    """Heartbeats keep ``last_seen`` fresh; a session that attached and requested once is never
    freed for not requesting again (a trainer in a long evaluation)."""
    s = _session()
    for now in range(0, 3600, 1):
        s.last_seen = float(now)
        assert _due(s, float(now)) is None


def test_sessions_count_per_address_and_keep_the_first_hellos_address() -> None:
    sessions = Sessions()
    a = sessions.open(b"a", "a", 1, now=1.0, address="10.0.0.1")
    sessions.open(b"b", "b", 1, now=1.0, address="10.0.0.1")
    sessions.open(b"c", "c", 1, now=1.0, address="10.0.0.2")
    again = sessions.open(b"a", "a", 2, now=5.0, address="10.0.0.3")
    assert again is a and a.address == "10.0.0.1" and a.opened == 1.0 and a.last_seen == 5.0
    assert (sessions.of_address("10.0.0.1"), sessions.of_address("10.0.0.2")) == (2, 1)
    sessions.close(a)
    sessions.close(a)
    assert sessions.of_address("10.0.0.1") == 1 and sessions.of_address("10.0.0.3") == 0
