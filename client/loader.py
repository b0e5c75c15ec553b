"""The trainer-side DataLoader: iterate batches served by one or more loader servers."""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from time import perf_counter
from types import TracebackType
from typing import Any, Protocol

import torch
from prometheus_client import CollectorRegistry

from dataflow.batch import Schema
from dataflow.checks import check_int
from dataflow.client.buffers import hand_over
from dataflow.client.combine import samples
from dataflow.client.compat import refuse_torch_arguments
from dataflow.client.config import (
    DEFAULT_IO_THREADS,
    DEFAULT_SLOT_BYTES,
    LoaderConfig,
)
from dataflow.client.connect import GET_POLL_S, first_index, start_io
from dataflow.client.cursor import EpochCursor
from dataflow.client.decode import BatchDecoder, Decode, ImageDecode
from dataflow.client.discovery import (
    DEFAULT_RESOLVE_INTERVAL,
    ENV_VAR,
    servers_setting,
)
from dataflow.client.lineage import (
    Names,
    Origin,
    attach,
    check_free,
    renumbered,
    sample_rows,
)
from dataflow.client.lineage import fields as lineage_fields
from dataflow.client.metrics import LoaderMetrics
from dataflow.client.passes import PassIterator, PassPlan, plan_pass
from dataflow.client.planner import Planner
from dataflow.client.state import make_state, read_state
from dataflow.client.stream import Stream
from dataflow.errors import ConfigError, LoaderClosedError
from dataflow.index import DatasetIndex
from dataflow.plan import EpochSize, consumed, epoch_size
from dataflow.shuffle import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_SHUFFLE_WINDOW,
    DEFAULT_WINDOW,
)


class Epochs(Protocol):
    """A loader whose epoch is set (a DataLoader, a MixtureLoader)."""

    def set_epoch(self, epoch: int) -> None: ...


class EpochSetter:
    """``loader.sampler``: what code written for a ``DistributedSampler`` calls each epoch
    (``loader.sampler.set_epoch(epoch)``; PyTorch Lightning does it for every dataloader)."""

    def __init__(self, loader: Epochs) -> None:
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is None:
            raise LoaderClosedError("the DataLoader of this sampler is gone")
        loader.set_epoch(epoch)


