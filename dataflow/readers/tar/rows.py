"""A local tar's samples lent to a gather across shards (:mod:`dataflow.readers.across`):
its member index and memory map, taken by address in one numpy pass a field
(:mod:`dataflow.readers.addressed`) where no shard needs a check during the gather, else row
by row.

Per row: the tar-header check (the first and last bytes of the ``ustar`` magic at the
sample's indexed header offset, as :meth:`TarReader._check_headers
<dataflow.readers.tar.TarReader>` does), integer fields from the index, each ``.npy``
payload copied from the map into the batch's array (a filled cell zeroed), text and bytes
fields joined into one values array, and ``__key__`` from the shard's keys. The values are
those of :class:`~dataflow.readers.tar.TarReader`'s own gather, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, cast

import numpy as np

from dataflow.batch import Batch, Ragged
from dataflow.readers.across import CHECK_ROWS, Checks, RowSource, layout_of
from dataflow.readers.addressed import int64_at, ragged_at, rows_at
from dataflow.readers.tar.options import KEY_FIELD

if TYPE_CHECKING:
    from dataflow.readers.tar.reader import TarReader

MAGIC_AT = 257
MAGIC_FIRST, MAGIC_LAST = ord("u"), ord("r")
"""Where a tar header holds its magic ``ustar`` (ustar, GNU and PAX headers), and the
magic's first and last bytes, which a read checks."""


