"""What a reader process does with one task: read its ranges, transform, keep the session's
columns, encode the reply.

A :class:`~dataflow.transform.Stages` transform's decode stage goes through the reader's
:class:`~dataflow.server.samplecache.SampleCache` when it has one: the samples of a batch it
holds are not read nor decoded again; the others are read (only their rows), decoded as one
batch, cut into samples and cached; the batch is assembled in plan order and the augment stage
runs on it with the batch's context, as without the cache (so the values are the same).

Pure of sockets: :func:`serve_task` returns the reply's frames and the SENT notice of what the
frontend counts of it; :mod:`dataflow.server.worker` sends them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from dataflow import wire
from dataflow.batch import Batch, batch_len
from dataflow.convert.columns import ReadOptions
from dataflow.errors import DataflowError, InternalError, ReplyTooLarge
from dataflow.index import DatasetIndex
from dataflow.readers import IndexedShard, ShardReader, TarOptions, open_shard, read_ranges
from dataflow.readers.base import TALLY
from dataflow.readers.book import AddressBook
from dataflow.readers.multi import joined_ranges
from dataflow.readers.tar.options import DEFAULT_OPTIONS
from dataflow.security import ServerCurve
from dataflow.server.samplecache import Sample, SampleCache, assemble, split
from dataflow.server.shmserve import Segments
from dataflow.server.transform import Transform, apply_transform, decode_batch
from dataflow.storage.remote import RemoteConfig
from dataflow.subset import select
from dataflow.transform import TransformContext, batch_seed
from dataflow.wire import BatchTag, ErrorKind
from dataflow.wire.internal import Sent, Task

log = logging.getLogger("dataflow.server.worker")
# A request of at most APART_PARTS batches, or of batches that together take at least
# APART_BYTES (as its session's last reply's bytes a sample say, or of unknown size:
# ReplySizes), is read batch by batch and sent apart: a batch is never copied to join another
# (a client's automatic sizing asks for 4 MiB batches 8 at a time over TCP; bench/RESULTS.md,
# "Batches sent apart" and "Eight 4 MiB batches a request"); more small batches are read as
# one and joined, which costs the reader fewer reads and the client fewer frames than it copies
# (8 batches of 786 KB apart: 0.19 ms of the trainer's CPU a batch against 0.17 joined).
APART_PARTS = 4
APART_BYTES = 16 * 2**20
SIZED_SESSIONS = 256  # sessions whose last reply's size a reader keeps


class ReplySizes:
    """The bytes a sample took in the last reply with samples of each of a reader's latest
    :data:`SIZED_SESSIONS` sessions: what a task's batches would take joined, before they are
    read (sessions differ: one may ask for labels only)."""

    def __init__(self) -> None:
        self._per_sample: OrderedDict[bytes, float] = OrderedDict()

    def note(self, token: bytes, nbytes: int, samples: int) -> None:
        """A reply of ``samples`` samples in ``nbytes`` bytes was made to session ``token``."""
        if samples <= 0:
            return
        self._per_sample[token] = nbytes / samples
        self._per_sample.move_to_end(token)
        if len(self._per_sample) > SIZED_SESSIONS:
            self._per_sample.popitem(last=False)

    def apart(self, token: bytes, parts: int, samples: int) -> bool:
        """Whether a task of session ``token`` of ``parts`` batches of ``samples`` samples in
        all is sent apart."""
        if parts <= APART_PARTS:
            return True
        per_sample = self._per_sample.get(token)
        return per_sample is None or per_sample * samples >= APART_BYTES


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker process needs (sent to the child by multiprocessing at spawn).

    Attributes:
        backend: the frontend's ipc:// endpoint.
        data_sndhwm: send high-water mark of the data socket per client (messages); above the
            most replies a client can have outstanding, so sends never meet a full queue.
        shards: shard URLs in index order.
        cache_dir: reader cache directory.
        transform: optional ``module:function``.
        transform_path: directory the transform's module is also looked for in
            (:mod:`dataflow.server.transform`); None: ``sys.path`` only.
        on_error: reader policy for damaged samples.
        tar: WebDataset conventions of tar shards.
        parent_pid: the server process; the worker exits when it is gone.
        log_level: logging level number.
        max_reply_bytes: most bytes of one reply's arrays.
        root: the dataset root, cut from shard paths in messages to clients.
        max_connections: client data connections kept at once.
        curve: the server's CURVE policy for the data socket (None: clear text).
        read: how readers convert columns (the index's ``read``).
        remote: storage options and cache size for remote shards.
        indexed: per shard, what the index recorded of it (identity, samples, schema):
            readers refuse a shard that changed since (:func:`indexed_shards`); empty: not
            checked.
        max_open_shards: shards a reader keeps open (:class:`ReaderCache`).
        cache_memory: bytes of decoded samples a reader caches (a ``Stages`` transform's
            decode stage, :mod:`dataflow.server.samplecache`); 0: none.
        cache_disk: the server's directory of the caches' disk tier
            (:mod:`dataflow.server.diskcache`); None: none.
        cache_disk_bytes: bytes of disk-tier files a reader keeps.
        cache_plan_window: most rows of a task's ``ahead``; > 0: the cache evicts by the
            windows sessions announce (:class:`~dataflow.server.eviction.PlanAware`), 0: LRU.
        plan_sessions: most sessions' windows a reader keeps.
        shared_indexes: most tar member indexes a reader maps shared with the host's other
            readers (the descriptors the server reserved for them:
            :mod:`~dataflow.readers.tar.sharedindex`); the rest are read into it.
    """

    backend: str
    data_sndhwm: int
    shards: tuple[str, ...]
    cache_dir: str | None
    transform: str | None
    on_error: str
    parent_pid: int
    log_level: int
    max_reply_bytes: int
    root: str
    max_connections: int
    curve: ServerCurve | None = None
    read: ReadOptions = ReadOptions()
    transform_path: str | None = None
    tar: TarOptions = DEFAULT_OPTIONS
    remote: RemoteConfig | None = None
    indexed: tuple[IndexedShard, ...] = ()
    max_open_shards: int = 1024
    cache_memory: int = 0
    cache_disk: str | None = None
    cache_disk_bytes: int = 0
    cache_plan_window: int = 0
    plan_sessions: int = 1
    shared_indexes: int = 0


