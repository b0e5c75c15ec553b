"""Rows copied from memory addresses in many buffers, in one numpy pass each: the gather of
a batch whose rows lie in hundreds of shards' memory maps and indexes
(:mod:`dataflow.readers.across`), where taking them row by row costs a few microseconds of
Python a row.

numpy is lent a read-only view of the process's memory from the lowest address asked for to
the end of the highest row (:func:`span`; for rows, one row starting at every byte of it);
fancy indexing then copies only the rows asked for. Nothing else of the span is touched, but
nothing checks the addresses either: a caller must know that every ``[address, address +
size)`` lies inside a buffer it holds alive for the call (an index's value out of a map's
bounds would read another mapping's memory or fault). The callers check the bounds first,
with the same arrays.
"""

from __future__ import annotations

import numpy as np

RAGGED_INDEX_BYTES = 1 << 20
"""Bytes of a ragged gather (:func:`ragged_at`) up to which its values are taken by one
fancy index of every byte's address (8 bytes of index a value byte); longer ones row by row."""


class _Memory:
    """An object whose array interface is this process's memory at ``address``, read-only,
    as uint8 of ``shape`` and ``strides``."""

    def __init__(self, address: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.__array_interface__ = {"data": (address, True), "shape": shape,
                                    "strides": strides, "typestr": "|u1", "version": 3}


def span(lo: int, hi: int) -> np.ndarray:
    """A read-only uint8 view of the process's memory from address ``lo`` to ``hi``
    (exclusive), holding no buffer alive: see the module."""
    return np.asarray(_Memory(lo, (hi - lo,), (1,)))


def rows_at(addresses: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` bytes at each of ``addresses`` (int64, ``n`` of them, any order), as a
    new C-contiguous ``(n, size)`` uint8 array: a fancy index of a view with a ``size``-byte
    row at every address of the span (``np.take`` would first copy the whole span)."""
    n = len(addresses)
    if n == 0 or size == 0:
        return np.empty((n, size), dtype=np.uint8)
    lo = int(addresses.min())
    rows = np.asarray(_Memory(lo, (int(addresses.max()) - lo + 1, size), (1, 1)))
    return rows[addresses - lo]


def int64_at(addresses: np.ndarray, count: int = 1) -> np.ndarray:
    """The ``count`` native int64 at each of ``addresses``, as a new ``(n, count)`` array
    (``(n,)`` for one)."""
    got = rows_at(addresses, 8 * count).view(np.int64)
    return got.reshape(-1) if count == 1 else got


def ragged_at(addresses: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``lengths[i]`` bytes at ``addresses[i]``, back to back.

    Returns:
        The values (uint8) and the ``n + 1`` offsets (int64) of the rows.
    """
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.empty(0, dtype=np.uint8), offsets
    lo = int(addresses.min())
    memory = span(lo, int((addresses + lengths).max()))
    starts = addresses - lo
    if total <= RAGGED_INDEX_BYTES:
        at = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        return memory[at], offsets
    values = np.empty(total, dtype=np.uint8)
    for a, z, o in zip(starts.tolist(), lengths.tolist(), offsets[:-1].tolist(), strict=True):
        values[o : o + z] = memory[a : a + z]
    return values, offsets
