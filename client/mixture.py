"""A weighted mixture of datasets for one trainer rank: :class:`MixtureLoader` over
:class:`Source` s, each a dataset served by its own servers.

The plan is :mod:`dataflow.mixture`'s (pure): each batch takes every source's share of its
samples, exactly over every window of a few batches; each source's samples are read exactly
once per pass over it (a source weighed above its share repeats whole passes, one below it
reads the next part of its current pass each epoch); resume is exact on any world size. Every
source has sessions with its own servers (an I/O thread of its own, as a DataLoader has),
which read that source's part of each batch; the loader puts the parts together.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from types import TracebackType
from typing import Any, cast

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from dataflow.checks import check_int
from dataflow.client.buffers import hand_over
from dataflow.client.combine import concat, repeat, samples
from dataflow.client.compat import EQUIVALENTS, refuse_torch_arguments
from dataflow.client.config import LoaderConfig
from dataflow.client.connect import GET_POLL_S, first_index, start_io
from dataflow.client.cursor import EpochCursor, Pass
from dataflow.client.decode import BatchDecoder
from dataflow.client.discovery import ServerSource, servers_setting
from dataflow.client.iothread import IOThread
from dataflow.client.lineage import (
    Names,
    Origin,
    attach,
    check_free,
    renumbered,
    sample_rows,
)
from dataflow.client.lineage import fields as lineage_fields
from dataflow.client.loader import EpochSetter
from dataflow.client.metrics import LoaderMetrics
from dataflow.client.mixstream import MixturePass, Projection
from dataflow.client.passes import PassIterator
from dataflow.client.state import make_mixture_state, read_mixture_state
from dataflow.client.stream import Demand, Stream
from dataflow.convert.columns import is_under
from dataflow.errors import ConfigError, InternalError, LoaderClosedError, SchemaMismatchError
from dataflow.index import DatasetIndex
from dataflow.mixture import (
    Part,
    Weights,
    last_epoch,
    mixture_batches,
    mixture_size,
    source_seed,
)
from dataflow.plan import EpochSize, consumed

__all__ = ["COMBINE", "MixtureConfig", "MixtureLoader", "Source"]

log = logging.getLogger("dataflow.client")

COMBINE = ("concat", "sources")
MAX_NAME = 64


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture, validated on construction.

    Attributes:
        servers: where its servers are, as a DataLoader's ``servers`` (an endpoint, a list,
            ``dns+tcp://NAME:PORT``, ``file:///PATH``); required. Two sources may name the
            same servers (each has its own sessions).
        weight: its share of every batch, relative to the others' (any positive number; see
            :class:`dataflow.mixture.Weights`: 0.7 is 7/10).
        name: how stats, metrics, lineage and errors name it: at most 64 printable characters,
            unique in a mixture (``""``, the default: the ``servers`` setting as given).
        columns: the fields asked of its servers, as a DataLoader's ``columns``; None: every
            field.
    """

    servers: str | Sequence[str] | ServerSource
    weight: float
    name: str = ""
    columns: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.servers is None:
            raise ConfigError("Source `servers` must name the source's servers. Found: None")
        servers = (self.servers if isinstance(self.servers, ServerSource)
                   else servers_setting(self.servers, None))
        object.__setattr__(self, "servers", servers)
        try:
            Weights.of([self.weight])
        except ConfigError:
            raise ConfigError(f"Source `weight` must be a finite number > 0. Found: "
                              f"{self.weight!r}") from None
        if not isinstance(self.name, str) or len(self.name) > MAX_NAME or (
                not self.name.isprintable()):
            raise ConfigError(f"Source `name` must be at most {MAX_NAME} printable characters. "
                              f"Found: {self.name!r}")
        if not self.name:
            object.__setattr__(self, "name", servers.spec)

    @property
    def setting(self) -> ServerSource:
        """:attr:`servers`, parsed (it is, once made)."""
        return cast(ServerSource, self.servers)


