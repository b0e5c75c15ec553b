"""The shard reader interface every format implements."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from dataflow.batch import Batch, Ragged, Schema, batch_len, concat
from dataflow.convert.columns import Census, ReadOptions, hive_columns
from dataflow.errors import DataflowError, ShardChangedError, ShardReadError
from dataflow.readers.damage import MAX_SKIP_LOG, SkipRecord, check_on_error
from dataflow.readers.guard import FileGuard
from dataflow.readers.sink import BatchSink

if TYPE_CHECKING:
    import pyarrow as pa

    from dataflow.readers.across import RowSource

log = logging.getLogger(__name__)

_DEFAULT = ReadOptions()


class Tally:
    """Counts over every reader of the process, so that a caller holding hundreds of readers
    can tell at once that none of them skipped a sample, or returned rows that may view a
    map, since it last looked (:class:`~dataflow.server.tasks.SkipMeter`, per batch).

    Attributes:
        skip_changes: changes of any reader's ``skipped``.
        views: reads that returned rows a later :meth:`ShardReader.verify` must cover.
    """

    skip_changes = 0
    views = 0


TALLY = Tally()
"""This process's :class:`Tally`."""


class ShardReader(ABC):
    """Random access to the samples of one shard, as columnar batches.

    Attributes:
        url: the shard's URL or local path.
        schema: the type of every field, identical for every sample.
        on_error: ``"raise"`` (damage raises :class:`ShardReadError`) or ``"skip"``.
        skipped: samples of this shard not served because of damage (``on_error="skip"``;
            always 0 under ``"raise"``), cumulative over the reader's life. Two parts:

            * dropped when the shard was opened (once per occurrence: a tar's damaged
              sample, a sample that lost members, a repeated key; the rows of the Arrow
              stream record batch where a damaged stream ends, when its metadata gives
              them); such samples are not in ``len(self)``, so no read asks for them, and
              this part is fixed once the reader is open;
            * asked for by a read but not returned (Parquet row groups and Arrow record
              batches found damaged when decoded, every row of a local shard found changed
              since it was opened), counted per read: a sample asked for twice and lost
              twice counts twice.

            So across any :meth:`read` or :meth:`read_many` call, the increase of ``skipped``
            plus the rows returned equals the rows asked for, exactly.
        skip_log: the latest :data:`MAX_SKIP_LOG` :class:`SkipRecord`, oldest first; while
            none has been dropped, their counts sum to ``skipped``.
        closed: whether :meth:`close` was called.
        options: which columns are served and how (Arrow and Parquet shards).

    A reader of a local shard holds the file it maps open (:mod:`dataflow.readers.guard`) and
    checks that it has not changed before and after every read: a changed file is never
    touched and nothing read while it changed is returned; the read raises
    :class:`~dataflow.errors.ShardChangedError`, or under ``on_error="skip"`` returns none of
    the rows asked for and counts them.

    A reader is not thread-safe: use one reader per thread. ``close()`` is idempotent.
    """

    url: str
    schema: Schema
    closed: bool = False
    _guard: FileGuard | None = None
    _viewed = False
    """Whether a read returned rows since the last :meth:`verify`."""
    _skipped = 0
    _row_lent: RowSource | None = None
    """What :meth:`_row_source` prepared, where a format prepares one: a gather across shards
    reads it without a call first."""

    @property
    def skipped(self) -> int:
        """Samples left out as damaged so far (cumulative); every change counts in
        :data:`TALLY`."""
        return self._skipped

    @skipped.setter
    def skipped(self, value: int) -> None:
        if value != self._skipped:
            TALLY.skip_changes += 1
        self._skipped = value

    def __init__(self, url: str, on_error: str, options: ReadOptions = _DEFAULT) -> None:
        self.url = url
        self.options = options
        self.on_error = check_on_error(on_error)
        self.skipped = 0
        self.skip_log: deque[SkipRecord] = deque(maxlen=MAX_SKIP_LOG)

    @abstractmethod
    def __len__(self) -> int:
        """Number of samples in the shard."""

    @abstractmethod
    def _read(self, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)``; the range is already validated and not empty."""

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        """Rows of every range ``[starts[i], stops[i])``, in order; ranges validated, none empty.

        This default reads range by range and concatenates; formats override it with one
        vectorized gather.
        """
        return concat([self._read(a, b) for a, b in zip(starts.tolist(), stops.tolist(),
                                                         strict=True)])

    def _read_into(self, starts: np.ndarray, stops: np.ndarray, sink: BatchSink) -> Batch:
        """:meth:`_read_many`, its fixed-size columns written at ``sink``'s rows where the
        format gathers straight there (see :meth:`read_many`); this default returns arrays of
        its own, which :meth:`read_many` copies there."""
        return self._read_many(starts, stops)

    def _row_source(self) -> RowSource | None:
        """What this reader lends a gather of one request's rows across many shards
        (:mod:`dataflow.readers.across`), prepared once and kept while it is open; ``None``
        when it takes no part (this default), and the request is read shard by shard."""
        return None

    def census(self) -> Census:
        """Null counts and dictionary values over the shard (see :class:`Census`); formats
        without either (tar) have none."""
        return Census({}, {})

    @abstractmethod
    def close(self) -> None:
        """Release files and memory maps (idempotent)."""

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)`` of the shard as one batch.

        Any range can be read without reading from the start of the shard. Arrays may be
        read-only views of a memory-mapped file. Under ``on_error="skip"`` the rows of damaged
        units are left out (the batch has fewer rows, in order) and counted in ``skipped``.

        Raises:
            ShardReadError: the reader is closed, the range is outside ``[0, len(self)]``, or
                the shard is damaged.
        """
        if self.closed:
            raise ShardReadError(self.url, "read after close()")
        n = len(self)
        if not (0 <= start <= stop <= n):
            raise ShardReadError(self.url, f"range [{start}, {stop}) outside [0, {n}]")
        if start == stop:
            return empty_batch(self.schema)
        return self._guarded(lambda: self._read(start, stop), stop - start)

    def read_many(self, starts: np.ndarray, stops: np.ndarray,
                  sink: BatchSink | None = None) -> Batch:
        """The rows of several ranges of the shard, as one batch.

        Equal to concatenating ``read(starts[i], stops[i])`` for every ``i``, in order (ranges
        may overlap, repeat, be empty or come in any order), but gathered in one pass where
        the format allows: much faster than :meth:`read` per range for many small ranges.
        Under ``on_error="skip"`` rows of damaged units are left out and counted, as in
        :meth:`read`.

        Args:
            starts: int array of shape ``(n,)``, first row of each range.
            stops: int array of shape ``(n,)``, one past the last row of each range.
            sink: the batch this read is part of (:mod:`dataflow.readers.sink`): the
                fixed-size columns returned are then views of ``sink``'s rows
                ``[sink.at, sink.at + rows returned)``, written there (by the format's gather
                where it can, else copied); the caller advances the sink. None: arrays of
                the read's own.

        Raises:
            ShardReadError: the reader is closed, a range is outside ``[0, len(self)]``
                (naming the first such range), or the shard is damaged.
        """
        if self.closed:
            raise ShardReadError(self.url, "read after close()")
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        stops = np.asarray(stops, dtype=np.int64).reshape(-1)
        if starts.shape != stops.shape:
            raise ShardReadError(self.url, f"{len(starts)} range starts but {len(stops)} stops")
        n = len(self)
        if len(starts) == 1:  # a batch of consecutive rows: checked without numpy's reductions
            start, stop = int(starts[0]), int(stops[0])
            if not 0 <= start <= stop <= n:
                raise ShardReadError(self.url, f"range [{start}, {stop}) outside [0, {n}]")
            if start == stop:
                return empty_batch(self.schema)
            if sink is None:
                return self._guarded(lambda: self._read(start, stop), stop - start)
            return sink.put(self._guarded(lambda: self._read_into(starts, stops, sink),
                                          stop - start))
        lengths = stops - starts
        if len(starts) and (starts.min() < 0 or lengths.min() < 0 or stops.max() > n):
            i = int(np.flatnonzero((starts < 0) | (lengths < 0) | (stops > n))[0])
            raise ShardReadError(
                self.url, f"range [{starts[i]}, {stops[i]}) outside [0, {n}]"
            )
        if not lengths.all():
            keep = lengths > 0
            starts, stops, lengths = starts[keep], stops[keep], lengths[keep]
        rows = int(lengths.sum())
        if not rows:
            return empty_batch(self.schema)
        if sink is not None:
            return sink.put(self._guarded(lambda: self._read_into(starts, stops, sink), rows))
        if len(starts) == 1:
            return self._guarded(lambda: self._read(int(starts[0]), int(stops[0])), rows)
        return self._guarded(lambda: self._read_many(starts, stops), rows)

    def verify(self) -> None:
        """Raise if a local shard changed since a read returned rows of it, not verified yet
        (arrays a read returns may view the file's map: checked after their last use). A
        read that lost its rows to the change returned none, so needs no check.

        Raises:
            ShardChangedError: it changed.
        """
        viewed, self._viewed = self._viewed, False
        if viewed and self._guard is not None and not self.closed:
            self._guard.check()

    def _guarded(self, read: Callable[[], Batch], rows: int) -> Batch:
        """``read()``, between two checks that the shard did not change; a change loses
        every one of the ``rows`` asked for (raised, or under ``on_error="skip"`` counted)."""
        if self._guard is None:
            return read()
        before = self.skipped
        try:
            self._guard.check()
            try:
                batch = read()
            except Exception:
                self._guard.check()  # a read that failed because the file changed says so
                raise
            self._guard.check()
        except ShardChangedError as e:
            if self.on_error == "raise":
                raise
            self._lose({0: rows - (self.skipped - before)}, {0: e})
            return empty_batch(self.schema)
        if batch_len(batch) > 0:
            self._viewed = True
            TALLY.views += 1
        return batch

    def _damaged(self, err: ShardReadError, count: int = 0) -> None:
        """Damage found on open that loses rows not in ``len(self)``: raised under
        ``on_error="raise"``, else logged, recorded and counted in ``skipped`` with the
        ``count`` rows known lost (0 when how many is unknown)."""
        if self.on_error == "raise":
            raise err
        log.warning("skipping: %s", err)
        self.skipped += count
        self.skip_log.append(SkipRecord.of(err, count))

    def _lose(self, lost: Mapping[int, int], damage: Mapping[int, ShardReadError]) -> None:
        """A read asked for ``lost[u]`` rows of each damaged unit ``u`` (damage ``damage[u]``):
        under ``on_error="raise"`` raise the first such unit's error, else count them.

        Damage found while decoding more than a read asked for (a read-ahead) is remembered
        by the caller and only raised or counted when a read asks for those rows.
        """
        if lost and self.on_error == "raise":
            raise damage[min(lost)]
        for unit, n in lost.items():
            self.skipped += n
            self.skip_log.append(SkipRecord.of(damage[unit], n))

    def _from_arrow(self, table: pa.Table | pa.RecordBatch, start: int) -> Batch:
        """Convert rows of this shard starting at ``start`` to a batch of ``self.schema``.

        Only the Arrow and Parquet readers call this, so pyarrow is imported here, not with
        the module (a tar-only server never loads it).
        """
        from dataflow.convert.tables import from_arrow

        try:
            batch = from_arrow(table, self.schema, self.options)
            if self.options.hive:
                batch.update(hive_columns(self.url, self.options, table.num_rows))
        except (DataflowError, pa.ArrowException) as e:
            raise ShardReadError(self.url, str(e), index=start) from e
        return batch

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, samples={len(self)})"


def empty_batch(schema: Schema) -> Batch:
    """A batch of zero samples with the columns ``schema`` describes."""
    out: Batch = {}
    for f in schema:
        if f.ragged is None:
            out[f.name] = np.empty((0, *f.shape), dtype=f.dtype)
        else:
            out[f.name] = Ragged(np.empty(0, dtype=f.dtype), np.zeros(1, dtype=np.int64), f.ragged)
    return out