class DataLoader:
    """Batches of a dataset served by dataflow loader servers, for one trainer rank.

    Each epoch's order is a deterministic function of (dataset index, epoch, seed, shuffle
    settings), computed with :mod:`dataflow.plan`, so ranks agree without talking. Every rank
    yields ``len(loader)`` batches per epoch; over all ranks every sample appears exactly once
    per epoch, plus ``EpochSize.repeated`` repeats when ``drop_last=False`` pads the last
    batches (minus ``EpochSize.dropped`` samples when ``drop_last=True``).

    Batches are ``dict[str, torch.Tensor]``:

    * a fixed-size field ``name`` -> tensor of shape ``(batch, *shape)``;
    * a variable-length field ``name`` -> ``batch[name]``, a 1-D tensor of all samples' values
      back to back (uint8 UTF-8 / raw bytes for str / bytes fields), and
      ``batch[name + ".offsets"]``, int64 of shape ``(batch + 1,)``: sample ``i`` is
      ``batch[name][offsets[i]:offsets[i + 1]]``.

    On CPU (``device`` None) tensors are fresh per batch and may be kept; they are pinned when
    CUDA is available and ``pin_memory``. With a CUDA ``device`` the host-to-device copies run
    on a dedicated stream, and the current stream waits for them before the batch is returned.

    Iteration (see :mod:`dataflow.client.cursor` and :mod:`dataflow.client.stream`): every pass
    (``for batch in loader``) is one full pass over the current epoch, whatever earlier passes
    did (a peek or a ``break`` consumes nothing); a pass whose iterator ran to its end (raised
    StopIteration; taking the last batch is not enough) makes the next pass start the next
    epoch; :meth:`set_epoch` (also as ``loader.sampler.set_epoch``) chooses the epoch, also for
    an iterator already made but not read yet. ``state_dict()`` / ``load_state_dict()`` resume
    exactly, on any rank and any world size (on the same world size: the uninterrupted run's
    batches, padded tail included): after ``load_state_dict`` the next pass yields the rest of
    the saved epoch (spread over this job's ranks; a state taken after an epoch's last batch
    resumes at the next epoch), and ``set_epoch`` with the saved epoch keeps that position until
    a pass from it completes. One iterator is active at a time: starting a new one invalidates
    the previous. After an error is raised the loader can only be closed; :meth:`close` from
    another thread makes a ``next()`` waiting for a batch raise
    :class:`~dataflow.errors.LoaderClosedError`.

    Failover (see :mod:`dataflow.client.scheduler`): servers are stateless and this loader
    owns the plan, so losing a server loses no sample. A server whose connection drops (a
    killed process is noticed at once, a vanished host within seconds by ZMTP heartbeats),
    that stops answering HEARTBEATs, or that says it is stopping gets no new requests, and
    the batches it held are requested from the other servers at once; late replies are
    discarded, so every batch is yielded exactly once, in plan order. A server back within
    ``grace`` seconds (a network cut) keeps its session and its work; one that lost this
    client's session (restarted) joins again (HELLO) and takes work again, provided it serves
    the same dataset (otherwise it stays out, logged). Liveness is judged by the servers'
    connections and HEARTBEAT answers, never by how long a big reply takes; how long one
    request may take is ``request_timeout``.

    Start: the constructor returns as soon as one server admitted this loader (its HELLO was
    answered with INDEX and its reader connections answered); that server's dataset is the
    loader's. The other servers join in the background whenever they can, as servers found by
    discovery do, and take requests from then on: one busy (``ServerBusy``: it holds its
    ``--max-sessions``), still starting, slow to answer or not up yet is asked again with a
    backoff (1 s, doubling up to 30 s; at once when its connection comes up), logged once per
    reason; one serving another dataset stays out, logged as an error, but fails the
    constructor (``DatasetMismatchError``, naming both) when it answered before the first server
    admitted this loader (ranks, each starting with its first server, could start on different
    datasets); one that refuses the HELLO itself (a ``batch_size`` or ``columns`` it does not
    accept) fails the constructor while no server admitted this loader yet.
    ``stats()["joined"]`` counts the servers that joined after the loader started without them.
    ``server_readers`` holds the reader process count of each server that joined so far.

    Under the server's ``--on-error skip`` a batch may be short: damaged samples are left out,
    and counted in ``stats()["skipped"]``.

    Discovery (:mod:`dataflow.client.discovery`, :mod:`dataflow.client.membership`): servers
    named by a DNS name or a registry file are looked up again every ``resolve_interval``
    seconds; one found later joins and takes requests mid-epoch, one gone leaves and its
    batches go to the others; every batch is still yielded exactly once.

    Args:
        servers: where the servers are: one endpoint (``tcp://host:port``), a list of them or
            a comma-separated string, ``dns+tcp://NAME:PORT`` or ``file:///PATH``; batches are
            spread over them. Default: the ``DATAFLOW_SERVERS`` environment variable (same
            forms).
        batch_size: samples per batch.
        rank: this trainer's rank; default from torch.distributed, else ``RANK``, else 0.
        world_size: number of ranks; default from torch.distributed, else ``WORLD_SIZE``,
            else 1.
        shuffle: ``"sample"`` (or True, the default: mixes like a full random shuffle within
            windows of ``shuffle_window`` samples), ``"block"`` (cheaper, poor mixing: blocks
            of ``block_size`` samples shuffled within ``window`` shards) or ``"none"``/False.
        seed: non-negative seed shared by all ranks.
        drop_last: drop the remainder instead of padding ranks with repeated samples.
        device: None / "cpu" for CPU tensors, or a CUDA device.
        pin_memory: pin CPU batches (only when CUDA is available).
        prefetch: requests kept outstanding per server, or one per reader of a server with
            more readers (so that all of them work at once), within the credits it grants
            (``--max-credits``) and the bytes of ``prefetch`` replies of 32 MiB (or of one
            request's batches, if more), known from the first batch: the loader holds up to
            that many batches per server, more requests sharing them (each carrying fewer
            batches, at least one; see ``batches_per_request``).
        timeout: seconds the constructor waits for a first server to admit this loader, and
            seconds an epoch may wait with no usable server, before
            :class:`~dataflow.errors.ServerUnavailable` is raised (naming every endpoint and
            its state); also the seconds one server's join may take before it is tried again
            later.
        grace: seconds a server may be disconnected or silent before it is lost (its
            session is then given up; it must join again).
        shuffle_window: samples shuffled together by the ``"sample"`` shuffle.
        block_size: samples per block of the ``"block"`` shuffle.
        window: shards whose blocks the ``"block"`` shuffle mixes.
        curve_key: this client's CurveZMQ secret key file (``NAME.key_secret`` from
            ``python -m dataflow keygen``; its ``NAME.key`` must be in the servers'
            ``--curve-allowed-keys``); with ``server_key``, every connection (control and
            data) is encrypted and authenticated. A refused key raises
            :class:`~dataflow.errors.ServerUnavailable` ("authentication refused") within
            about a second, not after ``timeout``.
        server_key: the servers' public key file (``NAME.key``); both or neither.
        metrics: per-rank data-stall metrics (:mod:`dataflow.client.metrics`): a port to
            serve ``/metrics`` on, on loopback (0: a free one, see ``metrics_port``), or
            ``"ADDRESS:PORT"`` (``"0.0.0.0:9200"``: every interface; the endpoint has no
            authentication),
            or a ``prometheus_client.CollectorRegistry`` to register them in (one DataLoader
            per registry at a time; ``close()`` unregisters); None: off.
        resolve_interval: seconds between lookups of a ``dns+tcp://`` name or a
            ``file://`` registry (ignored for a static list).
        columns: the fields batches hold: names from :attr:`schema`, a parent name standing
            for the fields under it (``image``: ``image.bytes`` and ``image.path``); a
            field's ``.valid`` mask and ``.offsets`` come with it. The servers keep them of
            each batch after their ``--transform``. None: every field. A name a server does
            not serve makes the constructor raise :class:`~dataflow.errors.RemoteError`
            naming it.
        read_ahead: while a pass ends, request the first batches of the pass that follows it
            when it completes (the next epoch from its start), so an epoch starts without a
            wait. A loop that does otherwise (a break, another epoch, a resume elsewhere)
            discards them; after the last epoch up to the batches the loader keeps requested
            per server (``prefetch``) are read for nothing (and counted in the servers'
            metrics and in ``stats()``, ``skipped`` included). A failed read raises only when
            the loop reaches its batch.
        request_timeout: seconds a request may go unanswered, from when it was sent until its
            whole reply arrived (the server's queue, its read and ``--transform``, and the
            transfer), before its batch is asked of another server (the first reply is
            taken, as in failover); when no other server can take it, or that request too
            goes unanswered as long, the batch fails: the loop gets
            :class:`~dataflow.errors.RequestTimeout` where it reaches it, naming the
            servers, the batch (epoch, global batch index) and their ``--transform``. A late
            request does not make its server suspect (liveness is judged by connections and
            HEARTBEATs); set this above the longest a batch may take, e.g. a big batch over a
            slow link. None (the default): ``timeout``.
        collate_fn: called in the trainer on each batch (the ``dict[str, torch.Tensor]``
            above, already on ``device``), and the loop gets what it returns: torch's
            ``collate_fn`` role, e.g. turning text fields into Python values with
            :mod:`dataflow.client.values`. An exception it raises reaches the loop, and that
            batch counts as taken (the next ``next()`` goes on with the next batch). Pickled
            with the configuration, so a module-level function, not a lambda, when the loader
            is re-created in another process.
        decode: decode encoded images on the trainer (:mod:`dataflow.client.decode`): a
            mapping of a bytes field (JPEG) to an :class:`~dataflow.client.decode.ImageDecode`
            (crop size, random or center crop, flips, output name), or a
            :class:`~dataflow.client.decode.Decode` (adds the decoder and its threads). Each
            such field arrives as uint8 images ``(batch, 3, height, width)`` (RGB) in place of
            its bytes: decoded with nvJPEG on the loader's CUDA ``device`` when torchvision
            decodes there, else with Pillow on the CPU (:attr:`decode_backend` says which),
            cropped and flipped with draws seeded by (``seed``, epoch, global batch index) as a
            server transform's are, so a resumed run or another world size gets the same
            crops. A missing or non-bytes field, or an image that does not decode, raises
            :class:`~dataflow.errors.DecodeError` naming the field, the sample's position,
            the batch and its shard. None (the default): bytes arrive as bytes.
        io_threads: ZeroMQ I/O threads of this loader's own ZeroMQ context (closed with the
            loader): they copy the servers' bytes out of the kernel, one TCP connection (a
            server's reader process) per thread at a time, so more than one helps only with
            several reader connections; each reader connection is bound to the thread with the
            fewest. Default 1; give 2 or more for large batches (see docs/using.md, "Receive
            path, requests and same-host shared memory").

        shared_memory: ``"auto"`` (the default): with each server that proves it runs on this
            host as this user (it opens a segment this loader made in ``/dev/shm``, mode
            0600), batches land in that shared memory instead of travelling over TCP
            (:mod:`dataflow.client.shmring`); any other server, or one started with
            ``--shared-memory refuse``, uses TCP frames. ``"off"``: TCP frames only.
        shared_memory_slot_bytes: bytes of one slot (a batch larger than a slot travels in
            TCP frames, and so does one a full ``/dev/shm`` has no room for). Each server's
            segment holds a slot for each request the loader may keep there (up to 256, one
            per reader), as many for replies waiting or held, and 3 more; it is sparse,
            taking ``/dev/shm`` memory as slots are written, and the slots freed last are
            lent first: per server, the slots in use at once x the largest reply that fits
            a slot (a request's batches); with a CUDA ``device`` those bytes are pinned.
            Default 32 MiB slots.
        batches_per_request: how many consecutive batches of a pass one request to a server
            carries (one credit, one reply, each batch handed over on its own: the order,
            exactly-once and resume are the same). ``"auto"`` (the default): one at first,
            then as many as make a reply of at most 32 MiB (at most 8; while any server's
            replies land in shared memory, 16 MiB and at most a slot), sized from the first
            batch received, for batches of which 4 or more fit (larger ones travel alone); an
            integer from 1 to 64: that many. More
            per request divides the per-batch cost of requests, replies and wake-ups on both
            sides (the trainer's CPU per batch, see docs/using.md, "Receive path"); the
            loader then holds up to ``prefetch x`` that many batches per server, or as many as
            fit ``prefetch x`` 32 MiB if more (a server of more readers than ``prefetch`` is
            sent a request per reader, each carrying up to that many batches, fewer where the
            bytes are shared among more requests, at least one).
        lineage: every batch says where each of its samples came from
            (:mod:`dataflow.client.lineage`): int64 CPU tensors ``lineage.source`` (0),
            ``lineage.shard`` (the shard's number in :attr:`index`) and ``lineage.row`` of
            shape ``(batch,)``, read by :meth:`lineage`; samples a server left out as damaged
            are not in them, and a shard the index left samples out of has rows -1 (where
            the rest moved is not recorded). Off (the default): no cost.
        tune_malloc: on Linux with glibc, set the process's malloc (process-wide) to keep
            freed buffers of up to 32 MiB rather than return them to the kernel, so each
            received batch's memory is not faulted in afresh (:mod:`dataflow.heap`;
            19 MB batches: ~1,100 page faults each without, 3.7-4.0 GB/s with against 2.6-3.1
            without, docs/using.md, "Receive path"). False leaves malloc as it is.

    torch's DataLoader arguments that have no place here (``num_workers``,
    ``prefetch_factor``, ``persistent_workers``, ``sampler``, ``generator``, ...) raise
    :class:`~dataflow.errors.ConfigError` naming dataflow's equivalent
    (:mod:`dataflow.client.compat`). ``batch_size`` and ``drop_last`` are attributes as in
    torch; pickling a DataLoader pickles its :attr:`config`, and unpickling starts a new
    loader of it (:meth:`from_config`).

    Raises:
        ConfigError: an argument is invalid, or is one of torch's DataLoader only.
        MetricsError: the metrics port is taken, or the registry has a DataLoader's already.
        DatasetMismatchError: servers answered with two datasets before one admitted it.
        ServerUnavailable: no server admitted this loader within ``timeout`` (naming every
            endpoint and its state: not connected, no answer, busy, ...), or a name or a
            registry named no server within ``timeout`` (while iterating: no server was
            usable for ``timeout`` seconds).
    """

    def __init__(
        self,
        servers: str | Sequence[str] | None = None,
        *,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool | str = True,
        seed: int = 0,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        pin_memory: bool = True,
        prefetch: int = 4,
        timeout: float = 60.0,
        grace: float = 10.0,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        block_size: int = DEFAULT_BLOCK_SIZE,
        window: int = DEFAULT_WINDOW,
        curve_key: str | os.PathLike | None = None,
        server_key: str | os.PathLike | None = None,
        metrics: int | str | CollectorRegistry | None = None,
        resolve_interval: float = DEFAULT_RESOLVE_INTERVAL,
        columns: Sequence[str] | None = None,
        read_ahead: bool = True,
        request_timeout: float | None = None,
        collate_fn: Callable[[dict[str, torch.Tensor]], Any] | None = None,
        decode: Mapping[str, ImageDecode] | Decode | None = None,
        io_threads: int = DEFAULT_IO_THREADS,
        shared_memory: str = "auto",
        shared_memory_slot_bytes: int = DEFAULT_SLOT_BYTES,
        batches_per_request: int | str = "auto",
        lineage: bool = False,
        tune_malloc: bool = True,
        **torch_only: object,
    ) -> None:
        refuse_torch_arguments(torch_only)
        self.config = LoaderConfig.of(
            servers_setting(servers, os.environ.get(ENV_VAR)), batch_size=batch_size,
            rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            device=device, pin_memory=pin_memory, prefetch=prefetch, timeout=timeout,
            grace=grace, shuffle_window=shuffle_window, block_size=block_size, window=window,
            curve_key=curve_key, server_key=server_key, resolve_interval=resolve_interval,
            columns=columns, read_ahead=read_ahead, request_timeout=request_timeout,
            collate_fn=collate_fn, decode=decode, io_threads=io_threads,
            shared_memory=shared_memory, shared_memory_slot_bytes=shared_memory_slot_bytes,
            batches_per_request=batches_per_request, lineage=lineage,
            tune_malloc=tune_malloc)
        self._start(metrics)

    @classmethod
    def from_config(cls, config: LoaderConfig, *,
                    metrics: int | str | CollectorRegistry | None = None) -> DataLoader:
        """A DataLoader of ``config`` (``loader.config`` of another, e.g. unpickled in a
        spawned process): a new session with the servers, at the start of epoch 0 (resume
        with ``load_state_dict``)."""
        if not isinstance(config, LoaderConfig):
            raise ConfigError(f"`config` must be a LoaderConfig. Found: {config!r}")
        loader = cls.__new__(cls)
        loader.config = config
        loader._start(metrics)
        return loader

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, a DataLoader is its configuration: unpickling makes a new one of it
        (:meth:`from_config`; metrics off), as a spawned process re-creates its loader."""
        return (DataLoader.from_config, (self.config,))

    def _start(self, metrics: int | str | CollectorRegistry | None) -> None:
        cfg = self.config
        self._io = start_io(cfg)
        self._finalizer = weakref.finalize(self, self._io.stop)
        self._metrics: LoaderMetrics | None = None
        self._decoder: BatchDecoder | None = None
        self._planner: Planner[PassPlan] | None = None
        try:
            if metrics is not None:
                self._metrics = LoaderMetrics(metrics, cfg.rank, self._io.handoff.stats)
                weakref.finalize(self, self._metrics.close)
            self.index = DatasetIndex.from_json(first_index(self._io).index_json)
            root = self.index.root
            shards = [s.removeprefix(root) for s in self.index.shards]
            if cfg.decode is not None:
                self._decoder = BatchDecoder(cfg.decode, cfg.device, shards)
                weakref.finalize(self, self._decoder.close)
            if cfg.lineage:
                check_free([f.name for f in self.index.schema], "the dataset")
        except BaseException:
            self.close()
            raise
        self._names = Names([(cfg.servers.spec, shards)])
        self._renumbered = renumbered(self.index.skipped)
        planner = self._planner = Planner(functools.partial(plan_pass, cfg, self.index.sizes))
        weakref.finalize(self, planner.close)
        self._stream = Stream(EpochCursor(self.index.total), planner, self._io.handoff.want,
                              read_ahead=cfg.read_ahead, prepare=planner.prepare)
        self._live: weakref.ref[PassIterator] | None = None  # the latest iterator
        self.epoch_size = self._size(0)
        self.sampler = EpochSetter(self)
        self.batch_sampler = None  # as torch's DataLoader: batches are not a sampler's here
        self._meter = self._metrics.meter if self._metrics is not None else None
        self.metrics_port = self._metrics.port if self._metrics is not None else None

    @property
    def server_readers(self) -> tuple[int, ...]:
        """The reader process count of each server that joined so far (as its INDEX said), in
        the order they joined; servers that join later (busy, slow or not up at the start,
        found by discovery) are added when they do."""
        return self._io.handoff.readers()

    @property
    def batch_size(self) -> int:
        """Samples per batch (as torch's ``DataLoader.batch_size``)."""
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the remainder is dropped (as torch's ``DataLoader.drop_last``)."""
        return self.config.drop_last

    @property
    def decoded_ahead(self) -> int:
        """Batches of ``decode`` that were decoded ahead, while the consumer held the batch
        before them (see :mod:`dataflow.client.decode`); 0 without ``decode``."""
        return 0 if self._decoder is None else self._decoder.ahead_used

    @property
    def decode_backend(self) -> str | None:
        """The decoder of ``decode`` and why it was chosen (``"pillow (auto: torchvision does
        not load ...)"``, ``"nvjpeg on cuda:0 (auto)"``); None without ``decode``."""
        return None if self._decoder is None else self._decoder.backend.reason

    @property
    def schema(self) -> Schema:
        """Every field the servers serve (name, dtype, shape, ragged kind, meta), before any
        server ``--transform``: what ``columns`` may name, whichever it names."""
        return self.index.schema

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the I/O thread and close every socket (idempotent)."""
        self._finalizer()
        if self._metrics is not None:
            self._metrics.close()
        if self._decoder is not None:
            self._decoder.close()
        if self._planner is not None:
            self._planner.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- epochs ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch (identical on every rank); a resumed pass yields the rest only."""
        return self.epoch_size.batches_per_rank

    @property
    def epoch(self) -> int:
        """The epoch of the current pass (or of the next one, once set)."""
        return self._stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass cover ``epoch``: all of it, or the rest of it after
        :meth:`load_state_dict` saved in ``epoch``, until a pass from that position completed.

        An iterator made but not read yet is retargeted to ``epoch`` (torch's DataLoader
        without workers behaves so; Lightning makes its iterator before it sets the epoch);
        one that yielded a batch is invalidated.

        Raises:
            ConfigError: ``epoch`` is not an integer >= 0 (numpy/torch integers are accepted).
        """
        value = check_int("epoch", epoch, 0)
        self._stream.set_epoch(value, held=self._held() and not self._io.handoff.failed)

    def _held(self) -> bool:
        """Whether the program still holds the latest iterator."""
        return self._live is not None and self._live() is not None

    def _size(self, start: int) -> EpochSize:
        cfg = self.config
        return epoch_size(self.index.total, world_size=cfg.world_size, batch_size=cfg.batch_size,
                          drop_last=cfg.drop_last, start=start)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if not self._finalizer.alive:
            raise LoaderClosedError("this DataLoader is closed")
        failure = self._io.handoff.failure
        if failure is not None:
            raise LoaderClosedError("this DataLoader failed earlier (the error was raised "
                                    "then); open a new one and load_state_dict() to "
                                    "resume") from failure
        iterator = PassIterator(self._iterate(self._stream.open()), self.config.collate_fn)
        self._live = weakref.ref(iterator)
        return iterator

    def _iterate(self, token: object) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of iterator ``token``'s pass (see :mod:`dataflow.client.stream`)."""
        stream, handoff = self._stream, self._io.handoff
        while True:
            if not self._finalizer.alive:
                raise LoaderClosedError("this DataLoader is closed")
            if stream.next(token) is None:
                return
            t0 = perf_counter()
            got, batch = handoff.take(stream.demand.gen, GET_POLL_S, self._io.is_alive)
            out = hand_over(batch)
            if self._decoder is not None:  # a batch that fails to decode is not consumed
                out = self._decoder(out, *stream.demand.batch(got), key=batch)
            if self.config.lineage:
                shard, row = sample_rows(stream.demand.batch(got)[0], left_out=batch.left_out,
                                         unknown=self._renumbered)
                out = attach(out, lineage_fields(0, shard, row, samples(out)))
            if self._meter is not None:
                self._meter.batch(perf_counter() - t0, batch)
            left = stream.took(got, handoff.capacity)
            if stream.yielded == 1 and stream.span.start == 0 and self.config.rank == 0:
                # The samples the index lost to damage are missing from every epoch: rank 0
                # counts them once per pass over an epoch from its start.
                handoff.count("skipped", self.index.lost)
            if self._decoder is not None:  # decode the next batch while the consumer works
                following = handoff.peek(stream.demand.gen)
                if following is not None:
                    self._decoder.ahead(following[1], hand_over(following[1]),
                                        *stream.demand.batch(following[0]))
            yield out
            if not left and not stream.current(token):
                return  # its pass yielded every batch; the loader moved on since: it ends

    def lineage(self, batch: Mapping[str, Any]) -> list[Origin]:
        """Where each sample of ``batch`` (as this loader returned it, made with
        ``lineage=True``) came from: ``Origin(source, shard, row)`` per sample, in order; the
        source is the ``servers`` setting, the shard named as the servers' INDEX names it
        (relative to the dataset root).

        Raises:
            ConfigError: the batch has no lineage fields.
        """
        return self._names(batch)

    def stats(self) -> dict[str, int]:
        """Counters: ``delivered`` batches, ``discarded`` batches of abandoned iterators,
        batches ``waiting`` for the consumer, samples ``skipped`` as damaged (left out of the
        batches received, and on rank 0 those the dataset index lost, once per pass over an
        epoch from its start), ``servers_lost`` (no usable connection for the ``grace``
        period; a server whose connection dropped has its requests asked again at once,
        before that), servers ``rejoined``, batches ``rerequested`` (asked again: their
        server's connection dropped or the server was lost, or the request was late),
        ``recovered`` (re-requested batches received),
        servers that ``joined`` after the loader started without them (found by discovery, or
        listed but busy, slow or not up at the start), servers that ``left`` (discovery), and
        batches ``late`` (no reply within ``request_timeout``: asked of another server, or
        failed), server sessions that use shared memory (``shm_sessions``) and batches
        received through it (``shm_batches``)."""
        return self._io.handoff.stats()

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Resume state: a few scalars (see :mod:`dataflow.client.state`), the same on every
        rank, valid on any rank and any world size.

        It describes what the next batch would be: the batches returned by ``next()`` of the
        current iterator count as consumed while the program still holds that iterator (a
        training loop's); once it is gone (a peek ``next(iter(loader))``, a loop left by
        ``break``) or replaced, they do not, as the next pass starts that epoch over. An
        iterator that reached its end completed its epoch: the state resumes at the next one.
        """
        cfg = self.config
        epoch, start, batches = self._stream.position(held=self._held())
        done = consumed(start, world_size=cfg.world_size, batch_size=cfg.batch_size,
                        batches_yielded=batches, total=self.index.total,
                        drop_last=cfg.drop_last)
        return make_state(epoch=epoch, consumed=done, total=self.index.total,
                          fingerprint=self.index.fingerprint, plan=self.config.plan_inputs(),
                          world_size=cfg.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (saved by any rank of a job of any size): the next pass
        yields this rank's share of exactly the samples of the saved epoch not yet consumed.

        Raises:
            DatasetMismatchError: ``state`` was saved on another dataset.
            StateMismatchError: ``state`` is malformed, of another version, or from another
                configuration (names the field).
        """
        epoch, done = read_state(state, total=self.index.total,
                                 fingerprint=self.index.fingerprint, plan=self.config.plan_inputs())
        self._stream.load(epoch, done)
