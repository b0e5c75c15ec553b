"""One batch's fixed-size columns, allocated once and filled in place by the readers of its
shards.

A batch of a sample-level shuffle draws its rows from many shards. Gathering each shard's rows
into arrays of its own and then concatenating them copies every row twice and allocates every
column twice; with a :class:`BatchSink` each reader writes its rows straight into the batch's
columns (:meth:`ShardReader.read_many <dataflow.readers.ShardReader.read_many>` with
``sink=``), so each row is copied once. Ragged columns are still joined at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dataflow.batch import Batch, Ragged, concat
from dataflow.errors import InternalError, SchemaError


class BatchSink:
    """Fixed-size columns of up to ``capacity`` rows, filled part by part.

    A part (one reader's rows) goes at rows ``[at, at + n)``: the reader asks for those rows
    of each column with :meth:`rows` and writes them, or returns arrays of its own that
    :meth:`put` copies there; the caller then moves ``at`` on with :meth:`advance`. A column
    is allocated on the first part that has rows of it, with that part's dtype and row shape.
    Not thread-safe.

    Attributes:
        capacity: rows allocated per column (the rows a request asks for).
        at: where the next part goes.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.at = 0
        self._columns: dict[str, np.ndarray] = {}
        self._given: dict[str, np.ndarray] = {}

    def rows(self, name: str, dtype: np.dtype, shape: tuple[int, ...], n: int) -> np.ndarray:
        """Rows ``[at, at + n)`` of column ``name``, to fill: a C-contiguous view of shape
        ``(n, *shape)``.

        Raises:
            SchemaError: an earlier part gave the column another dtype or row shape.
            InternalError: the rows would pass ``capacity`` (a reader returned more rows
                than asked for).
        """
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = np.empty((self.capacity, *shape), dtype=dtype)
        elif col.dtype != dtype or col.shape[1:] != tuple(shape):
            raise SchemaError(f"field {name!r}: {np.dtype(dtype)} {tuple(shape)} rows where "
                              f"earlier shards of the batch gave {col.dtype} {col.shape[1:]}")
        if self.at + n > self.capacity:
            raise InternalError(f"field {name!r}: rows up to {self.at + n} of a batch of "
                                f"{self.capacity}")
        view = self._given[name] = col[self.at : self.at + n]
        return view

    def put(self, part: Batch) -> Batch:
        """``part`` with its fixed-size columns in place at rows ``[at, at + len(part))``:
        those already written through :meth:`rows` are kept, the others copied there."""
        out: Batch = {}
        for name, col in part.items():
            if isinstance(col, Ragged) or not len(col) or self._given.get(name) is col:
                out[name] = col
                continue
            place = self.rows(name, col.dtype, col.shape[1:], len(col))
            place[...] = col
            out[name] = place
        return out

    def advance(self, n: int) -> None:
        """The part just put holds ``n`` rows: the next one goes after them."""
        self.at += n
        self._given.clear()

    def batch(self, parts: Sequence[Batch]) -> Batch:
        """The batch of ``parts`` (each put, in order): fixed-size columns are the first
        ``at`` rows of the sink's, ragged ones joined.

        Raises:
            SchemaError: the parts do not have the same fields, naming one.
        """
        names = list(parts[0])
        for part in parts[1:]:
            if set(part) != set(names):
                odd = sorted(set(names).symmetric_difference(part))[0]
                raise SchemaError(f"field {odd!r} is in some shards of the batch and not in "
                                  "others")
        out: Batch = {}
        for name in names:
            ragged = sum(isinstance(p[name], Ragged) for p in parts)
            if ragged not in (0, len(parts)):
                raise SchemaError(f"field {name!r} is ragged in {ragged} shards of the batch "
                                  f"and fixed-size in {len(parts) - ragged}")
            if ragged:
                out[name] = concat([{name: p[name]} for p in parts])[name]
            elif name in self._columns:
                out[name] = self._columns[name][: self.at]
            else:  # no part had rows
                out[name] = parts[0][name]
        return out
