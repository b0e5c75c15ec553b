"""Prometheus metrics of a loader server (``--metrics-port``), made from its STATS counters.

Everything the server counts already reaches the frontend: its own counters, and the readers'
(bytes, samples and skipped samples of each reply) through their SENT notices
(:mod:`dataflow.wire.internal`). So no multiprocess mode is needed: the frontend's thread
builds an immutable :class:`Snapshot` at every housekeeping tick (4 times a second) and hands
it to a :class:`SnapshotCollector`; the exporter's HTTP thread only reads the latest snapshot
reference. A scrape never touches the frontend's live state, needs no lock and is at most one
tick behind; the serving loop pays one ``stats()`` call per tick, nothing per message.

:func:`families` (snapshot -> metric families) is pure. Every STATS counter is exported
(:data:`METRICS` maps each to a metric name and labels); counters end in ``_total``.

The same endpoint answers ``/healthz`` from the latest snapshot (:func:`health`, pure): 200
while the frontend's loop publishes and every reader slot has a reader that started, else 503
saying which is not (Kubernetes ``httpGet`` probes, the image's ``HEALTHCHECK``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dataflow.errors import InternalError
from dataflow.exporter import MetricsExporter, register_process_metrics
from dataflow.server.latency import BUCKETS, Histogram

PREFIX = "dataflow_"
STALE_S = 10.0  # a snapshot older than this: the frontend's loop is stuck
MAX_LABEL = 128
MAX_CLIENT_LABEL = 64


@dataclass(frozen=True)
class Spec:
    """How one STATS entry is exported: as ``name`` (a counter or gauge) with ``labels``."""

    name: str
    kind: str
    help: str
    labels: tuple[tuple[str, str], ...] = ()


def _c(name: str, help: str, **labels: str) -> Spec:
    return Spec(PREFIX + name, "counter", help, tuple(labels.items()))


def _g(name: str, help: str, **labels: str) -> Spec:
    return Spec(PREFIX + name, "gauge", help, tuple(labels.items()))


REFUSALS = "refusals"
REFUSED_HELP = ("requests refused (request: REQUESTs, and HELLOs declaring an oversized batch "
                "or columns not served; session: HELLOs over --max-sessions; address: HELLOs "
                "over --max-sessions-per-address; auth: CURVE keys)")
EXPIRED = "sessions_expired"
EXPIRED_HELP = ("sessions freed (ttl: silent with the connection closed past --client-ttl; "
                "idle: silent past --session-idle-timeout; unattached: no data connection "
                "within --session-start-timeout; unused: no REQUEST within "
                "--session-idle-timeout)")
CACHE_HITS_HELP = ("samples served from the readers' decoded-sample caches (memory: "
                   "--cache-memory; disk: --cache-disk)")
CACHE_EVICTIONS_HELP = ("decoded samples evicted from the readers' caches to stay within their "
                        "bounds (memory: to the disk tier, if any)")
CACHE_BYTES_HELP = ("bytes the readers' decoded-sample caches hold (memory: at most "
                    "--cache-memory; disk: at most --cache-disk-bytes)")
METRICS: dict[str, Spec] = {
    "requests": _c("requests", "REQUESTs accepted from clients"),
    "replies": _c("replies", "replies (batches, and read errors) handed to clients"),
    "bytes_sent": _c("sent_bytes", "bytes of the replies handed to clients"),
    "samples_sent": _c("sent_samples", "samples in the batches handed to clients"),
    "malformed": _c("malformed_messages", "malformed client messages (answered with an ERROR)"),
    "refused": _c(REFUSALS, REFUSED_HELP, what="request"),
    "sessions_refused": _c(REFUSALS, REFUSED_HELP, what="session"),
    "address_sessions_refused": _c(REFUSALS, REFUSED_HELP, what="address"),
    "auth_refused": _c(REFUSALS, REFUSED_HELP, what="auth"),
    "connections_cut": _c("connections_cut", "client connections cut (over --max-inbound-bytes "
                                             "or --max-inbound-total, or over a connection "
                                             "cap)"),
    "replies_too_large": _c("replies_too_large", "batches over --max-reply-bytes (answered "
                                                 "with an ERROR)"),
    "dropped_sends": _c("dropped_replies", "replies that could not be delivered (client gone)"),
    "stale_notices": _c("stale_notices", "reader notices for requests already settled"),
    "clients_expired": _c(EXPIRED, EXPIRED_HELP, why="ttl"),
    "sessions_idle_expired": _c(EXPIRED, EXPIRED_HELP, why="idle"),
    "sessions_unattached_expired": _c(EXPIRED, EXPIRED_HELP, why="unattached"),
    "sessions_unused_expired": _c(EXPIRED, EXPIRED_HELP, why="unused"),
    "clients_probed": _c("clients_probed", "silent clients whose connection was probed"),
    "tasks_requeued": _c("tasks_requeued", "tasks of dead readers queued again"),
    "shm_sessions": _c("shm_sessions", "client sessions whose batches land in the shared "
                                       "memory they offered (same host and user)"),
    "worker_restarts": _c("worker_restarts", "reader processes replaced after they died"),
    "log_lines_suppressed": _c("log_lines_suppressed", "peer log lines rate-limited away"),
    "clients": _g("sessions", "client sessions open"),
    "connections": _g("connections", "client connections open"),
    "draining_sessions": _g("draining_sessions", "closed sessions with requests at a reader"),
    "queued": _g("queued_requests", "requests waiting for a reader"),
    "in_flight": _g("reader_tasks", "tasks held by the readers"),
    "pending_sends": _g("parked_replies", "frontend replies waiting for a full client queue"),
    "bytes_buffered": _g("parked_bytes", "bytes of the parked replies"),
    "unsent_bytes": _g("unsent_bytes", "bytes of replies the readers hold not yet written to "
                                       "clients"),
    "workers": _g("workers", "reader processes"),
    "cache_hits": _c("cache_hits", CACHE_HITS_HELP, tier="memory"),
    "cache_disk_hits": _c("cache_hits", CACHE_HITS_HELP, tier="disk"),
    "cache_misses": _c("cache_misses", "samples looked for in the readers' decoded-sample caches "
                                       "and decoded"),
    "cache_evictions": _c("cache_evictions", CACHE_EVICTIONS_HELP, tier="memory"),
    "cache_disk_evictions": _c("cache_evictions", CACHE_EVICTIONS_HELP, tier="disk"),
    "cache_announced": _c("cache_announced_samples", "samples requests announced their sessions "
                                                     "read next (--cache-plan-window)"),
    "cache_bytes": _g("cache_bytes", CACHE_BYTES_HELP, tier="memory"),
    "cache_disk_bytes": _g("cache_bytes", CACHE_BYTES_HELP, tier="disk"),
}
SKIPPED = PREFIX + "skipped_samples"
SESSION_CREDITS = PREFIX + "session_credits"
SESSION_OUTSTANDING = PREFIX + "session_outstanding_requests"
REQUEST_SECONDS = PREFIX + "request_seconds"
PER_SHARD = ("skipped_samples", "skipped_per_shard")


@dataclass(frozen=True)
class SessionUse:
    """Credit use of one session: its client's self-description (as the HELLO sent it; made a
    label by :func:`client_label`), credits granted and requests outstanding."""

    client: str
    credits: int
    outstanding: int


def client_label(client: str, limit: int = MAX_CLIENT_LABEL) -> str:
    """A HELLO's ``client`` text as a label value: printable ASCII only, every other character
    (control characters, escape sequences, right-to-left overrides, any non-ASCII) written as
    its Python escape (``\\x1b``, ``\\u202e``), cut to ``limit`` characters. Whatever a peer
    sends, a dashboard shows what it is, not what it would draw."""
    out = []
    size = 0
    for ch in client:
        text = ch if " " <= ch <= "~" else ch.encode("unicode_escape").decode("ascii")
        size += len(text)
        if size > limit:
            break
        out.append(text)
    return "".join(out)


@dataclass(frozen=True)
class Snapshot:
    """What one scrape shows.

    Attributes:
        stats: the frontend's scalar STATS entries.
        skipped: ``(shard name, samples)`` skipped as damaged, per shard with any.
        sessions: credit use of every open session.
        latency: how long requests took, admission to reply handed over.
        made: ``time.monotonic()`` when the frontend made it; None: no snapshot yet (the
            server is starting).
        readers: reader slots (``--workers``).
        readers_ready: slots whose reader process started and serves.
    """

    stats: Mapping[str, int] = field(default_factory=dict)
    skipped: tuple[tuple[str, int], ...] = ()
    sessions: tuple[SessionUse, ...] = ()
    latency: Histogram = Histogram()
    made: float | None = None
    readers: int = 0
    readers_ready: int = 0


def health(snap: Snapshot, now: float, stale_s: float = STALE_S) -> tuple[bool, str]:
    """Whether the server whose latest snapshot is ``snap`` serves at ``now`` (monotonic
    seconds), and one line saying why: it is starting (no snapshot yet), its frontend's loop
    has made none for ``stale_s`` seconds (stuck), or a reader slot has no reader that started
    (one died and its replacement is starting, or cannot start)."""
    if snap.made is None:
        return False, "starting (the dataset index is loaded, the readers are starting)"
    age = now - snap.made
    if age > stale_s:
        return False, f"the serving loop has not run for {age:.0f} s (stuck)"
    if snap.readers_ready < snap.readers:
        return False, (f"{snap.readers_ready} of {snap.readers} readers serving (a reader "
                       "exited; its replacement is not serving yet)")
    return True, (f"serving with {snap.readers} readers, "
                  f"{snap.stats.get('clients', 0)} sessions")


def families(snap: Snapshot) -> list[Metric]:
    """The metric families of ``snap``.

    Raises:
        InternalError: a STATS entry has no metric in :data:`METRICS` (a counter was added
            without deciding how it is exported).
    """
    made: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for key, value in snap.stats.items():
        if key in PER_SHARD:
            continue
        spec = METRICS.get(key)
        if spec is None:
            raise InternalError(f"STATS entry {key!r} has no Prometheus metric")
        fam = made.get(spec.name)
        if fam is None:
            names = [k for k, _ in spec.labels]
            fam = made[spec.name] = (
                CounterMetricFamily(spec.name, spec.help, labels=names) if spec.kind == "counter"
                else GaugeMetricFamily(spec.name, spec.help, labels=names))
        fam.add_metric([v for _, v in spec.labels], value)
    skipped = CounterMetricFamily(SKIPPED, "damaged samples left out: lost when the index "
                                  "was built (counted once, at start), then left out of replies",
                                  labels=["shard"])
    for shard, n in snap.skipped:
        skipped.add_metric([shard[-MAX_LABEL:]], n)
    credits = GaugeMetricFamily(SESSION_CREDITS, "credits granted to the sessions of a client",
                                labels=["client"])
    outstanding = GaugeMetricFamily(SESSION_OUTSTANDING, "requests of the sessions of a "
                                    "client not settled", labels=["client"])
    per_client: dict[str, list[int]] = {}
    for s in snap.sessions:
        use = per_client.setdefault(client_label(s.client), [0, 0])
        use[0] += s.credits
        use[1] += s.outstanding
    for label, (granted, held) in sorted(per_client.items()):
        credits.add_metric([label], granted)
        outstanding.add_metric([label], held)
    latency = HistogramMetricFamily(
        REQUEST_SECONDS, "seconds from a REQUEST's admission to its reply handed to ZeroMQ "
        "(queue, read, --transform; not the transfer)")
    bounds = [*(f"{b:g}" for b in BUCKETS), "+Inf"]
    latency.add_metric([], list(zip(bounds, snap.latency.counts, strict=True)),
                       snap.latency.total_s)
    return [*made.values(), skipped, credits, outstanding, latency]


class SnapshotCollector(Collector):
    """Serves the latest published :class:`Snapshot`.

    Thread invariant: :meth:`publish` is called by one thread (the frontend's); :meth:`collect`
    by any, reading one reference (atomic under the GIL) to an immutable snapshot.
    """

    def __init__(self) -> None:
        self._snap = Snapshot()

    def publish(self, snap: Snapshot) -> None:
        self._snap = snap

    @property
    def latest(self) -> Snapshot:
        return self._snap

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._snap))

    def describe(self) -> Iterable[Metric]:
        return ()


class ServerMetrics:
    """The server's ``/metrics`` and ``/healthz`` endpoint: a :class:`SnapshotCollector` in a
    private registry, served on ``bind:port`` (0: a free port, see :attr:`port`) until
    :meth:`close`.

    Raises:
        MetricsError: the address cannot be bound.
    """

    def __init__(self, port: int, bind: str) -> None:
        self._collector = SnapshotCollector()
        registry = CollectorRegistry()
        registry.register(self._collector)
        register_process_metrics(registry)
        self._exporter = MetricsExporter(registry, port, bind, health=self.health)
        self.port = self._exporter.port
        self.publish = self._collector.publish

    def health(self) -> tuple[bool, str]:
        """:func:`health` of the latest snapshot, now (any thread)."""
        return health(self._collector.latest, time.monotonic())

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._exporter.close()
