"""Arrow IPC shards: the file format (``ARROW1`` footer) and the stream format.

Local shards are memory-mapped, so record batches are zero-copy views of the page cache (remote
ones are read by :mod:`dataflow.readers.arrowremote`). The list of record
batches is built on open (for a stream, by reading it once; for a file, from its footer) and
:meth:`read` slices them: a range inside one record batch is zero-copy, a range spanning
several is concatenated (one copy). :meth:`read_many` converts each touched record batch once
(zero-copy views, kept until close) and gathers the rows of every range with numpy (one copy).

Arrow IPC stores no checksums, so damage is found only where it breaks the structure. A
record batch that cannot be read fails the open (under ``on_error="skip"``: a file's batch
is dropped, and its rows cannot be counted, which a
:class:`~dataflow.readers.damage.SkipRecord` of count 0 says; a stream's remaining batches are
lost: the rows of the first one are counted when its metadata is readable, as in a stream
cut short, those of any after it cannot be). A record batch is fully validated (offsets in
bounds, UTF-8, ...) the first time a read touches it; a read asking for rows of one that
fails raises an error naming it and its first sample, or under ``on_error="skip"`` leaves its
rows out, counted per read in ``skipped``.
"""

from __future__ import annotations

import itertools
import logging
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from dataflow.batch import Batch, Schema
from dataflow.convert.columns import Census, ReadOptions
from dataflow.convert.tables import DEFAULT, census, check_selection, schema_of_arrow
from dataflow.errors import DataflowError, ShardReadError
from dataflow.readers.arrowmeta import record_batch_meta
from dataflow.readers.arrowrows import ArrowRows
from dataflow.readers.base import ShardReader, empty_batch
from dataflow.readers.damage import split_damaged
from dataflow.readers.gather import overlapping, range_rows, take_rows
from dataflow.readers.guard import FileGuard
from dataflow.readers.sink import BatchSink

log = logging.getLogger(__name__)


class ArrowBatches(ShardReader):
    """Rows of a list of record batches (``self._batches``, set by the subclass with
    :meth:`_set_lengths`)."""

    _batches: Sequence[pa.RecordBatch]

    def _set_lengths(self, lengths: list[int]) -> None:
        """Record the record batches' row counts (``self._batches`` holds the batches)."""
        self._lengths = lengths
        self._bounds = [0, *itertools.accumulate(self._lengths)]
        self._bounds_np = np.array(self._bounds, dtype=np.int64)
        self._views: dict[int, Batch] = {}
        self._valid: set[int] = set()
        self._bad: dict[int, ShardReadError] = {}

    def _convert_schema(self, schema: pa.Schema) -> Schema:
        try:
            out = schema_of_arrow(schema, self.options)
            check_selection(schema, self.options, self.url)
        except DataflowError as e:
            raise ShardReadError(self.url, str(e)) from e
        return out

    def census(self) -> Census:
        """Null counts from the record batches' metadata (and validity bitmaps of struct
        children); a record batch where counting fails is damage: raised, or under
        ``on_error="skip"`` remembered like damage a read finds (its rows are then left out
        and counted by the reads asking for them)."""
        out = Census({}, {})
        for i, batch in enumerate(self._batches):
            try:
                out.add(census(batch, self.options))
            except (pa.ArrowException, DataflowError) as e:
                lo, hi = self._bounds[i], self._bounds[i + 1]
                err = ShardReadError(self.url, f"record batch {i} (samples {lo}..{hi - 1}) is "
                                     f"damaged: counting its nulls failed: {e}", index=lo)
                if self.on_error == "raise":
                    raise err from e
                log.warning("damage found: %s", err)
                self._bad[i] = err
        return out

    def __len__(self) -> int:
        return self._bounds[-1]

    def _check(self, chunks: Iterable[int]) -> None:
        """Fully validate record batches ``chunks`` not yet validated; remember the damaged."""
        for i in chunks:
            if i in self._valid or i in self._bad:
                continue
            try:
                self._batches[i].validate(full=True)
            except (pa.ArrowInvalid, OSError) as e:
                lo, hi = self._bounds[i], self._bounds[i + 1]
                err = ShardReadError(self.url, f"record batch {i} (samples {lo}..{hi - 1}) is "
                                     f"damaged: {e}", index=lo)
                err.__cause__ = e
                log.warning("damage found: %s", err)
                self._bad[i] = err
                continue
            self._valid.add(i)

    def _read(self, start: int, stop: int) -> Batch:
        chunks = overlapping(self._bounds, start, stop)
        self._check(chunks)
        if any(i in self._bad for i in chunks):
            return self._gather(np.arange(start, stop, dtype=np.int64))
        parts = []
        for i in chunks:
            lo = max(start - self._bounds[i], 0)
            hi = min(stop - self._bounds[i], self._lengths[i])
            parts.append(self._batches[i].slice(lo, hi - lo))
        table = parts[0] if len(parts) == 1 else pa.Table.from_batches(parts)
        return self._from_arrow(table, start)

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        return self._gather(range_rows(starts, stops))

    def _read_into(self, starts: np.ndarray, stops: np.ndarray, sink: BatchSink) -> Batch:
        return self._gather(range_rows(starts, stops), sink)

    def _gather(self, rows: np.ndarray, sink: BatchSink | None = None) -> Batch:
        """Rows ``rows`` (int64, shape ``(n,)``, any order), less those of damaged record
        batches, which are counted; the fixed-size columns at ``sink``'s rows when there is
        one."""
        self._check(np.unique(np.searchsorted(self._bounds_np, rows, side="right") - 1).tolist())
        rows, lost = split_damaged(rows, self._bounds_np, self._bad)
        self._lose(lost, self._bad)
        if not len(rows):
            return empty_batch(self.schema)
        return take_rows(self.schema, self._view, self._bounds_np, rows, sink)

    def _view(self, i: int) -> Batch:
        """Record batch ``i`` as a batch of views of the map, converted once."""
        view = self._views.get(i)
        if view is None:
            view = self._views[i] = self._from_arrow(self._batches[i], self._bounds[i])
        return view

    def _walk_ends(self, what: str, offset: int, row: int, size: int,
                   read: Callable[[int, int], bytes], e: Exception) -> None:
        """The message at byte ``offset`` (``what``: the record batch starting at row
        ``row``) of a shard of ``size`` bytes cannot be read, so a walk over the shard's
        messages ends there: that record batch and whatever follows are lost. Its rows are
        counted when its metadata gives them; when its body would reach the shard's end (a
        shard cut short) nothing follows it, else the record batches after it cannot be
        counted. Raised under ``on_error="raise"``.
        """
        meta = record_batch_meta(read, offset)
        if meta is None:
            lost = "it and the rest of the shard are lost (how many rows is unknown)"
        elif meta.end >= size:
            lost = f"its {meta.rows} row(s) are lost (the shard ends within it)"
        else:
            lost = (f"its {meta.rows} row(s) and the rest of the shard, from byte offset "
                    f"{meta.end}, are lost (how many rows there is unknown)")
        self._damaged(ShardReadError(self.url, f"{what} is unreadable: {lost}: {e}",
                                     offset=offset, index=row),
                      0 if meta is None else meta.rows)

    def close(self) -> None:
        self.closed = True
        self._batches = []
        self._views = {}


