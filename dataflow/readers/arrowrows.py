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
from dataflow.readers.across import CHECK_ROWS, RowSource, check_ahead

if TYPE_CHECKING:
    from dataflow.readers.arrow import ArrowBatches



class _Chunk(NamedTuple):
    """A record batch's columns as a gather takes them, by field number.

    Attributes:
        fixed: a fixed-size column's row bytes and the size of a row.
        scalars: a column of integers or booleans, one a row: taken as Python values, which
            these dtypes hold exactly (cheaper than a copy of 8 bytes).
        ragged: a ragged column.
        raw: a ragged column of bytes or text: its values' bytes and its offsets.
    """

    fixed: dict[int, tuple[memoryview, int]]
    scalars: dict[int, np.ndarray]
    ragged: dict[int, Ragged]
    raw: dict[int, tuple[memoryview, np.ndarray]]


class ArrowRows(RowSource):
    """The record batches of one open, local Arrow shard (see the module).

    Attributes:
        layout: per field its name, dtype, shape and ragged kind.
    """

    def __init__(self, reader: ArrowBatches) -> None:
        self.reader = reader
        self.schema = reader.schema
        self.length = len(reader)
        self.guard = reader._guard
        self.bounds = reader._bounds
        self.layout = repr(tuple((s.name, s.dtype, s.shape, s.ragged) for s in reader.schema))
        self._chunks: dict[int, _Chunk] = {}

    def chunk(self, i: int) -> _Chunk | None:
        """Record batch ``i``'s columns; ``None`` when it is damaged, or a column is not as the
        schema says (the shard-by-shard read says why)."""
        got = self._chunks.get(i)
        if got is not None:
            return got
        reader = self.reader
        reader._check((i,))
        if i in reader._bad:
            return None
        view = reader._view(i)
        cols = _Chunk({}, {}, {}, {})
        for j, spec in enumerate(self.schema):
            col = view[spec.name]
            if spec.ragged is not None:
                if not isinstance(col, Ragged):
                    return None
                if spec.ragged == "list":
                    cols.ragged[j] = col
                elif col.values.dtype == np.uint8 and col.values.flags.c_contiguous:
                    cols.raw[j] = (col.values.data, col.offsets)
                else:
                    return None
                continue
            if (isinstance(col, Ragged) or col.dtype != np.dtype(spec.dtype)
                    or col.shape[1:] != spec.shape or col.dtype.hasobject or not len(col)
                    or not col.flags.c_contiguous):
                return None
            if _scalar(spec):
                cols.scalars[j] = col
            else:
                flat = col.reshape(-1).view(np.uint8)
                cols.fixed[j] = (flat.data, flat.nbytes // len(col))
        self._chunks[i] = cols
        return cols

    def gather(self, sources: Sequence[RowSource], which: list[int],
               rows: list[int]) -> Batch | None:
        """One pass over the rows, each row's columns taken together, shards checked a few
        rows ahead (see :meth:`RowSource.gather <dataflow.readers.across.RowSource.gather>`)."""
        n = len(rows)
        scalars: list[tuple[int, list[int]]] = []
        fixed: list[tuple[int, memoryview]] = []
        raw: list[tuple[int, list[memoryview], list[int]]] = []
        ragged: list[tuple[int, list[np.ndarray]]] = []
        arrays: dict[int, np.ndarray] = {}
        for j, spec in enumerate(self.schema):
            if spec.ragged == "list":
                ragged.append((j, []))
            elif spec.ragged is not None:
                raw.append((j, [], []))
            elif _scalar(spec):
                scalars.append((j, []))
            else:
                arr = arrays[j] = np.empty((n, *spec.shape), dtype=spec.dtype)
                fixed.append((j, arr.reshape(n, -1).view(np.uint8).reshape(-1).data))
        checked: set[int] = set()
        for k, (w, r) in enumerate(zip(which, rows, strict=True)):
            if k % CHECK_ROWS == 0 and not check_ahead(sources, which, k, checked):
                return None
            s = cast(ArrowRows, sources[w])
            i = bisect.bisect_right(s.bounds, r) - 1
            cols = s.chunk(i)
            if cols is None:
                return None
            local = r - s.bounds[i]
            for j, values in scalars:
                values.append(cols.scalars[j].item(local))
            for j, dst in fixed:
                src, size = cols.fixed[j]
                dst[k * size : (k + 1) * size] = src[local * size : (local + 1) * size]
            for j, pieces, lengths in raw:
                data, offsets = cols.raw[j]
                a, b = offsets.item(local), offsets.item(local + 1)
                pieces.append(data[a:b])
                lengths.append(b - a)
            for j, items in ragged:
                col = cols.ragged[j]
                items.append(col.values[col.offsets.item(local) : col.offsets.item(local + 1)])
        out: Batch = {}
        for j, spec in enumerate(self.schema):
            if j in arrays:
                out[spec.name] = arrays[j]
            elif spec.ragged is None:
                values = next(v for i, v in scalars if i == j)
                out[spec.name] = np.array(values, dtype=spec.dtype)
            elif spec.ragged == "list":
                items = next(v for i, v in ragged if i == j)
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum([len(p) for p in items], out=offsets[1:])
                out[spec.name] = Ragged(np.concatenate(items), offsets, spec.ragged)
            else:
                pieces, lengths = next((p, z) for i, p, z in raw if i == j)
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(lengths, out=offsets[1:])
                out[spec.name] = Ragged(np.frombuffer(bytearray().join(pieces), dtype=np.uint8),
                                        offsets, spec.ragged)
        return out


def _scalar(spec: FieldSpec) -> bool:
    """Whether field ``spec`` holds one integer or boolean a row (see :class:`_Chunk`)."""
    return not spec.shape and np.dtype(spec.dtype).kind in "iub"
