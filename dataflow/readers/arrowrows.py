"""A local Arrow shard's rows lent to a gather across shards (:mod:`dataflow.readers.across`):
its record batches' column views, taken row by row.

Each record batch a gather touches is validated and converted as the reader's own read does
(:meth:`~dataflow.readers.arrow.ArrowBatches._view`, kept until close); a fixed-size column
is then kept as the bytes of its rows, so that a row is one copy into the batch's array, and
a ragged one as its values and offsets. A record batch found damaged leaves the request to
the shard-by-shard read, which raises or counts its rows. The values are those of
:func:`~dataflow.readers.gather.take_rows`, byte for byte.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np

from dataflow.batch import Batch, FieldSpec, Ragged
from dataflow.readers.across import CHECK_ROWS, Checks, RowSource

if TYPE_CHECKING:
    from dataflow.readers.arrow import ArrowBatches



class _Chunk(NamedTuple):
    """A record batch's columns as a gather takes them, each kind in field order (the same
    fields in every source of a gather: their layouts are equal).

    Attributes:
        scalars: a column of integers or booleans, one a row, as a memoryview: taken as
            Python values, which these dtypes hold exactly (cheaper than a copy of 8 bytes).
        fixed: a fixed-size column's row bytes and the size of a row.
        raw: a ragged column of bytes or text: its values' bytes and its offsets.
        ragged: a ragged column.
    """

    scalars: tuple[memoryview, ...]
    fixed: tuple[tuple[memoryview, int], ...]
    raw: tuple[tuple[memoryview, memoryview], ...]
    ragged: tuple[Ragged, ...]


class ArrowRows(RowSource):
    """The record batches of one open, local Arrow shard (see the module).

    Attributes:
        layout: per field its name, dtype, shape and ragged kind.
        bounds: the record batches' first rows, and the shard's length last.
        chunks: each record batch's columns once a gather took them (:meth:`chunk`), else
            None.
    """

    def __init__(self, reader: ArrowBatches) -> None:
        self.reader = reader
        self.schema = reader.schema
        self.length = len(reader)
        self.guard = reader._guard
        self.bounds = reader._bounds
        self.layout = repr(tuple((s.name, s.dtype, s.shape, s.ragged) for s in reader.schema))
        self.chunks: list[_Chunk | None] = [None] * (len(self.bounds) - 1)

    def chunk(self, i: int) -> _Chunk | None:
        """Record batch ``i``'s columns; ``None`` when it is damaged, or a column is not as the
        schema says (the shard-by-shard read says why)."""
        got = self.chunks[i]
        if got is not None:
            return got
        reader = self.reader
        reader._check((i,))
        if i in reader._bad:
            return None
        view = reader._view(i)
        scalars: list[memoryview] = []
        fixed: list[tuple[memoryview, int]] = []
        raw: list[tuple[memoryview, memoryview]] = []
        ragged: list[Ragged] = []
        for spec in self.schema:
            col = view[spec.name]
            if spec.ragged is not None:
                if not isinstance(col, Ragged):
                    return None
                if spec.ragged == "list":
                    ragged.append(col)
                elif (col.values.dtype == np.uint8 and col.values.flags.c_contiguous
                      and col.offsets.dtype.isnative and col.offsets.flags.c_contiguous):
                    raw.append((col.values.data, col.offsets.data))
                else:
                    return None
                continue
            if (isinstance(col, Ragged) or col.dtype != np.dtype(spec.dtype)
                    or col.shape[1:] != spec.shape or col.dtype.hasobject or not len(col)
                    or not col.flags.c_contiguous or not col.dtype.isnative):
                return None
            if _scalar(spec):
                scalars.append(col.data)
            else:
                flat = col.reshape(-1).view(np.uint8)
                fixed.append((flat.data, flat.nbytes // len(col)))
        got = self.chunks[i] = _Chunk(tuple(scalars), tuple(fixed), tuple(raw), tuple(ragged))
        return got

    def gather(self, sources: Sequence[RowSource], which_rows: np.ndarray,
               rows_asked: np.ndarray, checks: Checks) -> Batch | None:
        """One pass over the rows, each row's columns taken together, shards checked a few
        rows ahead (see :meth:`RowSource.gather <dataflow.readers.across.RowSource.gather>`)."""
        which, rows = which_rows.tolist(), rows_asked.tolist()
        n = len(rows)
        scalars: list[list[int]] = []
        fixed: list[memoryview] = []
        raw: list[tuple[list[memoryview], list[int]]] = []
        ragged: list[list[np.ndarray]] = []
        arrays: dict[int, np.ndarray] = {}
        for j, spec in enumerate(self.schema):
            if spec.ragged == "list":
                ragged.append([])
            elif spec.ragged is not None:
                raw.append(([], []))
            elif _scalar(spec):
                scalars.append([])
            else:
                arr = arrays[j] = np.empty((n, *spec.shape), dtype=spec.dtype)
                fixed.append(arr.reshape(n, -1).view(np.uint8).reshape(-1).data)
        parts = [cast(ArrowRows, s) for s in sources]
        for lo in range(0, n, CHECK_ROWS):
            if not checks.ahead(lo):
                return None
            for k in range(lo, min(lo + CHECK_ROWS, n)):
                s = parts[which[k]]
                r = rows[k]
                bounds = s.bounds
                i = 0 if len(bounds) == 2 else bisect.bisect_right(bounds, r) - 1
                cols = s.chunks[i]
                if cols is None:
                    cols = s.chunk(i)
                    if cols is None:
                        return None
                local = r - bounds[i]
                # enumerate, not zip(..., strict=True): a call with a keyword costs ~130 ns
                # more, three a row (the kinds' lengths agree: the layouts are equal)
                for x, column in enumerate(cols.scalars):
                    scalars[x].append(column[local])
                for x, (src, size) in enumerate(cols.fixed):
                    fixed[x][k * size : (k + 1) * size] = src[local * size : (local + 1) * size]
                for x, (data, cuts) in enumerate(cols.raw):
                    a, b = cuts[local], cuts[local + 1]
                    pieces, lengths = raw[x]
                    pieces.append(data[a:b])
                    lengths.append(b - a)
                for x, col in enumerate(cols.ragged):
                    ends = col.offsets
                    ragged[x].append(col.values[ends.item(local) : ends.item(local + 1)])
        out: Batch = {}
        scalar, raws, lists = iter(scalars), iter(raw), iter(ragged)
        for j, spec in enumerate(self.schema):
            if j in arrays:
                out[spec.name] = arrays[j]
            elif spec.ragged is None:
                out[spec.name] = np.array(next(scalar), dtype=spec.dtype)
            elif spec.ragged == "list":
                items = next(lists)
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum([len(p) for p in items], out=offsets[1:])
                out[spec.name] = Ragged(np.concatenate(items), offsets, spec.ragged)
            else:
                pieces, lengths = next(raws)
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(lengths, out=offsets[1:])
                out[spec.name] = Ragged(np.frombuffer(bytearray().join(pieces), dtype=np.uint8),
                                        offsets, spec.ragged)
        return out


def _scalar(spec: FieldSpec) -> bool:
    """Whether field ``spec`` holds one integer or boolean a row (see :class:`_Chunk`)."""
    return not spec.shape and np.dtype(spec.dtype).kind in "iub"
