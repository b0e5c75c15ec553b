"""Arrow IPC shards: the file format (``ARROW1`` footer) and the stream format.

Shards are memory-mapped (a remote shard is first downloaded once into ``cache_dir``, like a
remote tar), so record batches are zero-copy views of the page cache. The list of record
batches is built on open (for a stream, by reading it once; for a file, from its footer) and
:meth:`read` slices them: a range inside one record batch is zero-copy, a range spanning
several is concatenated (one copy). :meth:`read_many` converts each touched record batch once
(zero-copy views, kept until close) and gathers the rows of every range with numpy (one copy).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod

import numpy as np
import pyarrow as pa

from dataflow.batch import Batch, Schema
from dataflow.convert import schema_of_arrow
from dataflow.errors import DataflowError, ShardReadError
from dataflow.readers.base import ShardReader, overlapping, range_rows
from dataflow.readers.cache import local_copy
from dataflow.readers.gather import take_rows
from dataflow.sources import is_local, local_path


class _ArrowReader(ShardReader):
    """Rows of a list of memory-mapped record batches."""

    def __init__(self, url: str, cache_dir: str) -> None:
        self.url = url
        path = local_path(url) if is_local(url) else local_copy(url, cache_dir, gunzip=False)
        try:
            self._source = pa.memory_map(path, "r")
        except (OSError, ValueError) as e:
            raise ShardReadError(url, f"cannot open shard: {e}", offset=0) from e
        try:
            schema, self._batches = self._load(self._source)
            self.schema = self._convert_schema(schema)
        except BaseException:
            self._source.close()
            raise
        self._lengths = [b.num_rows for b in self._batches]
        self._bounds = [0, *itertools.accumulate(self._lengths)]
        self._views: dict[int, Batch] = {}

    @abstractmethod
    def _load(self, source: pa.MemoryMappedFile) -> tuple[pa.Schema, list[pa.RecordBatch]]:
        """The schema and every record batch (views of ``source``)."""

    def _convert_schema(self, schema: pa.Schema) -> Schema:
        try:
            return schema_of_arrow(schema)
        except DataflowError as e:
            raise ShardReadError(self.url, str(e)) from e

    def __len__(self) -> int:
        return self._bounds[-1]

    def _read(self, start: int, stop: int) -> Batch:
        parts = []
        for i in overlapping(self._bounds, start, stop):
            lo = max(start - self._bounds[i], 0)
            hi = min(stop - self._bounds[i], self._lengths[i])
            parts.append(self._batches[i].slice(lo, hi - lo))
        table = parts[0] if len(parts) == 1 else pa.Table.from_batches(parts)
        return self._from_arrow(table, start)

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        bounds = np.array(self._bounds, dtype=np.int64)
        return take_rows(self.schema, self._view, bounds, range_rows(starts, stops))

    def _view(self, i: int) -> Batch:
        """Record batch ``i`` as a batch of views of the map, converted once."""
        view = self._views.get(i)
        if view is None:
            view = self._views[i] = self._from_arrow(self._batches[i], self._bounds[i])
        return view

    def close(self) -> None:
        self.closed = True
        self._batches = []
        self._views = {}
        self._source.close()


class ArrowFileReader(_ArrowReader):
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
                raise ShardReadError(self.url, f"record batch {i} is damaged: {e}") from e
        return reader.schema, batches


class ArrowStreamReader(_ArrowReader):
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
                raise ShardReadError(self.url, f"damaged record batch: {e}", offset=offset) from e
