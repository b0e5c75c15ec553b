"""The Grafana dashboard queries only metrics that the server and the DataLoader export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dataflow.client.handoff import Handoff
from dataflow.client.metrics import LoaderCollector, StallMeter
from dataflow.server.frontend import COUNTERS
from dataflow.server.metrics import METRICS, SessionUse, Snapshot, SnapshotCollector

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "dataflow-dashboard.json"
NAME = re.compile(r"\bdataflow_[a-z0-9_]+")


def _exported() -> set[str]:
    """Every sample name a server and a DataLoader can export (each series present once)."""
    collector = SnapshotCollector()
    collector.publish(Snapshot(stats={k: 1 for k in (*COUNTERS, *METRICS)},
                               skipped=(("a.arrow", 1),),
                               sessions=(SessionUse("rank 0", 4, 1),)))
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(LoaderCollector(0, StallMeter(), Handoff(lambda: None).stats))
    text = generate_latest(registry).decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_query_names_exported_metrics_only() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in NAME.findall(e)}
    exported = _exported()
    assert used - exported == set()
    for needed in ("dataflow_client_blocked_seconds_sum", "dataflow_client_blocked_seconds_bucket",
                   "dataflow_client_batches_total", "dataflow_client_bytes_total",
                   "dataflow_queued_requests", "dataflow_refusals_total",
                   "dataflow_malformed_messages_total", "dataflow_skipped_samples_total",
                   "dataflow_worker_restarts_total", "dataflow_sessions"):
        assert needed in used, needed


def test_panels_have_unique_ids_and_query_the_datasource_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource"}
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
