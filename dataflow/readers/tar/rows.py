"""A local tar's samples lent to a gather across shards (:mod:`dataflow.readers.across`):
its member index and memory map, taken row by row.

Per row: the tar-header check (the first and last bytes of the ``ustar`` magic at the
sample's indexed header offset, as :meth:`TarReader._check_headers
<dataflow.readers.tar.TarReader>` does), integer fields from the index, each ``.npy``
payload copied from the map into the batch's array (a filled cell zeroed), text and bytes
fields joined into one values array, and ``__key__`` from the shard's keys. The values are
those of :class:`~dataflow.readers.tar.TarReader`'s own gather, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from dataflow.batch import Batch, Ragged
from dataflow.readers.across import CHECK_ROWS, Checks, RowSource
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
            memoryviews (a row's field ``j`` at ``row * fields + j``; no keys: empty), indexed
            at a third of the cost of ``ndarray.item``, with no copy of the index.
    """

    def __init__(self, reader: TarReader, keys: Ragged | None) -> None:
        ix = reader._index
        self.length = len(ix)
        self.guard = reader._guard
        self.schema = ix.schema
        self.codecs = ix.codecs
        self.sizes = list(reader._field_size)
        self.filled = list(reader._filled)
        self.layout = repr((tuple((spec.name, codec, spec.shape,
                              size if codec.startswith("npy:") else 0, filled)
                             for spec, codec, size, filled in zip(
                                 ix.schema, ix.codecs, self.sizes, self.filled, strict=True)),
                       keys is not None, self.guard is not None))
        self.ints_dtype = ix.ints.dtype
        self.keys = keys is not None
        empty = memoryview(b"")
        self.row = (reader._buf.data, _flat(ix.headers), _flat(ix.offsets), _flat(ix.sizes),
                    _flat(ix.ints), _flat(keys.offsets) if keys is not None else empty,
                    keys.values.data if keys is not None else empty)

    def gather(self, sources: Sequence[RowSource], which: list[int], rows: list[int],
               checks: Checks) -> Batch | None:
        """One pass over the rows, each row's fields taken together (its index entries and
        map pages touched once), shards checked a few rows ahead (see
        :meth:`RowSource.gather <dataflow.readers.across.RowSource.gather>`). Most of the
        time is cache and TLB misses: each row's entries lie in another shard's arrays and
        map."""
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


def _flat(a: np.ndarray) -> memoryview:
    """A memoryview of ``a``'s items in C order (no copy where ``a`` is contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).data


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
