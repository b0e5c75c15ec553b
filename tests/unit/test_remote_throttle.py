"""Backoff, the adaptive concurrency limit (fake clock) and the retry loop's decisions."""

from __future__ import annotations

import threading

import pytest

from dataflow.errors import ConfigError, RemoteFailure
from dataflow.storage.remote import CONNECT_RETRIES, Remote, RemoteConfig
from dataflow.storage.throttle import AdaptiveLimit, Backoff, Gate


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


def test_limit_halves_once_per_burst_and_grows_back_one_per_interval() -> None:
    lim = AdaptiveLimit(16, cooldown_s=1.0, increase_every_s=0.5)
    for t in (10.0, 10.1, 10.5, 10.9):  # one burst of 503s answering requests sent together
        lim.on_throttle(t)
    assert (lim.limit, lim.throttles, lim.decreases) == (8, 4, 1)
    lim.on_throttle(11.0)
    lim.on_throttle(12.0)
    assert lim.limit == 2 and lim.decreases == 3
    lim.on_success(12.4)  # too soon after the decrease
    assert lim.limit == 2
    for t in (12.5, 12.6, 13.0, 13.5):
        lim.on_success(t)
    assert lim.limit == 5
    for i in range(100):
        lim.on_success(14.0 + i)
    assert lim.limit == 16  # never above the ceiling


def test_limit_never_goes_below_one() -> None:
    lim = AdaptiveLimit(3, cooldown_s=0.0)
    for t in range(10):
        lim.on_throttle(float(t))
    assert lim.limit == 1
    with pytest.raises(ConfigError):
        AdaptiveLimit(0)


def test_gate_holds_at_most_limit_callers() -> None:
    gate = Gate(AdaptiveLimit(2), clock=lambda: 0.0)
    inside, most = [0], [0]
    lock = threading.Lock()
    release = threading.Event()

    def work() -> None:
        with gate.slot():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            release.wait(30)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(30)
    assert most[0] <= 2 and inside[0] == 0


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


def test_throttled_calls_back_off_shrink_the_limit_and_succeed() -> None:
    r, waits = _remote()
    answers: list[object] = [_SlowDown(), _SlowDown(), b"ok"]

    def fn() -> object:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert r.call("s3://b/k", fn) == b"ok"
    assert waits == pytest.approx([0.025, 0.05])
    assert r.stats()["retries"] == 2 and r.stats()["throttles"] == 2
    assert r.gate.limit.limit == 4  # halved once: both 503s within the cooldown


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
