"""A DataLoader's per-rank stall metrics: the meter's buckets and their exposition."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from dataflow.client.buffers import Received
from dataflow.client.metrics import BUCKETS, LoaderCollector, LoaderMetrics, StallMeter
from dataflow.errors import ConfigError, MetricsError

STATS = {"delivered": 3, "discarded": 1, "waiting": 2, "skipped": 4}


def test_a_wait_lands_in_the_first_bucket_not_below_it() -> None:
    meter = StallMeter((0.001, 0.01, 0.1))
    for s in (0.0, 0.001, 0.002, 0.1, 5.0):
        meter.observe(s, 10, False)
    assert meter.counts == [2, 1, 1, 1]
    assert meter.blocked_s == pytest.approx(5.103) and meter.nbytes == 50
    assert meter.h2d_pending == 0


def test_bounds_must_increase() -> None:
    with pytest.raises(ConfigError, match="`bounds` must be increasing"):
        StallMeter((0.1, 0.01))


def test_a_cpu_batch_counts_its_tensor_bytes_and_no_pending_copy() -> None:
    meter = StallMeter()
    meter.batch(0.5, Received({"x": torch.zeros(4, 3, dtype=torch.float32),
                            "y": torch.zeros(4, dtype=torch.int64)}))
    assert meter.nbytes == 4 * 3 * 4 + 4 * 8 and meter.h2d_pending == 0
    assert sum(meter.counts) == 1


def test_exposition_is_a_cumulative_histogram_labelled_by_rank() -> None:
    meter = StallMeter()
    for s in (0.0, 0.003, 0.003, 40.0):
        meter.observe(s, 100, True)
    registry = CollectorRegistry()
    registry.register(LoaderCollector(7, meter, lambda: STATS))
    rank = {"rank": "7"}

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {**rank, **labels})

    assert value("dataflow_client_blocked_seconds_bucket", le="1e-05") == 1
    assert value("dataflow_client_blocked_seconds_bucket", le="0.005") == 3
    assert value("dataflow_client_blocked_seconds_bucket", le=repr(BUCKETS[-1])) == 3
    assert value("dataflow_client_blocked_seconds_bucket", le="+Inf") == 4
    assert value("dataflow_client_blocked_seconds_count") == 4
    assert value("dataflow_client_blocked_seconds_sum") == pytest.approx(40.006)
    assert value("dataflow_client_batches_total") == 4
    assert value("dataflow_client_bytes_total") == 400
    assert value("dataflow_client_h2d_pending_total") == 4
    assert value("dataflow_client_skipped_total") == 4
    assert value("dataflow_client_discarded_total") == 1
    assert value("dataflow_client_waiting_batches") == 2


def test_a_registry_takes_one_loader_at_a_time() -> None:
    registry = CollectorRegistry()
    first = LoaderMetrics(registry, 0, lambda: STATS)
    with pytest.raises(MetricsError, match="rank 0's DataLoader metrics"):
        LoaderMetrics(registry, 0, lambda: STATS)
    first.close()
    first.close()
    second = LoaderMetrics(registry, 0, lambda: STATS)
    second.meter.observe(0.1, 1, False)
    assert registry.get_sample_value("dataflow_client_batches_total", {"rank": "0"}) == 1
    assert first.port is None and second.port is None


@pytest.mark.parametrize("target, match", [
    ("9100", r"as text must be ADDRESS:PORT \(e.g. '0.0.0.0:9200'\). Found: '9100'"),
    ("0.0.0.0:x", "as text must be ADDRESS:PORT"),
    ("localhost:9100", "`metrics` must be an IPv4 or IPv6 address. Found: 'localhost'"),
    ("[::1]:70000", "Found: 70000"),
    (True, "a port number, 'ADDRESS:PORT' or a prometheus_client CollectorRegistry"),
    (-1, "`metrics` must be an integer in"),
    (65536, "Found: 65536"),
])
def test_a_bad_target_is_a_config_error(target, match) -> None:
    with pytest.raises(ConfigError, match=match):
        LoaderMetrics(target, 0, lambda: STATS)
