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

from dataflow.batch import Batch, Ragged
from dataflow.readers.across import RowSource

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
                if col.values.dtype == np.uint8 and col.values.flags.c_contiguous:
                    cols.raw[j] = (col.values.data, col.offsets)
                else:
                    cols.ragged[j] = col
                continue
            if (isinstance(col, Ragged) or col.dtype != np.dtype(spec.dtype)
                    or col.shape[1:] != spec.shape or col.dtype.hasobject or not len(col)
                    or not col.flags.c_contiguous):
                return None
            if _scalar(col):
                cols.scalars[j] = col
                continue
            flat = col.reshape(-1).view(np.uint8)
            cols.fixed[j] = (flat.data, flat.nbytes // len(col))
        self._chunks[i] = cols
        return cols

    def gather(self, sources: Sequence[RowSource], which: list[int],
               rows: list[int]) -> Batch | None:
        picks: list[tuple[_Chunk, int]] = []
        for w, r in zip(which, rows, strict=True):
            s = cast(ArrowRows, sources[w])
            i = bisect.bisect_right(s.bounds, r) - 1
            cols = s.chunk(i)
            if cols is None:
                return None
            picks.append((cols, r - s.bounds[i]))
        n = len(picks)
        out: Batch = {}
        first = picks[0][0]
        for j, spec in enumerate(self.schema):
            if j in first.scalars:
                if not all(j in cols.scalars for cols, _ in picks):
                    return None
                out[spec.name] = np.array([cols.scalars[j].item(local) for cols, local in picks],
                                          dtype=spec.dtype)
            elif j in first.raw:
                if not all(j in cols.raw for cols, _ in picks):
                    return None
                out[spec.name] = _joined(picks, j, cast(str, spec.ragged))
            elif spec.ragged is None:
                arr = np.empty((n, *spec.shape), dtype=spec.dtype)
                dst = arr.reshape(n, -1).view(np.uint8).reshape(-1).data
                at = 0
                for cols, local in picks:
                    src, size = cols.fixed[j]
                    dst[at : at + size] = src[local * size : (local + 1) * size]
                    at += size
                out[spec.name] = arr
            else:
                pieces = []
                for cols, local in picks:
                    if j not in cols.ragged:
                        return None
                    col = cols.ragged[j]
                    pieces.append(col.values[col.offsets.item(local) : col.offsets.item(local + 1)])
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum([len(p) for p in pieces], out=offsets[1:])
                out[spec.name] = Ragged(np.concatenate(pieces), offsets, spec.ragged)
        return out


def _scalar(col: np.ndarray) -> bool:
    """Whether ``col`` holds one integer or boolean a row (see :class:`_Chunk`)."""
    return col.ndim == 1 and col.dtype.kind in "iub"


def _joined(picks: list[tuple[_Chunk, int]], j: int, kind: str) -> Ragged:
    """Ragged column ``j`` (bytes or text) of each ``(chunk, row)``, joined."""
    pieces = []
    for cols, local in picks:
        values, offsets = cols.raw[j]
        pieces.append(values[offsets.item(local) : offsets.item(local + 1)])
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return Ragged(np.frombuffer(bytearray().join(pieces), dtype=np.uint8), offsets, kind)
