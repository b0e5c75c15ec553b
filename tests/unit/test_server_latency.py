"""The server's request latency (admission to reply handed over), with a fake clock, and its
histogram in /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from dataflow.server.latency import BUCKETS, Latency
from dataflow.server.metrics import Snapshot, SnapshotCollector


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_answered_request_falls_in_its_bucket() -> None:
    clock = Clock()
    lat = Latency(clock)
    for req_id in range(3):
        lat.start(b"a", req_id)
    clock.now += 0.004  # request 0: 4 ms
    lat.finish(b"a", 0)
    clock.now += 0.996  # request 1: 1 s exactly, in the 1 s bucket
    lat.finish(b"a", 1)
    clock.now += 99.0  # request 2: 100 s, beyond every bound
    lat.finish(b"a", 2)
    hist = lat.histogram()
    assert hist.counts[BUCKETS.index(0.0025)] == 0 and hist.counts[BUCKETS.index(0.005)] == 1
    assert hist.counts[BUCKETS.index(0.5)] == 1 and hist.counts[BUCKETS.index(1.0)] == 2
    assert hist.counts[BUCKETS.index(30.0)] == 2 and hist.counts[-1] == 3
    assert abs(hist.total_s - (0.004 + 1.0 + 100.0)) < 1e-9
    assert len(lat) == 0


def test_unadmitted_and_closed_sessions_requests_are_not_counted() -> None:
    clock = Clock()
    lat = Latency(clock)
    lat.finish(b"a", 7)  # a refused request's ERROR
    lat.start(b"a", 1)
    lat.start(b"a", 2)
    lat.start(b"b", 1)
    lat.forget(b"a")
    assert len(lat) == 1
    lat.finish(b"a", 1)
    lat.finish(b"b", 1)
    assert lat.histogram().counts[-1] == 1 and len(lat) == 0


def test_the_histogram_is_exported() -> None:
    clock = Clock()
    lat = Latency(clock)
    lat.start(b"a", 1)
    clock.now += 0.02
    lat.finish(b"a", 1)
    registry = CollectorRegistry()
    collector = SnapshotCollector()
    registry.register(collector)
    collector.publish(Snapshot(latency=lat.histogram()))
    assert registry.get_sample_value("dataflow_request_seconds_count") == 1
    assert registry.get_sample_value("dataflow_request_seconds_bucket", {"le": "0.01"}) == 0
    assert registry.get_sample_value("dataflow_request_seconds_bucket", {"le": "0.025"}) == 1
    assert abs(registry.get_sample_value("dataflow_request_seconds_sum") - 0.02) < 1e-9
