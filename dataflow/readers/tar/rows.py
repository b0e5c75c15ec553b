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
from dataflow.readers.across import RowSource
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
        self.offsets, self.lengths, self.ints, self.headers = (ix.offsets, ix.sizes, ix.ints,
                                                               ix.headers)
        self.map = reader._buf.data
        self.keys = keys
        self.key_map = keys.values.data if keys is not None else None

    def gather(self, sources: Sequence[RowSource], which: list[int],
               rows: list[int]) -> Batch | None:
        srcs = [cast(TarRows, sources[w]) for w in which]
        pairs = list(zip(srcs, rows, strict=True))
        if self.guard is not None:
            for s, r in pairs:
                at = s.headers.item(r) + MAGIC_AT
                if s.map[at] != MAGIC_FIRST or s.map[at + 4] != MAGIC_LAST:
                    return None  # the shard-by-shard read raises naming the sample
        out: Batch = {}
        for j, (spec, codec) in enumerate(zip(self.schema, self.codecs, strict=True)):
            if codec == "int":
                out[spec.name] = np.array([s.ints.item(r, j) for s, r in pairs],
                                          dtype=self.ints.dtype)
            elif codec.startswith("npy:"):
                out[spec.name] = _npy(pairs, j, np.dtype(codec[4:]), spec.shape,
                                      self.sizes[j], self.filled[j])
            else:
                out[spec.name] = _ragged(pairs, j, codec)
        if self.keys is not None:
            out[KEY_FIELD] = _keys(pairs)
        return out


def _npy(pairs: list[tuple[TarRows, int]], j: int, dtype: np.dtype, shape: tuple[int, ...],
         size: int, filled: bool) -> np.ndarray:
    """Field ``j`` (``.npy`` payloads of ``size`` bytes, stored as ``dtype``) of each
    ``(source, row)``, as an array of shape ``(n, *shape)`` in native byte order; a filled
    cell is zero."""
    n = len(pairs)
    arr = np.empty((n, *shape), dtype=dtype)
    dst = arr.reshape(n, -1).view(np.uint8).reshape(-1).data
    zero = bytes(size)
    at = 0
    for s, r in pairs:
        o = s.offsets.item(r, j)
        if filled and s.lengths.item(r, j) < 0:
            dst[at : at + size] = zero
        else:
            dst[at : at + size] = s.map[o : o + size]
        at += size
    return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))


def _ragged(pairs: list[tuple[TarRows, int]], j: int, kind: str) -> Ragged:
    """Field ``j`` (text or bytes) of each ``(source, row)``; a filled cell is empty."""
    pieces = []
    lengths = []
    for s, r in pairs:
        o, z = s.offsets.item(r, j), max(s.lengths.item(r, j), 0)
        pieces.append(s.map[o : o + z])
        lengths.append(z)
    return _joined(pieces, lengths, kind)


def _keys(pairs: list[tuple[TarRows, int]]) -> Ragged:
    pieces = []
    lengths = []
    for s, r in pairs:
        keys = cast(Ragged, s.keys)
        a, b = keys.offsets.item(r), keys.offsets.item(r + 1)
        pieces.append(cast(memoryview, s.key_map)[a:b])
        lengths.append(b - a)
    return _joined(pieces, lengths, "str")


def _joined(pieces: list[memoryview], lengths: list[int], kind: str) -> Ragged:
    """A ragged column of ``pieces`` (bytes, one per row) back to back."""
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(bytearray().join(pieces), dtype=np.uint8)
    if len(values) != offsets[-1]:
        raise ValueError(f"{len(values)} bytes where the index gives {offsets[-1]}: a field "
                         "lies past the end of the map")
    return Ragged(values, offsets, kind)
