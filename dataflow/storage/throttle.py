"""Backoff for object-store requests.

Object stores answer overload with a throttling reply (S3: ``503 SlowDown``, about 5,500
GET/s per prefix). The answer is to wait and to send fewer requests: :class:`Backoff` gives
the wait before each retry (exponential, capped, jittered; pure: the random draw is an
argument). How many requests go out is paced, for S3, by botocore's adaptive client-side rate
limiter (see :mod:`dataflow.storage.remote`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter.

    Attributes:
        base_s: wait before the first retry (seconds, before jitter).
        cap_s: longest wait (seconds).
        max_retries: retries after the first attempt before giving up.
    """

    base_s: float = 0.05
    cap_s: float = 5.0
    max_retries: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ConfigError(f"`base_s` must be in (0, cap_s={self.cap_s}]. Found: {self.base_s}")
        object.__setattr__(self, "max_retries", check_int("max_retries", self.max_retries, 0))

    def delay(self, retry: int, draw: float) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first).

        Args:
            retry: how many retries came before this one.
            draw: a uniform random number in ``[0, 1)``; the wait lies in ``[d/2, d)`` of the
                un-jittered ``d = min(cap_s, base_s * 2**retry)``.
        """
        if retry < 0 or not 0 <= draw < 1:
            raise ConfigError(f"retry {retry} must be >= 0 and draw {draw} in [0, 1)")
        full = min(self.cap_s, self.base_s * 2.0 ** min(retry, 62))
        return full * (0.5 + draw / 2)
