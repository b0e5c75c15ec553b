"""A local Arrow shard's rows lent to a gather across shards (:mod:`dataflow.readers.across`):
its record batches' column views, taken by address in one numpy pass a column
(:mod:`dataflow.readers.addressed`) where no shard needs a check during the gather and no
column is a ragged list, else row by row.

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
from dataflow.readers.across import CHECK_ROWS, Checks, RowSource, layout_of
from dataflow.readers.addressed import int64_at, ragged_at, rows_at

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
        ats: each record batch's columns' addresses once a gather took them, packed as
            native int64 (:meth:`chunk`): each scalar column's, each fixed-size column's,
            then for each ragged column of bytes or text its values' address and size and
            its (int64) offsets' address; ``None`` where a column is a ragged list (gathered
            row by row).
        lists: whether a column is a ragged list (the gather is then row by row).
    """

    def __init__(self, reader: ArrowBatches) -> None:
        self.reader = reader
        self.schema = reader.schema
        self.length = len(reader)
        self.guard = reader._guard
        self.bounds = reader._bounds
        self.layout = layout_of(self, tuple((s.name, s.dtype, s.shape, s.ragged)
                                            for s in reader.schema))
        self.chunks: list[_Chunk | None] = [None] * (len(self.bounds) - 1)
        self.ats: list[bytes | None] = [None] * (len(self.bounds) - 1)
        self.single = len(self.bounds) == 2
        self.known = 0
        self.lists = any(spec.ragged == "list" for spec in self.schema)

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
        at_scalar: list[int] = []
        at_fixed: list[int] = []
        at_raw: list[int] = []
        length = self.bounds[i + 1] - self.bounds[i]
        whole = True  # every column as long as the record batch: what its addresses rely on
        for spec in self.schema:
            col = view[spec.name]
            if spec.ragged is not None:
                if not isinstance(col, Ragged):
                    return None
                if spec.ragged == "list":
                    ragged.append(col)
                elif (col.values.dtype == np.uint8 and col.values.flags.c_contiguous
                      and col.offsets.dtype == np.int64 and col.offsets.dtype.isnative
                      and col.offsets.flags.c_contiguous):
                    raw.append((col.values.data, col.offsets.data))
                    at_raw += (col.values.ctypes.data, len(col.values), col.offsets.ctypes.data)
                    whole = whole and len(col.offsets) == length + 1
                else:
                    return None
                continue
            if (isinstance(col, Ragged) or col.dtype != np.dtype(spec.dtype)
                    or col.shape[1:] != spec.shape or col.dtype.hasobject or not len(col)
                    or not col.flags.c_contiguous or not col.dtype.isnative):
                return None
            whole = whole and len(col) == length
            if _scalar(spec):
                scalars.append(col.data)
                at_scalar.append(col.ctypes.data)
            else:
                flat = col.reshape(-1).view(np.uint8)
                fixed.append((flat.data, flat.nbytes // len(col)))
                at_fixed.append(flat.ctypes.data)
        got = self.chunks[i] = _Chunk(tuple(scalars), tuple(fixed), tuple(raw), tuple(ragged))
        if whole and not ragged:  # the addresses stay valid while the chunk's views hold them
            self.ats[i] = np.array([*at_scalar, *at_fixed, *at_raw], dtype=np.int64).tobytes()
            self.known += 1
        return got

    def gather(self, sources: Sequence[RowSource], which: np.ndarray, rows: np.ndarray,
               checks: Checks) -> Batch | None:
        """By address, one numpy pass a column (:meth:`_gather_at`), where the checks are free
        and no column is a ragged list; else one pass over the rows, each row's columns taken
        together, shards checked a few rows ahead (see :meth:`RowSource.gather
        <dataflow.readers.across.RowSource.gather>`)."""
        if not self.lists and checks.free():
            return self._gather_at(cast(list[ArrowRows], sources), which, rows)
        return self._gather_rows(sources, which.tolist(), rows.tolist(), checks)

    def _gather_at(self, sources: list[ArrowRows], which: np.ndarray,
                   rows: np.ndarray) -> Batch | None:
        """The gather by address: each row's record batch found in one ``searchsorted`` (or
        the first, where every shard has one), the record batches touched taken (and
        checked, :meth:`chunk`) once each, then each column in one numpy pass
        (:meth:`gather_table`). No check is owed during it (:meth:`Checks.free
        <dataflow.readers.across.Checks.free>`)."""
        located = _locate(sources, which, rows)
        if located is None:
            return None
        chunk_of, local, used = located
        ats = [source.ats[i] for source, i in used]
        if None in ats:  # record batches not taken yet, or not by address
            for k, (source, i) in enumerate(used):
                if ats[k] is None:
                    if source.chunks[i] is None and source.chunk(i) is None:
                        return None
                    ats[k] = source.ats[i]
            if None in ats:
                return None
        table = np.frombuffer(b"".join(cast(list[bytes], ats)), dtype=np.int64)
        return self.gather_table(table.reshape(len(ats), -1), chunk_of, local)

    def standing(self) -> tuple[Sequence[int], list[bytes | None]] | None:
        """The record batches (:attr:`bounds`) and the addresses of those a gather took
        (:attr:`ats`); ``None`` where a column is a ragged list (gathered row by row)."""
        if self.lists:
            return None
        return self.bounds, self.ats

    def gather_table(self, table: np.ndarray, which: np.ndarray, rows: np.ndarray) -> Batch | None:
        """Each column in one numpy pass, ``table`` holding the addresses of record batches
        (rows of :attr:`ats`): row ``rows[k]`` of record batch ``which[k]``; a ragged
        column's offsets checked against its values' size first."""
        at = table[which].T
        n = len(rows)
        nscalar = sum(1 for spec in self.schema if spec.ragged is None and _scalar(spec))
        nfixed = sum(1 for spec in self.schema if spec.ragged is None) - nscalar
        x_scalar, x_fixed, x_raw = 0, nscalar, nscalar + nfixed
        out: Batch = {}
        for spec in self.schema:
            if spec.ragged is not None:
                values_at, nvalues, offsets_at = at[x_raw : x_raw + 3]
                x_raw += 3
                cuts = int64_at(offsets_at + rows * 8, 2)
                starts, lengths = cuts[:, 0], cuts[:, 1] - cuts[:, 0]
                if ((starts < 0) | (lengths < 0) | (starts + lengths > nvalues)).any():
                    return None
                out[spec.name] = Ragged(*ragged_at(values_at + starts, lengths), spec.ragged)
                continue
            dtype = np.dtype(spec.dtype)
            size = dtype.itemsize * int(np.prod(spec.shape, dtype=np.int64))
            if _scalar(spec):
                column_at, x_scalar = at[x_scalar], x_scalar + 1
            else:
                column_at, x_fixed = at[x_fixed], x_fixed + 1
            got = rows_at(column_at + rows * size, size).view(dtype)
            out[spec.name] = got.reshape(n, *spec.shape)
        return out

    def _gather_rows(self, sources: Sequence[RowSource], which: list[int], rows: list[int],
                     checks: Checks) -> Batch | None:
        """The gather row by row, checking the shards a few rows ahead."""
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


def _locate(sources: list[ArrowRows], which: np.ndarray,
            rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[ArrowRows, int]]] | None:
    """Where each row lies: the number of its record batch among those used, its row in it,
    and the record batches used (source, number), each once.

    Args:
        sources: the gather's sources.
        which: each row's source.
        rows: each row's row in its source (in bounds).
    """
    if all(source.single for source in sources):
        return which, rows, [(source, 0) for source in sources]
    counts = [len(source.bounds) - 1 for source in sources]
    starts = np.concatenate([np.asarray(source.bounds[:-1], dtype=np.int64)
                             for source in sources])
    owner = np.repeat(np.arange(len(sources), dtype=np.int64), counts)
    if starts.max(initial=0) >= 1 << 40:
        return None
    found = np.searchsorted((owner << 40) | starts, (which << 40) | rows, side="right") - 1
    used, chunk_of = np.unique(found, return_inverse=True)
    firsts = np.cumsum([0, *counts])
    pairs = [(sources[s], c - int(firsts[s])) for s, c in
             zip(owner[used].tolist(), used.tolist(), strict=True)]
    return chunk_of, rows - starts[found], pairs


def _scalar(spec: FieldSpec) -> bool:
    """Whether field ``spec`` holds one integer or boolean a row (see :class:`_Chunk`)."""
    return not spec.shape and np.dtype(spec.dtype).kind in "iub"
