"""Parquet shards, read row group by row group.

The footer gives the sample count and every row group's length, so :meth:`read` decodes only
the row groups overlapping the requested range, plus (with small row groups) the following
ones up to ``READ_AHEAD_ROWS`` rows, decoded together so pyarrow spreads them over its
threads. The last decoded span is kept, because ranges usually arrive in order: a read that
starts inside it reuses its rows and decodes only what lies beyond. :meth:`read_many` takes
its rows from that span when they all lie in it, else decodes every row group the ranges
touch (only those) together, once. A sample-level shuffle touches most row groups of a shard
for a few rows each, so there decoding dominates: Parquet suits it less than Arrow or tar.

Pages are read with CRC verification on (``page_checksum_verification``): a page whose
stored CRC does not match is damage, caught whenever the writer stored CRCs
(``write_page_checksum=True``); pages without a CRC are not checked. A row group that fails to
decode is remembered as damaged and never decoded again. A read asking for its rows then
raises an error naming the row group and its first sample, or under ``on_error="skip"``
leaves them out (counted per read in ``skipped``); reads of other rows go on (a damaged row
group met only in a read-ahead fails nothing).

Parquet has no tensor type: a fixed-size list field whose Arrow field metadata carries
``b"dataflow.shape"`` (a JSON list, e.g. ``b"[3,64,64]"``) is read as that shape.

Only the columns :class:`~dataflow.convert.columns.ReadOptions` selects are decoded. Null
counts come from the row groups' statistics; a column whose statistics do not rule nulls out
is decoded once, row group by row group, to count them (when the index is built, not when
serving); a row group failing there is damage, raised or (``on_error="skip"``) remembered as
for a read.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Sequence
from typing import IO, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataflow.batch import Batch, Schema
from dataflow.convert.columns import ReadOptions
from dataflow.convert.tables import (
    DEFAULT,
    Census,
    census,
    check_selection,
    schema_of_arrow,
    wanted_columns,
)
from dataflow.errors import DataflowError, ShardReadError
from dataflow.readers.base import ShardReader, empty_batch
from dataflow.readers.damage import split_damaged
from dataflow.readers.gather import overlapping, range_rows, take_rows
from dataflow.readers.guard import FileGuard
from dataflow.storage.sources import open_file

log = logging.getLogger(__name__)

READ_AHEAD_ROWS = 1024


class _Span(NamedTuple):
    """Decoded rows ``[start, stop)`` of the shard."""

    start: int
    stop: int
    table: pa.Table


class _NewDamage(Exception):
    """Decoding found row groups not known to be damaged (now recorded): plan the read again."""


class ParquetReader(ShardReader):
    """A Parquet file; local shards are memory-mapped from ``guard`` (the open file, which
    the reader closes), remote ones read through ``source`` (a file over the remote bytes,
    see :func:`dataflow.readers.open_shard`), else fsspec."""

    def __init__(self, url: str, on_error: str = "raise", options: ReadOptions = DEFAULT,
                 source: IO[bytes] | None = None, *, guard: FileGuard | None = None) -> None:
        super().__init__(url, on_error, options)
        self._span: _Span | None = None
        self._bad: dict[int, ShardReadError] = {}
        self._guard = guard
        remote = None if guard is not None else source or open_file(url)
        try:
            self._file = pq.ParquetFile(guard.path if guard is not None else remote,
                                        memory_map=guard is not None,
                                        page_checksum_verification=True)
        except (OSError, pa.ArrowInvalid) as e:
            if remote is not None:
                remote.close()
            raise ShardReadError(url, f"not a readable Parquet file: {e}", offset=0) from e
        try:
            arrow_schema = self._file.schema_arrow
            self.schema: Schema = schema_of_arrow(arrow_schema, options)
            check_selection(arrow_schema, options, url)
            self._columns = wanted_columns(arrow_schema, options)
        except DataflowError as e:
            self._file.close()
            if remote is not None:
                remote.close()
            raise ShardReadError(url, str(e)) from e
        self._remote = remote
        meta = self._file.metadata
        self._lengths = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._bounds = [0, *itertools.accumulate(self._lengths)]
        self._bounds_np = np.array(self._bounds, dtype=np.int64)

    def __len__(self) -> int:
        return self._bounds[-1]

    def _decode(self, groups: Sequence[int]) -> pa.Table:
        """Row groups ``groups`` (ascending, none known damaged), decoded together (in
        parallel).

        Raises:
            _NewDamage: after recording the damaged row groups.
        """
        try:
            return self._file.read_row_groups(groups, columns=self._columns)
        except (OSError, pa.ArrowInvalid) as e:
            if len(groups) == 1:
                self._found_damage(groups[0], e)
                raise _NewDamage from e
        for g in groups:  # which of them: decode one by one (only ever on damage)
            try:
                self._file.read_row_groups([g], columns=self._columns)
            except (OSError, pa.ArrowInvalid) as e:
                self._found_damage(g, e)
        if not any(g in self._bad for g in groups):
            raise ShardReadError(self.url, f"row groups {groups[0]}..{groups[-1]} fail to decode "
                                 "together but not one by one", index=self._bounds[groups[0]])
        raise _NewDamage

    def _found_damage(self, group: int, e: Exception) -> None:
        lo, hi = self._bounds[group], self._bounds[group + 1]
        err = ShardReadError(self.url, f"row group {group} (samples {lo}..{hi - 1}) is "
                             f"damaged: {e}", index=lo)
        err.__cause__ = e
        log.warning("damage found: %s", err)
        self._bad[group] = err

    def _rows(self, start: int, stop: int) -> pa.Table:
        """Rows ``[start, stop)`` as a table, reusing the decoded span where it overlaps."""
        span, bounds = self._span, self._bounds
        if span is not None and span.start <= start < span.stop:
            if stop <= span.stop:
                return span.table.slice(start - span.start, stop - start)
            kept, row0 = span.table.slice(start - span.start), start
            first = bisect.bisect_left(bounds, span.stop)
        else:
            kept, first = None, bisect.bisect_right(bounds, start) - 1
            row0 = bounds[first]
        last = first
        while last + 1 < len(self._lengths) and last + 1 not in self._bad and (
            bounds[last + 1] < stop or bounds[last + 1] - row0 < READ_AHEAD_ROWS
        ):
            last += 1
        new = self._decode(range(first, last + 1))
        table = new if kept is None else pa.concat_tables([kept, new])
        self._span = _Span(row0, bounds[last + 1], table)
        return table.slice(start - row0, stop - start)

    def _read(self, start: int, stop: int) -> Batch:
        while True:
            try:
                if any(g in self._bad for g in overlapping(self._bounds, start, stop)):
                    return self._gather(np.arange(start, stop, dtype=np.int64))
                return self._from_arrow(self._rows(start, stop), start)
            except _NewDamage:
                continue  # at most once per row group: each retry knows one more damaged

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        while True:
            try:
                return self._gather(range_rows(starts, stops))
            except _NewDamage:
                continue

    def _gather(self, rows: np.ndarray) -> Batch:
        """Rows ``rows`` (int64, shape ``(n,)``, any order) less those of damaged row groups,
        which raise or are counted (once the read succeeds, so a retried read counts once)."""
        rows, lost = split_damaged(rows, self._bounds_np, self._bad)
        batch = self._take(rows) if len(rows) else empty_batch(self.schema)
        self._lose(lost, self._bad)
        return batch

    def _take(self, rows: np.ndarray) -> Batch:
        span = self._span
        if span is not None and span.start <= rows.min() and rows.max() < span.stop:
            table, origins = span.table, np.arange(span.start, span.stop, dtype=np.int64)
        else:
            table, origins = self._decode_touched(rows)
        chunks = table.to_batches()
        bounds = np.array([0, *itertools.accumulate(c.num_rows for c in chunks)], dtype=np.int64)

        def chunk(i: int) -> Batch:
            return self._from_arrow(chunks[i], int(origins[bounds[i]]))

        return take_rows(self.schema, chunk, bounds, np.searchsorted(origins, rows))

    def _decode_touched(self, rows: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Every row group holding one of ``rows``, decoded together; kept as the span when
        they are consecutive and, like a span :meth:`read` keeps, hold at most
        ``READ_AHEAD_ROWS`` rows beyond the ``len(rows)`` asked for.

        Returns:
            The table and, per table row, its row in the shard (int64, ascending).
        """
        bounds = self._bounds_np
        groups = np.unique(np.searchsorted(bounds, rows, side="right") - 1)
        table = self._decode(groups.tolist())
        first, last = int(groups[0]), int(groups[-1])
        if last - first + 1 == len(groups) and table.num_rows <= len(rows) + READ_AHEAD_ROWS:
            self._span = _Span(self._bounds[first], self._bounds[last + 1], table)
        return table, range_rows(bounds[groups], bounds[groups + 1])

    def census(self) -> Census:
        meta = self._file.metadata
        maybe: set[str] = set()
        if self.options.dictionary == "codes":
            maybe |= {f.name for f in self._file.schema_arrow
                      if f.name in self._columns and pa.types.is_dictionary(f.type)}
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            for j in range(rg.num_columns):
                col = rg.column(j)
                top = col.path_in_schema.split(".")[0]
                stats = col.statistics
                if top in self._columns and (stats is None or not stats.has_null_count
                                             or stats.null_count):
                    maybe.add(top)
        out = Census({}, {})
        columns = [c for c in self._columns if c in maybe]
        for g in range(meta.num_row_groups) if columns else ():
            try:
                out.add(census(self._file.read_row_group(g, columns=columns), self.options))
            except (OSError, pa.ArrowException) as e:
                if self.on_error == "raise":
                    lo = self._bounds[g]
                    raise ShardReadError(self.url, f"row group {g} (samples {lo}..) is damaged: "
                                         f"counting its nulls failed: {e}", index=lo) from e
                self._found_damage(g, e)
        return out

    def close(self) -> None:
        self.closed = True
        self._span = None
        self._file.close()
        if self._remote is not None:
            self._remote.close()
        if self._guard is not None:
            self._guard.close()