class TarRows(RowSource):
    """The index and map of one open, local, memory-mapped tar (see the module).

    Attributes:
        layout: per field its name, codec, shape, row size (``.npy``) and whether a cell may
            be filled;
            whether ``__key__`` is served; whether headers are checked (a plain tar's guard).
        row: what a gather takes a row from: the map, then the index's header offsets, field
            offsets, field sizes and integers, the keys' offsets and values, as flat
            memoryviews (a row's field ``j`` at ``row * fields + j``; no keys: placeholders),
            indexed at a third of the cost of ``ndarray.item``, with no copy of the index.
        at: the same as addresses, the map's size second, packed as 8 native int64 (a
            gather joins its sources' in one call); ``None`` where an index array is not
            native int64 (the gather is then row by row).
    """

    def __init__(self, reader: TarReader, keys: Ragged | None) -> None:
        ix = reader._index
        self.length = len(ix)
        self.guard = reader._guard
        self.schema = ix.schema
        self.codecs = ix.codecs
        self.sizes = list(reader._field_size)
        self.filled = list(reader._filled)
        self.layout = layout_of(self, (tuple((spec.name, codec, spec.shape,
                                              size if codec.startswith("npy:") else 0, filled)
                                             for spec, codec, size, filled in zip(
                                                 ix.schema, ix.codecs, self.sizes, self.filled,
                                                 strict=True)),
                                       keys is not None, self.guard is not None))
        self.ints_dtype = ix.ints.dtype
        self.keys = keys is not None
        nothing = np.zeros(1, dtype=np.int64)
        arrays = (reader._buf, *(np.ascontiguousarray(a).reshape(-1) for a in (
            ix.headers, ix.offsets, ix.sizes, ix.ints,
            keys.offsets if keys is not None else nothing,
            keys.values if keys is not None else np.zeros(1, dtype=np.uint8))))
        self.row = tuple(a.data for a in arrays)
        buf, *index, _ = arrays
        self.at = (np.array([buf.ctypes.data, len(buf), *(a.ctypes.data for a in arrays[1:])],
                            dtype=np.int64).tobytes()
                   if all(a.dtype == np.int64 and a.dtype.isnative for a in index) else None)
        self.known = int(self.at is not None)

    def gather(self, sources: Sequence[RowSource], which: np.ndarray, rows: np.ndarray,
               checks: Checks) -> Batch | None:
        """By address, one numpy pass a field (:meth:`gather_table`), where the checks are free;
        else one pass over the rows, each row's fields taken together (its index entries and
        map pages touched once), shards checked a few rows ahead (see
        :meth:`RowSource.gather <dataflow.readers.across.RowSource.gather>`). Most of the
        time is cache and TLB misses: each row's entries lie in another shard's arrays and
        map."""
        if self.at is not None and checks.free():
            table = address_table(sources)
            if table is not None:
                return self.gather_table(table, which, rows)
        return self._gather_rows(sources, which.tolist(), rows.tolist(), checks)

    def standing(self) -> tuple[Sequence[int], list[bytes | None]] | None:
        """The whole tar as one chunk, at :attr:`at`."""
        return None if self.at is None else ((0, self.length), [self.at])

    def gather_table(self, table: np.ndarray, which: np.ndarray, rows: np.ndarray) -> Batch | None:
        """The gather by address, one numpy pass a field: ``table`` holds the sources'
        :attr:`at`. No check is owed during it (:meth:`Checks.free
        <dataflow.readers.across.Checks.free>`); every address is checked against its map's
        size first (the index was checked against the map on open), and anything out of
        bounds leaves the rows to the row-by-row gather, which finds it."""
        n = len(rows)
        nfields = len(self.codecs)
        base, nbytes, heads_at, offsets_at, sizes_at, ints_at, keys_at, values_at = table[which].T
        if self.guard is not None:
            heads = int64_at(heads_at + rows * 8)
            magic = base + heads + MAGIC_AT
            if (heads < 0).any() or (heads + MAGIC_AT + 5 > nbytes).any():
                return None
            got = rows_at(magic, 5)
            if ((got[:, 0] != MAGIC_FIRST) | (got[:, 4] != MAGIC_LAST)).any():
                return None  # the shard-by-shard read raises naming the sample
        cells = rows * (nfields * 8)  # a row's entries of one kind lie together
        ints = int64_at(ints_at + cells, nfields) if "int" in self.codecs else None
        if any(codec != "int" for codec in self.codecs):
            all_offsets = int64_at(offsets_at + cells, nfields)
            all_lengths = int64_at(sizes_at + cells, nfields)
        zero: np.ndarray | None = None
        out: Batch = {}
        for j, (spec, codec) in enumerate(zip(self.schema, self.codecs, strict=True)):
            if codec == "int":
                out[spec.name] = cast(np.ndarray, ints)[:, j].astype(self.ints_dtype)
                continue
            offsets, lengths = all_offsets[:, j], all_lengths[:, j]
            if codec.startswith("npy:"):
                size = self.sizes[j]
                holes = lengths < 0 if self.filled[j] else np.zeros(n, dtype=bool)
                if ((~holes) & ((offsets < 0) | (offsets + size > nbytes))).any():
                    return None
                addresses = base + offsets
                if holes.any():
                    if zero is None or len(zero) < size:
                        zero = np.zeros(size, dtype=np.uint8)
                    addresses[holes] = zero.ctypes.data
                arr = rows_at(addresses, size).view(np.dtype(codec[4:])).reshape(n, *spec.shape)
                out[spec.name] = (arr if arr.dtype.isnative
                                  else arr.astype(arr.dtype.newbyteorder("=")))
                continue
            lengths = np.maximum(lengths, 0)  # filled
            if ((offsets < 0) | (offsets + lengths > nbytes)).any():
                return None
            out[spec.name] = Ragged(*ragged_at(base + offsets, lengths), codec)
        if self.keys:
            starts = int64_at(keys_at + rows * 8)
            stops = int64_at(keys_at + rows * 8 + 8)
            out[KEY_FIELD] = Ragged(*ragged_at(values_at + starts, stops - starts), "str")
        return out

    def _gather_rows(self, sources: Sequence[RowSource], which: list[int], rows: list[int],
                     checks: Checks) -> Batch | None:
        """The gather row by row, checking the shards a few rows ahead."""
        n = len(rows)
        nfields = len(self.codecs)
        ints: list[tuple[int, list[int]]] = []
        fixed: list[tuple[int, int, bool, memoryview, bytes]] = []
        ragged: list[tuple[int, list[memoryview], list[int]]] = []
        arrays: dict[int, np.ndarray] = {}
        for j, codec in enumerate(self.codecs):
            if codec == "int":
                ints.append((j, []))
            elif codec.startswith("npy:"):
                size = self.sizes[j]
                arr = arrays[j] = np.empty((n, *self.schema[j].shape), dtype=np.dtype(codec[4:]))
                dst = arr.reshape(n, -1).view(np.uint8).reshape(-1).data
                fixed.append((j, size, self.filled[j], dst, bytes(size)))
            else:
                ragged.append((j, [], []))
        key_pieces: list[memoryview] = []
        key_lengths: list[int] = []
        keyed = self.keys
        check = self.guard is not None
        parts = [cast(TarRows, s).row for s in sources]
        for lo in range(0, n, CHECK_ROWS):
            if not checks.ahead(lo):
                return None
            for k in range(lo, min(lo + CHECK_ROWS, n)):
                data, heads, offsets, lengths, values, key_offsets, key_map = parts[which[k]]
                r = rows[k]
                if check:
                    at = heads[r] + MAGIC_AT
                    if data[at] != MAGIC_FIRST or data[at + 4] != MAGIC_LAST:
                        return None  # the shard-by-shard read raises naming the sample
                at = r * nfields
                for j, column in ints:
                    column.append(values[at + j])
                for j, size, filled, dst, zero in fixed:
                    if filled and lengths[at + j] < 0:
                        dst[k * size : (k + 1) * size] = zero
                    else:
                        o = offsets[at + j]
                        dst[k * size : (k + 1) * size] = data[o : o + size]
                for j, pieces, sizes in ragged:
                    o, z = offsets[at + j], lengths[at + j]
                    if z < 0:  # filled
                        z = 0
                    pieces.append(data[o : o + z])
                    sizes.append(z)
                if keyed:
                    a, b = key_offsets[r], key_offsets[r + 1]
                    key_pieces.append(key_map[a:b])
                    key_lengths.append(b - a)
        out: Batch = {}
        for j, (spec, codec) in enumerate(zip(self.schema, self.codecs, strict=True)):
            if codec == "int":
                out[spec.name] = np.array(next(v for i, v in ints if i == j),
                                          dtype=self.ints_dtype)
            elif codec.startswith("npy:"):
                arr = arrays[j]
                out[spec.name] = (arr if arr.dtype.isnative
                                  else arr.astype(arr.dtype.newbyteorder("=")))
            else:
                pieces, sizes = next((p, z) for i, p, z in ragged if i == j)
                out[spec.name] = _joined(pieces, sizes, codec)
        if keyed:
            out[KEY_FIELD] = _joined(key_pieces, key_lengths, "str")
        return out


_AT = attrgetter("at")


def address_table(sources: Sequence[RowSource]) -> np.ndarray | None:
    """Each of ``sources``' :attr:`TarRows.at` as a row of int64; ``None`` if one has none."""
    at = list(map(_AT, sources))
    if None in at:
        return None
    return np.frombuffer(b"".join(cast(list[bytes], at)), dtype=np.int64).reshape(len(at), -1)


def _joined(pieces: list[memoryview], lengths: list[int], kind: str) -> Ragged:
    """A ragged column of ``pieces`` (bytes, one per row) back to back, ``lengths`` the
    index's (a piece cut short by the end of the map is found)."""
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(bytearray().join(pieces), dtype=np.uint8)
    if len(values) != offsets[-1]:
        raise ValueError(f"{len(values)} bytes where the index gives {offsets[-1]}: a field "
                         "lies past the end of the map")
    return Ragged(values, offsets, kind)