@dataclass(frozen=True)
class MixtureConfig:
    """Validated settings of one MixtureLoader (see :class:`MixtureLoader` for meanings).

    ``loader`` holds what every source's sessions share (a DataLoader's settings); each
    source's own are its ``servers`` and ``columns`` (:meth:`source_config`). ``weights`` is
    made of the sources' weights.
    """

    sources: tuple[Source, ...]
    loader: LoaderConfig
    samples_per_epoch: int | None = None
    combine: str = "concat"
    weights: Weights = Weights((1,))

    def __post_init__(self) -> None:
        if (isinstance(self.sources, str | bytes) or not isinstance(self.sources, Sequence)
                or not self.sources or not all(isinstance(s, Source) for s in self.sources)):
            raise ConfigError(f"`sources` must be a list of Source, at least one. Found: "
                              f"{self.sources!r}"[:400])
        object.__setattr__(self, "sources", tuple(self.sources))
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise ConfigError(f"`sources` must have distinct names; {twice!r} is given twice "
                              "(give Source(..., name=...))")
        object.__setattr__(self, "weights", Weights.of([s.weight for s in self.sources]))
        if self.samples_per_epoch is not None:
            check_int("samples_per_epoch", self.samples_per_epoch, 1)
        if self.combine not in COMBINE:
            raise ConfigError(f"`combine` must be one of {list(COMBINE)}. Found: "
                              f"{self.combine!r}")
        if not isinstance(self.loader, LoaderConfig):
            raise ConfigError(f"`loader` must be a LoaderConfig. Found: {self.loader!r}")

    def source_config(self, k: int) -> LoaderConfig:
        """The settings of source ``k``'s sessions: its servers, its columns."""
        src = self.sources[k]
        return replace(self.loader, servers=src.setting, columns=src.columns)


def _stop(ios: list[IOThread]) -> None:
    for io in ios:
        io.stop()


# The stream's plan and hand-off, and the metrics' counters, are functions of the loader's
# data, not methods of it: a loader in no reference cycle is freed (its I/O threads stopped)
# as soon as it is dropped.

def _mixture_size(cfg: LoaderConfig, samples_per_epoch: int, start: int) -> EpochSize:
    return mixture_size(samples_per_epoch, world_size=cfg.world_size,
                        batch_size=cfg.batch_size, drop_last=cfg.drop_last, start=start)


def _plan(config: MixtureConfig, sizes: list[Sequence[int]], samples_per_epoch: int,
          seeds: list[int], span: Pass) -> MixturePass:
    cfg = config.loader
    batches = mixture_batches(
        sizes, config.weights, samples_per_epoch=samples_per_epoch, world_size=cfg.world_size,
        rank=cfg.rank, epoch=span.epoch, seed=cfg.seed, batch_size=cfg.batch_size,
        drop_last=cfg.drop_last, start=span.start, shuffle=cfg.shuffle)
    expected = _mixture_size(cfg, samples_per_epoch, span.start).batches_per_rank
    if len(batches) != expected:
        raise InternalError(f"mixture plan has {len(batches)} batches; expected {expected}")
    return MixturePass.of(span, batches, seeds)


def _totals(ios: list[IOThread]) -> dict[str, int]:
    """The sources' I/O counters, summed."""
    out: dict[str, int] = {}
    for io in ios:
        for key, value in io.handoff.stats().items():
            out[key] = out.get(key, 0) + value
    return out


def _per_source(sources: Sequence[Source], ios: list[IOThread], samples: list[int],
                batches: list[int]) -> dict[str, dict[str, int]]:
    """Per source name: its ``samples`` and ``batches`` returned, and its I/O counters."""
    return {src.name: {"samples": samples[k], "batches": batches[k], **ios[k].handoff.stats()}
            for k, src in enumerate(sources) if k < len(ios)}


def _publish(ios: list[IOThread], projection: Projection,
             demand: Demand[MixturePass]) -> None:
    for io, wanted in zip(ios, projection.project(demand), strict=True):
        io.handoff.want(wanted)