class _MappedReader(ArrowBatches):
    """A local Arrow shard, memory-mapped: record batches are views of the map."""

    _rows: ArrowRows | None = None

    def __init__(self, url: str, on_error: str = "raise", options: ReadOptions = DEFAULT,
                 *, guard: FileGuard) -> None:
        """Map the shard open as ``guard`` (which the reader closes) and list its record
        batches."""
        super().__init__(url, on_error, options)
        self._guard = guard
        self._row_lent: ArrowRows | None = None
        try:
            self._source = pa.memory_map(guard.path, "r")
        except (OSError, ValueError) as e:
            raise ShardReadError(url, f"cannot open shard: {e}", offset=0) from e
        try:
            schema, batches = self._load(self._source)
            self.schema = self._convert_schema(schema)
        except BaseException:
            self._source.close()
            raise
        self._batches = batches
        self._set_lengths([b.num_rows for b in batches])

    @abstractmethod
    def _load(self, source: pa.MemoryMappedFile) -> tuple[pa.Schema, list[pa.RecordBatch]]:
        """The schema and every readable record batch (views of ``source``)."""

    def _row_source(self) -> ArrowRows | None:
        """The record batches' column views (:mod:`dataflow.readers.arrowrows`)."""
        if self._row_lent is None and not self.closed:
            self._row_lent = ArrowRows(self)
        return self._row_lent

    def close(self) -> None:
        self._row_lent = None  # it views the map
        super().close()
        self._source.close()
        if self._guard is not None:
            self._guard.close()


class ArrowFileReader(_MappedReader):
    """An Arrow IPC file (``ARROW1`` magic, footer with record-batch offsets)."""

    def _load(self, source: pa.MemoryMappedFile) -> tuple[pa.Schema, list[pa.RecordBatch]]:
        try:
            reader = pa.ipc.open_file(source)
        except (pa.ArrowInvalid, OSError) as e:
            raise ShardReadError(
                self.url, f"not a readable Arrow IPC file: {e}", offset=source.size()
            ) from e
        batches = []
        for i in range(reader.num_record_batches):
            try:
                batches.append(reader.get_batch(i))
            except (pa.ArrowInvalid, OSError) as e:
                self._damaged(ShardReadError(
                    self.url, f"record batch {i} of the file is unreadable, dropped with its "
                    f"rows (how many is unknown): {e}", index=sum(b.num_rows for b in batches),
                ))
        return reader.schema, batches


class ArrowStreamReader(_MappedReader):
    """An Arrow IPC stream (no footer), e.g. Hugging Face ``datasets``' ``data-*.arrow``."""

    def _load(self, source: pa.MemoryMappedFile) -> tuple[pa.Schema, list[pa.RecordBatch]]:
        try:
            reader = pa.ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError) as e:
            raise ShardReadError(
                self.url, f"not a readable Arrow IPC stream: {e}", offset=0
            ) from e
        batches = []
        while True:
            offset = source.tell()
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                return reader.schema, batches
            except (pa.ArrowInvalid, OSError) as e:
                self._walk_ends(f"record batch {len(batches)} of the stream", offset,
                                sum(b.num_rows for b in batches), source.size(),
                                lambda a, b: _read_at(source, a, b), e)
                return reader.schema, batches


def _read_at(source: pa.MemoryMappedFile, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``source``, clipped to it."""
    stop = min(stop, source.size())
    return source.read_at(stop - start, start) if start < stop else b""