def indexed_shards(index: DatasetIndex) -> tuple[IndexedShard, ...]:
    """What ``index`` recorded of each shard, for :attr:`WorkerSpec.indexed`."""
    return tuple(IndexedShard(ident, n, index.schema)
                 for ident, n in zip(index.identities, index.sizes, strict=True))


class ReaderCache:
    """An LRU of open shard readers (at most ``spec.max_open_shards`` open at once). Not
    thread-safe.

    A reader is opened with what the index recorded of its shard, so a shard changed since
    the index was built is refused (``ShardChangedError``, naming it), or under
    ``on_error="skip"`` serves none of its samples and counts them (see
    :func:`dataflow.readers.open_shard`); an open reader checks a local shard on every read.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self._spec = spec
        self._capacity = spec.max_open_shards
        self._lru = self._capacity < len(spec.shards)  # else nothing is ever closed
        self._open: OrderedDict[int, ShardReader] = OrderedDict()
        self.book = None if self._lru else AddressBook(len(spec.shards))

    def get(self, shard: int) -> ShardReader:
        """The open reader of ``shard`` (opened now if it is not).

        Raises:
            InternalError: ``shard`` is not a shard number of the dataset (the frontend
                admits no such request).
        """
        reader = self._open.get(shard)
        if reader is not None:
            if self._lru:
                self._open.move_to_end(shard)
            return reader
        spec = self._spec
        if not 0 <= shard < len(spec.shards):
            raise InternalError(f"no shard {shard} in a dataset of {len(spec.shards)}")
        reader = open_shard(spec.shards[shard], cache_dir=spec.cache_dir,
                            on_error=spec.on_error, options=spec.read, tar=spec.tar,
                            remote=spec.remote,
                            indexed=spec.indexed[shard] if spec.indexed else None)
        self._open[shard] = reader
        while len(self._open) > self._capacity:  # never with a book: shards fit, numbers checked
            self._open.popitem(last=False)[1].close()
        return reader

    def get_many(self, shards: list[int]) -> list[ShardReader]:
        """:meth:`get` of each of ``shards``, in order: one C loop where every shard stays
        open (the default shuffle's batches ask for hundreds)."""
        if self._lru:
            return [self.get(shard) for shard in shards]
        got = list(map(self._open.get, shards))
        if None in got:
            got = [reader if reader is not None else self.get(shard)
                   for shard, reader in zip(shards, got, strict=True)]
        return cast(list[ShardReader], got)

    def close(self) -> None:
        if self.book is not None:
            self.book.clear()
        while self._open:
            self._open.popitem()[1].close()


class SkipMeter:
    """Opens readers for one task and counts the samples each shard's readers skip meanwhile.

    A reader's ``skipped`` is cumulative; the change from when the task first got it is this
    task's. A reader closed by the LRU and opened again within the task counts from zero again.

    Called per shard, hundreds of times a batch of the sample shuffle: one dict entry per
    shard (its latest reader), the readers it replaced aside.
    """

    def __init__(self, readers: ReaderCache) -> None:
        self._readers = readers
        self._skip_mark, self._view_mark = TALLY.skip_changes, TALLY.views
        self._seen: dict[int, tuple[ShardReader, int]] = {}  # shard -> latest reader, skipped
        self._replaced: list[tuple[int, ShardReader, int]] = []  # earlier readers of a shard
        self._uncounted: dict[int, int] = {}  # shard -> skips of reads made to find which

    def get(self, shard: int) -> ShardReader:
        reader = self._readers.get(shard)
        self._note(shard, reader)
        return reader

    def get_many(self, shards: list[int]) -> list[ShardReader]:
        """The readers of ``shards`` (distinct), in order, for a gather across shards
        (:func:`~dataflow.readers.read_across`), not noted: that gather never changes what a
        reader skipped (it leaves such rows to the shard-by-shard read, whose :meth:`get`
        notes them before reading) and returns no views to verify, and noting hundreds of
        readers a batch of the default shuffle would cost more than the rest of its
        bookkeeping."""
        return self._readers.get_many(shards)

    def read(self, ranges: np.ndarray) -> Batch:
        """:func:`~dataflow.readers.read_ranges` of ``ranges`` with the readers got here (and
        the cache's :class:`~dataflow.readers.book.AddressBook`)."""
        return read_ranges(self.get, ranges, self.get_many, self._readers.book)

    def _note(self, shard: int, reader: ShardReader) -> None:
        """Count from now the samples ``reader`` (got for ``shard``) skips."""
        seen = self._seen.get(shard)
        if seen is None or seen[0] is not reader:
            if seen is not None:
                self._replaced.append((shard, *seen))
            self._seen[shard] = (reader, reader.skipped)

    def verify(self) -> None:
        """Check that no shard this task read changed since its reader opened it (after the
        last use of arrays that view a shard's map).

        Raises:
            ShardChangedError: naming the first that did.
        """
        if TALLY.views == self._view_mark:  # no read since the meter began returned views
            return
        for reader, _ in self._seen.values():
            reader.verify()

    def skips(self) -> dict[int, int]:
        """Samples skipped during the task, by shard (shards with none left out)."""
        if TALLY.skip_changes == self._skip_mark:  # no reader's count moved
            return {}
        out = {}
        for shard, (reader, before) in self._seen.items():
            if reader.skipped != before:
                out[shard] = reader.skipped - before
        if not self._replaced and not self._uncounted:
            return out
        for shard, reader, before in self._replaced:
            out[shard] = out.get(shard, 0) + reader.skipped - before
        for shard, n in self._uncounted.items():
            out[shard] = out.get(shard, 0) - n
        return {shard: n for shard, n in out.items() if n}

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Reads made meanwhile do not count in :meth:`skips` (reading samples again to learn
        which ones a read left out)."""
        before = self.skips()
        try:
            yield
        finally:
            for shard, n in self.skips().items():
                self._uncounted[shard] = self._uncounted.get(shard, 0) + n - before.get(shard,
                                                                                       0)


def transform_context(spec: WorkerSpec, ranges: np.ndarray, tag: BatchTag) -> TransformContext:
    """The context of the transform of the batch ``ranges`` tagged ``tag``."""
    shards = tuple((spec.shards[shard].removeprefix(spec.root), start, stop)
                   for shard, start, stop in ranges.tolist())
    return TransformContext(batch_seed(*tag), tag.epoch, tag.batch, shards)


class _Damaged(Exception):
    """Samples were left out as damaged while the misses of a cached batch were read: which
    ones is not known, so the task is served again without the cache."""


def serve_task(readers: ReaderCache, transform: Transform | None, spec: WorkerSpec,
               task: Task, segments: Segments | None = None,
               cache: SampleCache | None = None,
               sizes: ReplySizes | None = None) -> tuple[list[wire.Buffer], Sent]:
    """The reply to ``task`` (BATCH or ERROR) and the SENT notice that accounts for it; never
    raises.

    The transform sees every served field; the reply keeps ``task.columns`` of what it
    returned (:mod:`dataflow.subset`; None: every field). A read that fails on the data (a
    :class:`~dataflow.errors.DataflowError`: a damaged or changed shard, the transform, a batch
    over ``--max-reply-bytes``; or an ``OSError``) is answered with READ_FAILED. Any other
    exception, :class:`~dataflow.errors.InternalError` included, is a bug of the server: it is
    answered with INTERNAL and logged with its traceback. Either message starts with the
    exception's class name; shard paths in it are relative to the dataset root. A task that
    lent a shared-memory slot has its arrays written there by ``segments`` when they fit
    (:meth:`~dataflow.server.shmserve.Segments.place`). The SENT notice carries what the
    task did to ``cache`` (hits, misses, evictions) and the bytes it holds after. ``sizes``
    (the reader's; None: a fresh one) decides whether a task's batches are sent apart, and
    notes the reply's arrays.
    """
    before = cache.counts() if cache is not None else None
    sizes = ReplySizes() if sizes is None else sizes
    try:
        msg, meter = _batch(readers, transform, spec, task, cache, sizes)
        sizes.note(task.token, sum(a.nbytes for a in msg.arrays), msg.size)
        if segments is not None:
            msg = segments.place(task, msg)
        frames = wire.encode(msg)
        # Arrays may view a shard's map (Arrow): a shard rewritten since they were read fails
        # the reply here, even under --on-error skip (the batch is built). ZeroMQ reads the
        # frames sent zero-copy later still: a rewrite in place landing in that window (the
        # send, or the wait of a reply for a missing connection) is not seen.
        meter.verify()
    except Exception as e:
        frames, sent = _failed(spec, task, e)
    else:
        sent = Sent(task.token, task.req_id, _nbytes(frames), msg.size,
                    skips=tuple(sorted(meter.skips().items())))
    if cache is None or before is None:  # (before is None exactly when cache is)
        return frames, sent
    after = cache.counts()
    return frames, replace(sent, cache_hits=after.hits - before.hits,
                           cache_misses=after.misses - before.misses,
                           cache_evictions=after.evictions - before.evictions,
                           cache_bytes=after.bytes,
                           cache_disk_hits=after.disk_hits - before.disk_hits,
                           cache_disk_evictions=after.disk_evictions - before.disk_evictions,
                           cache_disk_bytes=after.disk_bytes)


def _batch(readers: ReaderCache, transform: Transform | None, spec: WorkerSpec,
           task: Task, cache: SampleCache | None,
           sizes: ReplySizes) -> tuple[wire.BatchMsg, SkipMeter]:
    """:func:`_batch_with` ``cache``; served again without it when the read of a cached
    batch's misses left samples out as damaged (:class:`_Damaged`)."""
    if cache is not None and transform is not None and transform.decode is not None:
        try:
            return _batch_with(readers, transform, spec, task, cache, sizes)
        except _Damaged:
            pass
    return _batch_with(readers, transform, spec, task, None, sizes)


def _batch_with(readers: ReaderCache, transform: Transform | None, spec: WorkerSpec,
                task: Task, cache: SampleCache | None,
                sizes: ReplySizes) -> tuple[wire.BatchMsg, SkipMeter]:
    """The BATCH answering ``task``, and the meter of the reads it made (the samples it left
    out as damaged, the shards to verify).

    A task with ``parts`` is each batch read, transformed and selected alone (its transform's
    seed and context are the batch's own), answered in one BATCH: sent apart (each batch's
    arrays in frames of their own, never joined by a copy) when ``sizes`` says so
    (:meth:`ReplySizes.apart`). Without a transform, other batches are read as one (one read,
    no copy where their rows lie in one record batch) and cut by their sizes; when samples
    were left out as damaged that read cannot say of which batch, and each batch is read again
    alone."""
    meter = SkipMeter(readers)
    if not task.parts:
        batch, left = _one(meter, transform, spec, task.ranges, task.tag, task.columns,
                           cache)
        msg = wire.batch_to_message(task.req_id, batch, len(left))
        return _checked(spec, _saying(msg, left)), meter
    apart = sizes.apart(task.token, len(task.parts), _samples(task.ranges))
    if transform is None and not apart:
        batch, left = _one(meter, None, spec, joined_ranges(task.ranges), task.tag,
                           task.columns, None)
        if not len(left):
            counts = [_samples(rows) for rows in _part_rows(task)]
            return _checked(spec, wire.parts_to_message(task.req_id, batch, counts)), meter
        meter = SkipMeter(readers)
    batches, lefts, before = [], [], 0
    for part, rows in zip(task.parts, _part_rows(task), strict=True):
        batch, left = _one(meter, transform, spec, rows, part.tag, task.columns, cache)
        batches.append(batch)
        lefts.append(np.where(left < 0, -1, left + before))
        before += _samples(rows)
    left = np.concatenate(lefts)
    msg = wire.batches_to_message(task.req_id, batches, len(left), apart=apart)
    return _checked(spec, _saying(msg, left)), meter


def _saying(msg: wire.BatchMsg, left: np.ndarray) -> wire.BatchMsg:
    """``msg`` with its ``left_out`` runs: which of the request's samples ``left`` (sorted
    positions, -1 where not known) it skipped; none when they are not all known or take more
    than :data:`~dataflow.wire.MAX_LEFT_OUT_RUNS` runs."""
    if not len(left) or (left < 0).any():
        return msg
    starts = np.flatnonzero(np.diff(left, prepend=-2) != 1)
    if len(starts) > wire.MAX_LEFT_OUT_RUNS:
        return msg
    stops = np.append(starts[1:], len(left)) - 1
    runs = np.stack([left[starts], left[stops] + 1], axis=1).reshape(-1)
    return replace(msg, left_out=tuple(runs.tolist()))


def _part_rows(task: Task) -> list[np.ndarray]:
    """The rows of ``task.ranges`` of each of its ``parts``."""
    bounds = np.cumsum([0, *(p.rows for p in task.parts)])
    return [task.ranges[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _samples(rows: np.ndarray) -> int:
    """Samples of int64 ``(shard, start, stop)`` rows (one row, a whole batch of consecutive
    samples, without numpy's reductions)."""
    if len(rows) == 1:
        _, start, stop = rows[0].tolist()
        return stop - start
    return int((rows[:, 2] - rows[:, 1]).sum())


def _checked(spec: WorkerSpec, msg: wire.BatchMsg) -> wire.BatchMsg:
    """``msg``, unless it is over ``--max-reply-bytes``.

    Raises:
        ReplyTooLarge: it is.
    """
    nbytes = sum(a.nbytes for a in msg.arrays)
    if nbytes > spec.max_reply_bytes:
        raise ReplyTooLarge(f"batch of {nbytes} bytes exceeds this server's "
                            f"--max-reply-bytes {spec.max_reply_bytes}; ask for fewer "
                            "samples a request")
    return msg


def _one(meter: SkipMeter, transform: Transform | None, spec: WorkerSpec, ranges: np.ndarray,
         tag: BatchTag, columns: tuple[str, ...] | None,
         cache: SampleCache | None) -> tuple[Batch, np.ndarray]:
    """One batch of ``ranges`` (``tag``) read, transformed (a decode stage through ``cache``)
    and selected, and which of its samples were left out as damaged (:func:`_left_out`)."""
    before = meter.skips()
    if transform is None:
        batch = meter.read(ranges)
    else:
        ctx = transform_context(spec, ranges, tag)
        if transform.decode is None:
            batch = meter.read(ranges)
        elif cache is None or not _samples(ranges):
            batch = decode_batch(transform, meter.read(ranges), ctx)
        else:
            batch = _decoded(meter, transform, ranges, ctx, cache)
        batch = apply_transform(transform, batch, ctx, columns)
    if columns is not None:
        batch = select(batch, columns)
    now = meter.skips()
    skipped = sum(now.values()) - sum(before.values())
    requested = _samples(ranges)
    if batch_len(batch) + skipped != requested:
        raise InternalError(f"batch of {batch_len(batch)} sample(s) with {skipped} skipped "
                            f"for a request of {requested}")
    if not skipped:
        return batch, np.zeros(0, dtype=np.int64)
    damaged = [shard for shard, n in now.items() if n > before.get(shard, 0)]
    with meter.uncounted():
        left = _left_out(meter, ranges, damaged)
    if len(left) != skipped:  # the damage read otherwise this time: not known which
        left = np.full(skipped, -1, dtype=np.int64)
    return batch, left


def _left_out(meter: SkipMeter, ranges: np.ndarray, damaged: list[int]) -> np.ndarray:
    """Positions among the samples of ``ranges`` (in order) that a read leaves out: each
    sample of the ``damaged`` shards read alone. A read of a damaged sample serves nothing
    under ``--on-error skip``; only batches with skipped samples pay for it."""
    lengths = ranges[:, 2] - ranges[:, 1]
    heads = np.cumsum(lengths) - lengths
    left = []
    for (shard, start, stop), head in zip(ranges.tolist(), heads.tolist(), strict=True):
        if shard not in damaged:
            continue
        for i in range(start, stop):
            if batch_len(read_ranges(meter.get, np.array([[shard, i, i + 1]]))) == 0:
                left.append(head + i - start)
    return np.asarray(left, dtype=np.int64)


def _decoded(meter: SkipMeter, transform: Transform, ranges: np.ndarray,
             ctx: TransformContext, cache: SampleCache) -> Batch:
    """The decoded samples of ``ranges`` in order: those ``cache`` holds, the others read,
    decoded as one batch and cached.

    Raises:
        _Damaged: the read of the misses left samples out as damaged.
    """
    keys = [(shard, row) for shard, start, stop in ranges.tolist()
            for row in range(start, stop)]
    found = [cache.get(key) for key in keys]
    missing = [i for i, sample in enumerate(found) if sample is None]
    decoded: dict[int, Sample] = {}
    if missing:
        skipped = sum(meter.skips().values())
        raw = meter.read(_runs([keys[i] for i in missing]))
        if sum(meter.skips().values()) != skipped:
            raise _Damaged
        batch = decode_batch(transform, raw, ctx)
        for i, sample in zip(missing, split(batch, copy=False), strict=True):
            decoded[i] = sample
            cache.put(keys[i], sample)
        if len(missing) == len(keys):
            return batch  # all decoded here: assembling the copies would give it again
    samples = [decoded[i] if sample is None else sample for i, sample in enumerate(found)]
    return assemble(samples, f"transform {transform.spec!r} (decode) on {ctx.describe()}")


def _runs(keys: list[tuple[int, int]]) -> np.ndarray:
    """``(shard, row)`` keys as int64 ``(shard, start, stop)`` ranges, consecutive rows of one
    shard joined, in order."""
    rows = np.asarray(keys, dtype=np.int64).reshape(-1, 2)
    return joined_ranges(np.column_stack([rows, rows[:, 1] + 1]))


def _failed(spec: WorkerSpec, task: Task, e: Exception) -> tuple[list[wire.Buffer], Sent]:
    """The ERROR answering ``task``, which raised ``e`` (see :func:`serve_task`)."""
    if isinstance(e, DataflowError | OSError) and not isinstance(e, InternalError):
        kind = ErrorKind.READ_FAILED
        log.warning("request %d failed: %s: %s", task.req_id, type(e).__name__, e)
    else:
        kind = ErrorKind.INTERNAL
        log.error("request %d failed on a bug of the server: %s: %s", task.req_id,
                  type(e).__name__, e, exc_info=e)
    text = f"{type(e).__name__}: {e}"
    if spec.root:
        text = text.replace(spec.root, "")
    frames = wire.encode(wire.ErrorMsg(task.req_id, kind, text))
    return frames, Sent(task.token, task.req_id, _nbytes(frames),
                        too_large=isinstance(e, ReplyTooLarge))


def _nbytes(frames: list[wire.Buffer]) -> int:
    return sum(memoryview(f).nbytes for f in frames)
