"""Peer text in server logs: quoted, cut, and rate-limited with a summary line."""

from __future__ import annotations

import logging

import pytest

from dataflow.server.peerlog import RateLimitedLog, quote


@pytest.mark.parametrize("value", ["rank 3\nINFO forged line", b"\x00\r\n\x1b[31m", "é\u2028x"])
def test_quote_never_lets_a_line_break_or_control_character_through(value) -> None:
    text = quote(value)
    assert not any(c in text for c in "\n\r\x1b\x00\u2028")


def test_quote_cuts_long_values() -> None:
    assert quote("x" * 1000, limit=10) == repr("x" * 10) + "..."
    assert quote("short") == "'short'"


def test_rate_limited_log_keeps_n_lines_per_window_then_summarizes(caplog) -> None:
    now = [0.0]
    logger = logging.getLogger("test.peerlog")
    limited = RateLimitedLog(logger, lines=3, window=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.peerlog"):
        for i in range(50):
            limited.warning("bad %d", i)
        limited.tick()
        assert [r.getMessage() for r in caplog.records] == ["bad 0", "bad 1", "bad 2"]
        now[0] = 10.0
        limited.tick()
        limited.warning("bad again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[3] == "47 more such warning(s) left out in the last 10 s"
    assert messages[4] == "bad again" and limited.suppressed == 47
