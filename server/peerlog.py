"""Logging what peers send: escaped, truncated, and rate-limited.

Peer-provided text (a HELLO's ``client`` name, bytes of a malformed message, a routing id) goes
into the log only through :func:`quote`, so it can never forge a log line. Warnings a peer can
trigger at will go through a :class:`RateLimitedLog`.

Thread invariant: a :class:`RateLimitedLog` is used by one thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

QUOTE_LIMIT = 120
LINES_PER_WINDOW = 20
WINDOW_S = 10.0


def quote(value: str | bytes, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as a Python literal (``repr``: no raw newline or control character), cut to
    about ``limit`` characters (``...`` marks a cut)."""
    text = repr(value[:limit])
    return text if len(value) <= limit else text + "..."


class RateLimitedLog:
    """At most ``lines`` warnings per window of ``window`` seconds, a window starting with the
    first warning after the previous one ended; then one summary line with the number left out.

    Args:
        logger: where lines go.
        lines: lines per window.
        window: window length in seconds.
        clock: monotonic clock (seconds).

    Attributes:
        suppressed: warnings left out since start.
    """

    def __init__(self, logger: logging.Logger, lines: int = LINES_PER_WINDOW,
                 window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._lines = lines
        self._window = window
        self._clock = clock
        self._start = 0.0
        self._count = 0
        self.suppressed = 0

    def warning(self, fmt: str, *args: object) -> None:
        """Log ``fmt % args`` at WARNING unless this window's lines are used up."""
        self.tick()
        if self._count == 0:
            self._start = self._clock()
        self._count += 1
        if self._count <= self._lines:
            self._log.warning(fmt, *args)
        else:
            self.suppressed += 1

    def tick(self) -> None:
        """End the window if it is over (call now and then: the summary line comes on time)."""
        now = self._clock()
        if self._count and now - self._start >= self._window:
            left_out = self._count - self._lines
            if left_out > 0:
                self._log.warning("%d more such warning(s) left out in the last %.0f s",
                                  left_out, now - self._start)
            self._count = 0
