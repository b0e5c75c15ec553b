"""Remote Arrow IPC shards (file or stream), read by record batch rather than downloaded.

On open the shard is walked once, message by message, through a buffered
:class:`~dataflow.storage.remotefile.RemoteStream` (8 MiB ranged reads, blocks kept in the
bounded cache): the reader keeps only each record batch's byte span and row count. A read
fetches the spans of the record batches it touches (from the cache when they are there),
decodes them and keeps the last :data:`KEEP_BATCHES` decoded, so memory stays a few record
batches per open shard whatever the shard's size.

An Arrow IPC file holds the stream format after its 8-byte magic, so both kinds are walked
the same way (the file's footer is not needed). Dictionary-encoded columns are refused.
Damage met by the walk follows the stream reader's rule: the batch and the rest of the shard
are lost (under ``on_error="skip"`` recorded, the batch's rows counted when its metadata
gives them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import overload

import pyarrow as pa

from dataflow.batch import Batch
from dataflow.convert.columns import ReadOptions
from dataflow.convert.tables import DEFAULT
from dataflow.errors import ShardReadError
from dataflow.readers.arrow import ArrowBatches
from dataflow.storage.remotefile import RemoteBlob, buffered

KEEP_BATCHES = 4
_FILE_MAGIC_BYTES = 8


class _Spans(Sequence[pa.RecordBatch]):
    """Record batch ``i`` decoded on demand from its byte span; the last few kept."""

    def __init__(self, blob: RemoteBlob, schema: pa.Schema, spans: list[tuple[int, int]]) -> None:
        self._blob = blob
        self._schema = schema
        self._spans = spans
        self._kept: OrderedDict[int, pa.RecordBatch] = OrderedDict()

    def __len__(self) -> int:
        return len(self._spans)

    @overload
    def __getitem__(self, i: int) -> pa.RecordBatch: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[pa.RecordBatch]: ...

    def __getitem__(self, i: int | slice) -> pa.RecordBatch | Sequence[pa.RecordBatch]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        batch = self._kept.get(i)
        if batch is None:
            start, stop = self._spans[i]
            data = self._blob.read(start, stop)
            try:
                message = pa.ipc.read_message(pa.py_buffer(data))
                batch = pa.ipc.read_record_batch(message, self._schema)
            except (pa.ArrowInvalid, OSError) as e:
                raise ShardReadError(self._blob.url, f"record batch {i} cannot be decoded: {e}",
                                     offset=start) from e
            self._kept[i] = batch
            while len(self._kept) > KEEP_BATCHES:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(i)
        return batch


class RemoteArrowReader(ArrowBatches):
    """A remote Arrow IPC file or stream, read by record batch through the block cache.

    Attributes:
        blob: the shard's remote bytes (``blob.fetched``: bytes fetched, not cached).
    """

    def __init__(self, url: str, blob: RemoteBlob, on_error: str, *, file: bool,
                 options: ReadOptions = DEFAULT) -> None:
        super().__init__(url, on_error, options)
        self.blob = blob
        schema, spans, rows = self._walk(_FILE_MAGIC_BYTES if file else 0)
        self.schema = self._convert_schema(schema)
        self._batches = _Spans(blob, schema, spans)
        self._set_lengths(rows)
        self._recent: OrderedDict[int, Batch] = OrderedDict()

    def _walk(self, start: int) -> tuple[pa.Schema, list[tuple[int, int]], list[int]]:
        """The schema, and every record batch's byte span and row count."""
        f = buffered(self.blob)
        f.seek(start)
        try:
            reader = pa.ipc.MessageReader.open_stream(f)
            schema = pa.ipc.read_schema(reader.read_next_message())
        except (pa.ArrowInvalid, OSError, StopIteration) as e:
            raise ShardReadError(self.url, f"not a readable Arrow IPC shard: {e}",
                                 offset=start) from e
        spans: list[tuple[int, int]] = []
        rows: list[int] = []
        while True:
            offset = f.tell()
            try:
                message = reader.read_next_message()
            except StopIteration:
                return schema, spans, rows
            except (pa.ArrowInvalid, OSError) as e:
                self._walk_ends(f"record batch {len(spans)}", offset, sum(rows), self.blob.size,
                                self.blob.read, e)
                return schema, spans, rows
            if message.type == "dictionary batch":
                raise ShardReadError(self.url, "dictionary-encoded columns are not supported",
                                     offset=offset)
            if message.type != "record batch":
                continue
            try:
                batch = pa.ipc.read_record_batch(message, schema)
            except (pa.ArrowInvalid, OSError) as e:
                self._walk_ends(f"record batch {len(spans)}", offset, sum(rows), self.blob.size,
                                self.blob.read, e)
                return schema, spans, rows
            spans.append((offset, f.tell()))
            rows.append(batch.num_rows)

    def _view(self, i: int) -> Batch:
        """Record batch ``i`` converted, the last :data:`KEEP_BATCHES` kept."""
        view = self._recent.get(i)
        if view is None:
            view = self._recent[i] = self._from_arrow(self._batches[i], self._bounds[i])
            while len(self._recent) > KEEP_BATCHES:
                self._recent.popitem(last=False)
        return view

    def close(self) -> None:
        super().close()
        self._recent = OrderedDict()
