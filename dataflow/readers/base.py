"""The shard reader interface every format implements."""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType

import numpy as np
import pyarrow as pa

from dataflow.batch import Batch, Ragged, Schema, concat
from dataflow.convert import from_arrow
from dataflow.errors import ConfigError, DataflowError, ShardReadError

ON_ERROR = ("raise", "skip")


def check_on_error(on_error: str) -> str:
    """Validate an ``on_error`` policy.

    Raises:
        ConfigError: ``on_error`` is not ``"raise"`` or ``"skip"``.
    """
    if on_error not in ON_ERROR:
        raise ConfigError(f"`on_error` must be one of {ON_ERROR}. Found: {on_error!r}")
    return on_error


class ShardReader(ABC):
    """Random access to the samples of one shard, as columnar batches.

    Attributes:
        url: the shard's URL or local path.
        schema: the type of every field, identical for every sample.
        skipped: samples dropped because of bad input (``on_error="skip"``); 0 otherwise.
        closed: whether :meth:`close` was called.

    A reader is not thread-safe: use one reader per thread. ``close()`` is idempotent.
    """

    url: str
    schema: Schema
    skipped: int = 0
    closed: bool = False

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

    @abstractmethod
    def close(self) -> None:
        """Release files and memory maps (idempotent)."""

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)`` of the shard as one batch.

        Any range can be read without reading from the start of the shard. Arrays may be
        read-only views of a memory-mapped file.

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
        return self._read(start, stop)

    def read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        """The rows of several ranges of the shard, as one batch.

        Equal to concatenating ``read(starts[i], stops[i])`` for every ``i``, in order (ranges
        may overlap, repeat, be empty or come in any order), but gathered in one pass where
        the format allows: much faster than :meth:`read` per range for many small ranges.

        Args:
            starts: int array of shape ``(n,)``, first row of each range.
            stops: int array of shape ``(n,)``, one past the last row of each range.

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
        bad = np.flatnonzero((starts < 0) | (starts > stops) | (stops > n))
        if bad.size:
            i = int(bad[0])
            raise ShardReadError(
                self.url, f"range [{starts[i]}, {stops[i]}) outside [0, {n}]"
            )
        keep = stops > starts
        if not keep.any():
            return empty_batch(self.schema)
        if keep.sum() == 1:
            i = int(np.flatnonzero(keep)[0])
            return self._read(int(starts[i]), int(stops[i]))
        return self._read_many(starts[keep], stops[keep])

    def _from_arrow(self, table: pa.Table | pa.RecordBatch, start: int) -> Batch:
        """Convert rows of this shard starting at ``start`` to a batch of ``self.schema``."""
        try:
            return from_arrow(table, self.schema)
        except DataflowError as e:
            raise ShardReadError(self.url, str(e), index=start) from e

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


def range_rows(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The rows of ranges ``[starts[i], stops[i])`` back to back: int64 of shape
    ``(sum(stops - starts),)``, without a loop over the ranges."""
    lengths = stops - starts
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(
        starts - (ends - lengths), lengths
    )


def overlapping(bounds: Sequence[int], start: int, stop: int) -> range:
    """Indices of the chunks that overlap rows ``[start, stop)``.

    Args:
        bounds: cumulative chunk lengths with a leading 0, shape ``(chunks + 1,)``.
        start: first row.
        stop: one past the last row; ``stop > start``.
    """
    first = bisect.bisect_right(bounds, start) - 1
    last = bisect.bisect_left(bounds, stop) - 1
    return range(first, last + 1)
