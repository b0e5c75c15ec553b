"""The server's Prometheus metrics: STATS snapshot -> metric families (pure), health from a
snapshot (pure, a fake clock), and config."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dataflow.errors import ConfigError, InternalError
from dataflow.server import ServerConfig
from dataflow.server.flags import build_parser, parse_args
from dataflow.server.frontend import COUNTERS
from dataflow.server.metrics import (
    METRICS,
    SessionUse,
    Snapshot,
    SnapshotCollector,
    client_label,
    families,
    health,
)

NOT_COUNTERS = (  # the other scalar entries of Frontend.stats()
    "clients", "connections", "draining_sessions", "queued", "in_flight", "pending_sends",
    "bytes_buffered", "workers", "worker_restarts", "log_lines_suppressed", "auth_refused",
    "unsent_bytes", "cache_bytes", "cache_disk_bytes")


def _samples(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    collector = SnapshotCollector()
    registry.register(collector)
    collector.publish(snap)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_stats_counter_has_a_metric() -> None:
    stats = dict.fromkeys((*COUNTERS, *NOT_COUNTERS), 1)
    names = {fam.name for fam in families(Snapshot(stats))}
    assert {METRICS[k].name for k in stats if k in METRICS} <= names
    assert set(stats) - set(METRICS) == {"skipped_samples"}  # exported per shard


def test_an_unmapped_stats_entry_is_an_internal_error() -> None:
    with pytest.raises(InternalError, match="'surprise'"):
        families(Snapshot({"surprise": 1}))


def test_exposition_carries_values_labels_and_per_shard_skips() -> None:
    snap = Snapshot(
        stats={"requests": 12, "replies": 11, "bytes_sent": 4096, "samples_sent": 176,
               "refused": 2, "sessions_refused": 1, "auth_refused": 0, "queued": 3,
               "skipped_samples": 9},
        skipped=(("a/shard-0.arrow", 7), ("b/shard-3.arrow", 2)),
        sessions=(SessionUse("rank 0/2 on node-a", 8, 5),
                  SessionUse("rank 1/2 on node-a", 8, 0),
                  SessionUse("rank 0/2 on node-a", 4, 1)))
    got = _samples(snap)
    assert got[("dataflow_requests_total", ())] == 12
    assert got[("dataflow_sent_bytes_total", ())] == 4096
    assert got[("dataflow_sent_samples_total", ())] == 176
    assert got[("dataflow_refusals_total", (("what", "request"),))] == 2
    assert got[("dataflow_refusals_total", (("what", "session"),))] == 1
    assert got[("dataflow_queued_requests", ())] == 3
    assert got[("dataflow_skipped_samples_total", (("shard", "a/shard-0.arrow"),))] == 7
    assert got[("dataflow_skipped_samples_total", (("shard", "b/shard-3.arrow"),))] == 2
    key = (("client", "rank 0/2 on node-a"),)  # its two sessions, summed
    assert got[("dataflow_session_credits", key)] == 12
    assert got[("dataflow_session_outstanding_requests", key)] == 6
    assert got[("dataflow_session_credits", (("client", "rank 1/2 on node-a"),))] == 8


def test_the_cache_metrics_are_labelled_by_tier() -> None:
    got = _samples(Snapshot(stats={"cache_hits": 90, "cache_disk_hits": 7, "cache_misses": 3,
                                   "cache_evictions": 5, "cache_disk_evictions": 1,
                                   "cache_bytes": 4096, "cache_disk_bytes": 8192}))
    assert got[("dataflow_cache_hits_total", (("tier", "memory"),))] == 90
    assert got[("dataflow_cache_hits_total", (("tier", "disk"),))] == 7
    assert got[("dataflow_cache_misses_total", ())] == 3
    assert got[("dataflow_cache_evictions_total", (("tier", "memory"),))] == 5
    assert got[("dataflow_cache_evictions_total", (("tier", "disk"),))] == 1
    assert got[("dataflow_cache_bytes", (("tier", "memory"),))] == 4096
    assert got[("dataflow_cache_bytes", (("tier", "disk"),))] == 8192


def test_a_scrape_shows_the_latest_snapshot() -> None:
    registry = CollectorRegistry()
    collector = SnapshotCollector()
    registry.register(collector)
    collector.publish(Snapshot({"requests": 1}))
    collector.publish(Snapshot({"requests": 5}))
    assert registry.get_sample_value("dataflow_requests_total") == 5


@pytest.mark.parametrize("client,label", [
    ("rank 3/8 on node-a", "rank 3/8 on node-a"),
    ("\x1b[2J\x1b[31mrank 0", "\\x1b[2J\\x1b[31mrank 0"),  # terminal escapes
    ("rank 0\u202egpj.exe", "rank 0\\u202egpj.exe"),  # right-to-left override
    ("a\nb\rc\td\x00\x7f", "a\\nb\\rc\\td\\x00\\x7f"),
    ("caf\u00e9 \U0001f600 \ud800", "caf\\xe9 \\U0001f600 \\ud800"),  # lone surrogate too
    ("x" * 300, "x" * 64),
    ("\u202e" * 100, "\\u202e" * 10),  # cut between escapes, never inside one
])
def test_the_client_label_is_printable_ascii_and_short(client: str, label: str) -> None:
    assert client_label(client) == label
    got = _samples(Snapshot(sessions=(SessionUse(client, 1, 0),)))
    assert ("dataflow_session_credits", (("client", label),)) in got


def test_metrics_flags_default_off_on_loopback() -> None:
    config = parse_args(["--data", "x"])
    assert config.metrics_port is None and config.metrics_bind == "127.0.0.1"
    config = parse_args(["--data", "x", "--metrics-port", "0", "--metrics-bind", "::"])
    assert config.metrics_port == 0 and config.metrics_bind == "::"
    text = build_parser().format_help()
    assert "--metrics-port" in text and "--metrics-bind" in text


@pytest.mark.parametrize("kwargs, match", [
    ({"metrics_port": -1}, "`metrics_port` must be an integer in"),
    ({"metrics_port": 70000}, "Found: 70000"),
    ({"metrics_port": 9100, "metrics_bind": "localhost"},
     "`metrics_bind` must be an IPv4 or IPv6 address"),
])
def test_metrics_flags_are_validated(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ServerConfig(("x",), **kwargs)


@pytest.mark.parametrize("snap, now, healthy, why", [
    (Snapshot(), 5.0, False, "starting (the dataset index is loaded, the readers are starting)"),
    (Snapshot({"clients": 3}, made=100.0, readers=4, readers_ready=4), 100.2, True,
     "serving with 4 readers, 3 sessions"),
    (Snapshot(made=100.0, readers=4, readers_ready=4), 110.0, True,
     "serving with 4 readers, 0 sessions"),
    (Snapshot(made=100.0, readers=4, readers_ready=4), 110.5, False,
     "the serving loop has not run for 10 s (stuck)"),
    (Snapshot(made=100.0, readers=4, readers_ready=3), 100.2, False,
     "3 of 4 readers serving (a reader exited; its replacement is not serving yet)"),
])
def test_health_from_the_latest_snapshot(snap: Snapshot, now: float, healthy: bool,
                                         why: str) -> None:
    assert health(snap, now) == (healthy, why)
