"""Backoff, the retry loop's decisions and the S3 pacing handed to botocore."""

from __future__ import annotations

import pytest

from dataflow.errors import ConfigError, RemoteFailure
from dataflow.storage.remote import CONNECT_RETRIES, Remote, RemoteConfig
from dataflow.storage.throttle import Backoff


def test_backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    b = Backoff(base_s=0.1, cap_s=1.0, max_retries=5)
    assert [b.delay(r, 0.0) for r in range(6)] == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.5, 0.5])
    assert b.delay(2, 0.999) == pytest.approx(0.4 * 0.9995)
    assert b.delay(200, 0.5) == pytest.approx(0.75)
    with pytest.raises(ConfigError):
        b.delay(0, 1.0)
    with pytest.raises(ConfigError, match="max_retries"):
        Backoff(max_retries=-1)


class _SlowDown(Exception):
    def __init__(self) -> None:
        super().__init__("An error occurred (SlowDown) when calling the GetObject operation")
        self.response = {"Error": {"Code": "SlowDown"},
                         "ResponseMetadata": {"HTTPStatusCode": 503}}


def _remote(max_retries: int = 8) -> tuple[Remote, list[float]]:
    waits: list[float] = []
    r = Remote(RemoteConfig(max_concurrency=8, max_retries=max_retries), sleep=waits.append,
               draw=lambda: 0.0)
    return r, waits


def test_throttled_calls_back_off_and_succeed() -> None:
    r, waits = _remote()
    answers: list[object] = [_SlowDown(), _SlowDown(), b"ok"]

    def fn() -> object:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert r.call("s3://b/k", fn) == b"ok"
    assert waits == pytest.approx([0.025, 0.05])
    assert r.stats() == {"retries": 2, "backoff_s": 0.075, "throttles": 2}


def test_throttling_gives_up_after_max_retries_with_one_line() -> None:
    r, waits = _remote(max_retries=3)

    def fn() -> bytes:
        raise _SlowDown()

    with pytest.raises(RemoteFailure) as e:
        r.call("s3://b/k", fn)
    assert len(waits) == 3 and "(after 4 attempts)" in str(e.value)
    assert "\n" not in str(e.value)


def test_connection_failures_retry_a_few_times_other_errors_never() -> None:
    r, waits = _remote()

    def refused() -> bytes:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(RemoteFailure, match="cannot connect to the default s3 endpoint"):
        r.call("s3://b/k", refused)
    assert len(waits) == CONNECT_RETRIES

    def missing() -> bytes:
        raise FileNotFoundError("b/k")

    waits.clear()
    with pytest.raises(RemoteFailure, match="no such object"):
        r.call("s3://b/k", missing)
    assert waits == []


def test_a_digit_run_in_a_shard_name_is_not_a_status() -> None:
    r, waits = _remote()

    def fn() -> bytes:
        raise FileNotFoundError("s3://b/train-000503.tar")

    with pytest.raises(RemoteFailure):
        r.call("s3://b/train-000503.tar", fn)
    assert waits == []


def test_s3_is_paced_by_botocore_adaptive_mode_and_retried_only_here() -> None:
    fs, path = Remote(RemoteConfig.of({"endpoint_url": "http://127.0.0.1:9"})).fs("s3://b/k")
    assert path == "b/k"
    assert fs.config_kwargs["retries"] == {"mode": "adaptive", "total_max_attempts": 1}
    assert fs.retries == 1
    own = {"mode": "standard", "max_attempts": 5}
    fs, _ = Remote(RemoteConfig.of({"endpoint_url": "http://127.0.0.1:9",
                                    "config_kwargs": {"retries": own}})).fs("s3://b/k")
    assert fs.config_kwargs["retries"] == own
