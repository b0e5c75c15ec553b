"""Per-rank data-stall metrics of a DataLoader (``DataLoader(..., metrics=...)``).

The consumer's thread (the one iterating the loader) counts each batch into a
:class:`StallMeter`: plain Python numbers, no lock, no label lookup, one ``bisect`` per batch.
A :class:`LoaderCollector` turns the meter and the loader's ``stats()`` into Prometheus metric
families when scraped (on the exporter's thread, or whichever thread calls the user's
registry). Thread invariant: one writer (the consumer) of the meter; readers copy the bucket
list first, so a scrape shows a histogram whose ``_count`` always equals its ``+Inf`` bucket
(``_sum`` may lag one batch behind).

Metrics (label ``rank``): ``dataflow_client_blocked_seconds`` (histogram: time each
``next()`` waited for its batch, its trainer-side ``decode`` included),
``dataflow_client_batches_total``, ``dataflow_client_bytes_total`` (bytes of the batches'
tensors as received),
``dataflow_client_h2d_pending_total`` (batches whose host-to-device copy had not finished when
``next()`` returned them: the training stream waits for it, so the copy was not hidden), the
loader's ``stats()`` counters as ``dataflow_client_<name>_total`` and
``dataflow_client_waiting_batches`` (batches received, not yet taken); a MixtureLoader's also
``dataflow_client_source_samples_total`` and ``dataflow_client_source_batches_total`` (labels
``rank`` and ``source``: samples of each source returned, batches holding any). Served on a
port, the loader's own registry also has the process's ``process_*`` metrics and
``dataflow_build_info``.

Where a port is served follows the server's ``--metrics-bind`` rule: loopback unless an
address is given (``metrics="0.0.0.0:9200"``), since the endpoint has no authentication.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dataflow.checks import as_int
from dataflow.client.buffers import Received
from dataflow.errors import ConfigError, MetricsError
from dataflow.exporter import MetricsExporter, check_metrics_address, register_process_metrics

PREFIX = "dataflow_client_"
BUCKETS = (1e-5, 1e-4, 1e-3, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
EXPORT_BIND = "127.0.0.1"
GAUGES = ("waiting",)


class StallMeter:
    """What one rank's consumer waited for and got (pure; see the module docstring).

    Attributes:
        counts: batches per blocked-time bucket (``len(bounds) + 1``; the last is ``+Inf``).
        blocked_s: total seconds ``next()`` waited.
        nbytes: total bytes of the batches' tensors.
        h2d_pending: batches whose host-to-device copy was still running when returned.
    """

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ConfigError(f"`bounds` must be increasing. Found: {bounds}")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.blocked_s = 0.0
        self.nbytes = 0
        self.h2d_pending = 0

    def observe(self, blocked_s: float, nbytes: int, h2d_pending: bool) -> None:
        """Count one batch that ``next()`` waited ``blocked_s`` seconds for."""
        self.counts[bisect_left(self.bounds, blocked_s)] += 1
        self.blocked_s += blocked_s
        self.nbytes += nbytes
        self.h2d_pending += h2d_pending

    def batch(self, blocked_s: float, ready: Received) -> None:
        """Count one batch handed to the consumer."""
        self.observe(blocked_s, sum(t.nbytes for t in ready.tensors.values()),
                     ready.event is not None and not ready.event.query())


class LoaderCollector(Collector):
    """Metric families of one loader: its :class:`StallMeter` and ``stats()`` counters.

    Args:
        rank: the loader's rank (label ``rank``).
        meter: its meter.
        stats: its ``stats()`` (called per scrape; must be thread-safe).
    """

    def __init__(self, rank: int, meter: StallMeter, stats: Callable[[], dict[str, int]],
                 sources: Callable[[], dict[str, dict[str, int]]] | None = None) -> None:
        self._rank = str(rank)
        self._meter = meter
        self._stats = stats
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        m, labels = self._meter, [self._rank]
        counts = list(m.counts)
        cumulative, buckets = 0, []
        for bound, n in zip((*(repr(b) for b in m.bounds), "+Inf"), counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        hist = HistogramMetricFamily(PREFIX + "blocked_seconds", "time next() waited for a "
                                     "batch", labels=["rank"])
        hist.add_metric(labels, buckets, m.blocked_s)
        yield hist
        for name, help, value in (
                ("batches", "batches returned by next()", cumulative),
                ("bytes", "bytes of the batches' tensors", m.nbytes),
                ("h2d_pending", "batches returned before their host-to-device copy finished",
                 m.h2d_pending)):
            fam = CounterMetricFamily(PREFIX + name, help, labels=["rank"])
            fam.add_metric(labels, value)
            yield fam
        for key, value in self._stats().items():
            help = f"DataLoader.stats()[{key!r}]"
            stat = (GaugeMetricFamily(PREFIX + key + "_batches", help, labels=["rank"])
                    if key in GAUGES else CounterMetricFamily(PREFIX + key, help, labels=["rank"]))
            stat.add_metric(labels, value)
            yield stat
        if self._sources is not None:
            per = self._sources()
            for key, help in (("samples", "samples of the source returned by next()"),
                              ("batches", "batches returned by next() holding the source")):
                fam = CounterMetricFamily(PREFIX + "source_" + key, help,
                                          labels=["rank", "source"])
                for name, source in per.items():
                    fam.add_metric([self._rank, name], source[key])
                yield fam

    def describe(self) -> Iterable[Metric]:
        return self.collect()


class LoaderMetrics:
    """A loader's metrics, registered in the user's registry or served on a port.

    Args:
        target: a TCP port (0: a free one, see :attr:`port`) served on loopback at
            ``/metrics``, ``"ADDRESS:PORT"`` to serve on that address (``"0.0.0.0:9200"``,
            ``"[::]:9200"``), or a ``CollectorRegistry`` to register into.
        rank: the loader's rank.
        stats: the loader's counters (``stats()``).
        sources: a MixtureLoader's counters per source (name -> ``samples``, ``batches``);
            None for a DataLoader.

    Raises:
        ConfigError: ``target`` is neither.
        MetricsError: the port is taken, or the registry has a DataLoader's metrics already.
    """

    def __init__(self, target: int | str | CollectorRegistry, rank: int,
                 stats: Callable[[], dict[str, int]],
                 sources: Callable[[], dict[str, dict[str, int]]] | None = None) -> None:
        bind = EXPORT_BIND
        if isinstance(target, CollectorRegistry):
            registry, port = target, None
        elif as_int(target) is not None or isinstance(target, str):
            if isinstance(target, str):
                bind, _, port_text = target.rpartition(":")
                bind = bind.removeprefix("[").removesuffix("]")
                if not bind or not port_text.isdigit():
                    raise ConfigError("`metrics` as text must be ADDRESS:PORT (e.g. "
                                      f"'0.0.0.0:9200'). Found: {target!r}")
                target = int(port_text)
            port = check_metrics_address(target, bind, port_name="metrics",
                                         bind_name="metrics")
            registry = CollectorRegistry()
            register_process_metrics(registry)
        else:
            raise ConfigError("`metrics` must be a port number, 'ADDRESS:PORT' or a "
                              f"prometheus_client CollectorRegistry. Found: {target!r}")
        self.meter = StallMeter()
        self._collector = LoaderCollector(rank, self.meter, stats, sources)
        try:
            registry.register(self._collector)
        except ValueError as e:
            raise MetricsError(f"cannot register rank {rank}'s DataLoader metrics: {e} (close "
                               "the other DataLoader using this registry first)") from e
        self._registry: CollectorRegistry | None = registry
        self._exporter = MetricsExporter(registry, port, bind) if port is not None else None
        self.port: int | None = self._exporter.port if self._exporter is not None else None

    def close(self) -> None:
        """Stop serving, or leave the user's registry (idempotent)."""
        registry, self._registry = self._registry, None
        if registry is None:
            return
        if self._exporter is not None:
            self._exporter.close()
        else:
            registry.unregister(self._collector)