class MixtureLoader:
    """Batches of a weighted mixture of datasets, each served by its own dataflow servers,
    for one trainer rank.

    The plan (:mod:`dataflow.mixture`) is a pure function of (seed, epoch, weights, the
    sources' shard sizes, ``samples_per_epoch``, batch size, world size):

    * A mixture epoch is ``samples_per_epoch`` samples (default: the sum of the sources'
      samples). Each source's share of them is its weight's; the sources' samples come from
      one endless stream of passes per source, each pass a permutation of all its samples,
      so every sample of a source is read exactly once per pass over it: a source weighed
      above its share of the data repeats whole passes, one below it reads a seeded subset
      (the next part of its current pass) each epoch, the rest of that pass in the next.
    * Proportions are exact over every window of a few batches: source ``k`` of weight
      ``a_k / P`` (in lowest terms) has exactly ``a_k`` of every ``P`` consecutive samples,
      so every batch holds ``B a_k / P`` of them when that is an integer, and every window of
      ``P / gcd(P, B)`` batches holds exactly its share otherwise (any batch within 2).
    * Ranks, padding and resume are a DataLoader's, counted in the mixture's samples: every
      rank yields ``len(loader)`` batches; ``state_dict()`` is the same on every rank and
      ``load_state_dict`` resumes exactly on any world size, also where some sources are
      midway through a pass.

    A batch (``combine="concat"``, the default) holds every source's samples, source after
    source, in the fields they share: every source must serve the same fields, of the same
    dtypes and per-sample shapes (give each :class:`Source` ``columns`` naming the common
    ones); the loader checks it at start from the servers' schemas (when no server runs a
    ``--transform``) and on every batch, and raises
    :class:`~dataflow.errors.SchemaMismatchError` naming both sources and the field. This
    copies the batch once on the trainer (on its device). ``combine="sources"``: a batch is
    ``{source name: that source's samples}`` (sources without samples in it left out), no
    copy, any schemas.

    Iteration (``for batch in loader``, ``set_epoch``, ``sampler``, one iterator at a time),
    ``collate_fn``, ``decode`` (per source), failover and discovery are a DataLoader's, per
    source. ``stats()`` sums the sources' counters and has each source's under
    ``["sources"][name]``: ``samples`` and ``batches`` returned of it, and its I/O counters.

    Args:
        sources: the datasets, each a :class:`Source` (servers, weight, name, columns).
        batch_size: samples per batch (all sources together).
        samples_per_epoch: samples per mixture epoch (None: the sum of the sources' samples).
        combine: ``"concat"`` or ``"sources"`` (above).
        lineage: every batch says where each sample came from (:mod:`dataflow.client.
            lineage`): ``lineage.source`` (the source's number in ``sources``),
            ``lineage.shard`` and ``lineage.row``, read by :meth:`lineage`. Off: no cost.
        metrics: as a DataLoader's; adds ``dataflow_client_source_samples_total`` and
            ``dataflow_client_source_batches_total`` (labels ``rank``, ``source``).
        **options: any other DataLoader keyword argument (``rank``, ``world_size``,
            ``shuffle``, ``seed``, ``drop_last``, ``device``, ``prefetch``, ``timeout``,
            ``collate_fn``, ``decode``, ...), with its meaning and default; ``prefetch`` is
            per server of each source.

    Raises:
        ConfigError: an argument is invalid.
        SchemaMismatchError: ``combine="concat"`` over sources whose fields differ.
        ServerUnavailable: a source's servers did not admit this loader within ``timeout``.
    """

    def __init__(self, sources: Sequence[Source], *, batch_size: int,
                 samples_per_epoch: int | None = None, combine: str = "concat",
                 lineage: bool = False,
                 metrics: int | str | CollectorRegistry | None = None,
                 **options: Any) -> None:
        known = set(inspect.signature(LoaderConfig.of).parameters)
        for name in sorted({"servers", "columns"} & set(options)):
            raise ConfigError(f"`{name}` is a Source's in a MixtureLoader: "
                              f"Source(servers, weight, columns=...)")
        unknown = [k for k in options if k not in known]
        refuse_torch_arguments({k: options[k] for k in unknown if k in EQUIVALENTS})
        if unknown:
            raise TypeError(f"MixtureLoader() got an unexpected keyword argument {unknown[0]!r}")
        if not isinstance(sources, Sequence) or not sources:
            raise ConfigError(f"`sources` must be a list of Source, at least one. Found: "
                              f"{sources!r}"[:400])
        if not isinstance(sources[0], Source):
            raise ConfigError(f"`sources` must be a list of Source. Found: {sources[0]!r}"[:400])
        loader = LoaderConfig.of(sources[0].setting, batch_size=batch_size, lineage=lineage,
                                 **options)
        self.config = MixtureConfig(tuple(sources), loader, samples_per_epoch, combine)
        self._start(metrics)

    @classmethod
    def from_config(cls, config: MixtureConfig, *,
                    metrics: int | str | CollectorRegistry | None = None) -> MixtureLoader:
        """A MixtureLoader of ``config`` (``loader.config`` of another): new sessions, at the
        start of epoch 0 (resume with ``load_state_dict``)."""
        if not isinstance(config, MixtureConfig):
            raise ConfigError(f"`config` must be a MixtureConfig. Found: {config!r}")
        loader = cls.__new__(cls)
        loader.config = config
        loader._start(metrics)
        return loader

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, a MixtureLoader is its configuration (:meth:`from_config`; metrics off)."""
        return (MixtureLoader.from_config, (self.config,))

    def _start(self, metrics: int | str | CollectorRegistry | None) -> None:
        cfg, base = self.config, self.config.loader
        k_sources = len(cfg.sources)
        self._io: list[IOThread] = []
        self._finalizer = weakref.finalize(self, _stop, self._io)
        self._metrics: LoaderMetrics | None = None
        self._decoders: list[BatchDecoder | None] = [None] * k_sources
        self._samples = [0] * k_sources
        self._batches = [0] * k_sources
        self._delivered = 0
        self._warned = False
        try:
            for k, src in enumerate(cfg.sources):
                self._io.append(start_io(cfg.source_config(k), f"source {src.name}"))
            if metrics is not None:
                self._metrics = LoaderMetrics(
                    metrics, base.rank, functools.partial(_totals, self._io),
                    functools.partial(_per_source, cfg.sources, self._io, self._samples,
                                      self._batches))
                weakref.finalize(self, self._metrics.close)
            hellos = [first_index(io) for io in self._io]
            self.indexes = [DatasetIndex.from_json(h.index_json) for h in hellos]
            shards = [[s.removeprefix(i.root) for s in i.shards] for i in self.indexes]
            for k, index in enumerate(self.indexes):
                if base.lineage:
                    check_free([f.name for f in index.schema], f"source {cfg.sources[k].name!r}")
                if base.decode is not None:
                    decoder = BatchDecoder(base.decode, base.device, shards[k])
                    self._decoders[k] = decoder
                    weakref.finalize(self, decoder.close)
            if cfg.combine == "concat" and not any(h.transform for h in hellos):
                self._check_fields()
        except BaseException:
            self.close()
            raise
        self._names = Names([(s.name, shards[k]) for k, s in enumerate(cfg.sources)])
        self._renumbered = [renumbered(i.skipped) for i in self.indexes]
        self.samples_per_epoch = cfg.samples_per_epoch or sum(i.total for i in self.indexes)
        self._seeds = [source_seed(base.seed, k) for k in range(k_sources)]
        self._projection = Projection(k_sources)
        self._stream: Stream[MixturePass] = Stream(
            EpochCursor(self.samples_per_epoch),
            functools.partial(_plan, cfg, [i.sizes for i in self.indexes],
                              self.samples_per_epoch, self._seeds),
            functools.partial(_publish, self._io, self._projection),
            read_ahead=base.read_ahead)
        self._live: weakref.ref[PassIterator] | None = None
        self.epoch_size = self._size(0)
        self.sampler = EpochSetter(self)
        self._meter = self._metrics.meter if self._metrics is not None else None

    def _check_fields(self) -> None:
        """Every source serves the same fields, of the same types (from their schemas).

        Raises:
            SchemaMismatchError: naming the first field and both sources that differ.
        """
        served = []
        for src, index in zip(self.config.sources, self.indexes, strict=True):
            cols = src.columns
            served.append({f.name: (f.dtype, f.shape, f.ragged) for f in index.schema
                           if cols is None or any(is_under(f.name, c) for c in cols)})
        first = self.config.sources[0].name
        for src, fields in zip(self.config.sources[1:], served[1:], strict=True):
            if fields != served[0]:
                name = next(n for n in sorted(set(fields) | set(served[0]))
                            if fields.get(n) != served[0].get(n))
                raise SchemaMismatchError(
                    f"source {first!r}", f"source {src.name!r}", name,
                    f"{served[0].get(name, 'missing')} vs {fields.get(name, 'missing')} "
                    "(dtype, shape, ragged); give each Source `columns` naming the fields they "
                    "share (of the same types), or use combine='sources'")

    # -- the plan -------------------------------------------------------------------------------

    def _size(self, start: int) -> EpochSize:
        return _mixture_size(self.config.loader, self.samples_per_epoch, start)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every source's I/O thread and close every socket (idempotent)."""
        self._finalizer()
        if self._metrics is not None:
            self._metrics.close()
        for decoder in self._decoders:
            if decoder is not None:
                decoder.close()

    def __enter__(self) -> MixtureLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- epochs ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per mixture epoch (identical on every rank); a resumed pass yields the
        rest only."""
        return self.epoch_size.batches_per_rank

    @property
    def batch_size(self) -> int:
        return self.config.loader.batch_size

    @property
    def epoch(self) -> int:
        """The epoch of the current pass (or of the next one, once set)."""
        return self._stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass cover mixture epoch ``epoch`` (as :meth:`DataLoader.set_epoch`).

        Raises:
            ConfigError: ``epoch`` is not an integer >= 0 (and at most the last epoch whose
                slots an int64 numbers: ~9.2e18 / ``samples_per_epoch``).
        """
        value = check_int("epoch", epoch, 0, last_epoch(self.samples_per_epoch))
        self._stream.set_epoch(value, held=self._held() and self._failure() is None)

    def _held(self) -> bool:
        return self._live is not None and self._live() is not None

    def _failure(self) -> BaseException | None:
        return next((f for io in self._io if (f := io.handoff.failure) is not None), None)

    def _depth(self) -> int:
        """Batches the read-ahead counts from a pass's end: the least any source fetches."""
        return min(io.handoff.capacity for io in self._io)

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise LoaderClosedError("this MixtureLoader is closed")
        failure = self._failure()
        if failure is not None:
            raise LoaderClosedError("this MixtureLoader failed earlier (the error was raised "
                                    "then); open a new one and load_state_dict() to "
                                    "resume") from failure
        iterator = PassIterator(self._iterate(self._stream.open()),
                                self.config.loader.collate_fn)
        self._live = weakref.ref(iterator)
        return iterator

    def _iterate(self, token: object) -> Iterator[dict[str, Any]]:
        """The batches of iterator ``token``'s pass: each one's parts taken from their
        sources' hand-offs, in source order, and put together."""
        stream = self._stream
        while True:
            if not self._finalizer.alive:
                raise LoaderClosedError("this MixtureLoader is closed")
            index = stream.next(token)
            if index is None:
                return
            t0 = perf_counter()
            mix, j, firsts = self._projection.locate(index)
            parts, nbytes, pending = [], 0, False
            for part, i in mix.parts(j):
                k, io = part.source, self._io[part.source]
                got, ready = io.handoff.take(stream.demand.gen, GET_POLL_S, io.is_alive)
                if got != firsts[k] + i:
                    raise InternalError(f"source {k} handed over part {got}; batch {index} "
                                        f"needs its part {firsts[k] + i}")
                nbytes += sum(t.nbytes for t in ready.tensors.values())
                pending |= ready.event is not None and not ready.event.query()
                out = hand_over(ready)
                decoder = self._decoders[k]
                if decoder is not None:
                    out = decoder(out, part.rows, mix.sources[k].tag(i))
                parts.append((k, self._finish(part, ready.left_out, out)))
            batch = self._combine(parts)
            for k, out in parts:
                self._samples[k] += samples(out)
                self._batches[k] += 1
            self._delivered += 1
            if self._meter is not None:
                self._meter.observe(perf_counter() - t0, nbytes, pending)
            left = stream.took(index, self._depth())
            yield batch
            if not left and not stream.current(token):
                return

    def _finish(self, part: Part, left_out: tuple[int, ...] | None,
                out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A source's part as the batch holds it: samples the plan names twice repeated, and
        its lineage fields."""
        copies = part.copies
        if copies is not None and left_out is None:
            if not self._warned:
                log.warning("source %r: a server left damaged samples out of a part that "
                            "names a sample twice without saying which: its samples are "
                            "kept once each, their lineage unknown (-1)",
                            self.config.sources[part.source].name)
                self._warned = True
        elif copies is not None:
            kept = np.delete(copies, list(left_out or ()))
            out = repeat(out, np.repeat(np.arange(len(kept)), kept))
        if self.config.loader.lineage:
            shard, row = sample_rows(part.rows, copies=copies, left_out=left_out,
                                     unknown=self._renumbered[part.source])
            out = attach(out, lineage_fields(part.source, shard, row, samples(out)))
        return out

    def _combine(self, parts: list[tuple[int, dict[str, torch.Tensor]]]) -> dict[str, Any]:
        named = [(self.config.sources[k].name, out) for k, out in parts]
        if self.config.combine == "sources":
            return dict(named)
        return concat(named)

    # -- lineage, counters ----------------------------------------------------------------------

    def lineage(self, batch: Mapping[str, Any]) -> list[Origin]:
        """Where each sample of ``batch`` (as this loader returned it, made with
        ``lineage=True``) came from: ``Origin(source name, shard, row)`` per sample, in order
        (with ``combine="sources"``: source by source).

        Raises:
            ConfigError: the batch has no lineage fields.
        """
        if self.config.combine == "sources":
            return [o for part in batch.values() for o in self._names(part)]
        return self._names(batch)

    def stats(self) -> dict[str, Any]:
        """Counters: ``batches`` returned, the sources' I/O counters summed (those of
        :meth:`DataLoader.stats`: ``delivered`` parts, ``discarded``, ``waiting``, ``skipped``,
        ``servers_lost``, ...), and ``sources``: per source name, ``samples`` and ``batches``
        of it returned, and its own I/O counters."""
        return {"batches": self._delivered, **_totals(self._io),
                "sources": _per_source(self.config.sources, self._io, self._samples,
                                       self._batches)}

    # -- resume ---------------------------------------------------------------------------------

    def _sources_identity(self) -> list[tuple[str, str, int]]:
        return [(src.name, index.fingerprint, index.total)
                for src, index in zip(self.config.sources, self.indexes, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """Resume state: a few scalars (:func:`dataflow.client.state.make_mixture_state`), the
        same on every rank, valid on any rank and any world size; what counts as consumed is a
        DataLoader's rule."""
        cfg = self.config.loader
        epoch, start, batches = self._stream.position(held=self._held())
        done = consumed(start, world_size=cfg.world_size, batch_size=cfg.batch_size,
                        batches_yielded=batches, total=self.samples_per_epoch,
                        drop_last=cfg.drop_last)
        return make_mixture_state(epoch=epoch, consumed=done,
                                  samples_per_epoch=self.samples_per_epoch,
                                  weights=self.config.weights, sources=self._sources_identity(),
                                  plan=cfg.plan_inputs(), world_size=cfg.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (saved by any rank of a job of any size): the next pass
        yields this rank's share of exactly the samples of the saved epoch not yet consumed.

        Raises:
            DatasetMismatchError: a source's data differs from the state's.
            StateMismatchError: ``state`` is malformed, of another version or loader, or from
                another configuration (names the field).
        """
        epoch, done = read_mixture_state(state, samples_per_epoch=self.samples_per_epoch,
                                         weights=self.config.weights,
                                         sources=self._sources_identity(),
                                         plan=self.config.loader.plan_inputs())
        self._stream.load(epoch, done)

