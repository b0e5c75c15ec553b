"""The standing addresses of a reader process's open shards: a gather across shards
(:mod:`dataflow.readers.across`) with no Python a shard, once each of a request's shards has
been gathered from before.

A gather across shards pays a few hundred nanoseconds of Python for each shard of a request:
its reader, its row source, their layout, length and guard, its addresses joined into the
batch's table. A batch of the default shuffle names about 250 shards, and after each batch's
copies those objects are cache misses: 0.3 ms a batch of 256 samples of 12 KB (Arrow,
4,096 shards), a third of the gather. Where a process keeps every shard open while it runs
(no reader is closed before the book is cleared), a shard's addresses do not change: an
:class:`AddressBook` keeps each shard's address row (:meth:`RowSource.standing
<dataflow.readers.across.RowSource.standing>`) and length in arrays indexed by shard number,
and a request whose shards are all in it is gathered from those arrays alone
(:meth:`RowSource.gather_table <dataflow.readers.across.RowSource.gather_table>`).

What keeps that as safe as the gather it replaces:

* a shard enters the book only after a gather across shards took its rows (its record batch
  validated, its index checked against its map), and the book keeps its row source, so the
  memory its addresses name stays mapped;
* the book serves a request only while every open guard of the process holds its read lease
  and no lease broke (the condition under which the gather by address needs no check,
  :meth:`Checks.free <dataflow.readers.across.Checks.free>`), before and after the gather:
  no writer can get in meanwhile; otherwise the request goes the usual way, which checks each
  shard;
* rows are checked against each shard's length, and each format checks every address it
  reads against its map as before; anything else leaves the request to the usual way;
* the book holds one layout (the first noted): shards of another are never in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dataflow.batch import Batch
from dataflow.errors import InternalError
from dataflow.readers import lease
from dataflow.readers.gather import range_rows
from dataflow.readers.guard import every_guard_leased

if TYPE_CHECKING:
    from dataflow.readers.across import RowSource

MAX_CELLS = 1 << 22
"""Addresses (int64) a book holds at most: 32 MiB. A book whose table would be larger (shards
times a layout's addresses a row) keeps nothing, and every request goes the usual way."""


class AddressBook:
    """The address rows of up to ``shards`` open shards, by shard number (see the module). Not
    thread-safe (one reader process's serving thread).

    Args:
        shards: the shard numbers a request may name are ``[0, shards)``.
    """

    def __init__(self, shards: int) -> None:
        self._shards = shards
        self._kind: RowSource | None = None  # the first source noted: its layout and gather
        self._table = np.zeros((0, 0), dtype=np.int64)
        self._lengths = np.zeros(shards, dtype=np.int64)
        self._ready = np.zeros(shards, dtype=bool)
        self._sources: list[RowSource | None] = [None] * shards  # keeps their maps' views
        self._full = False  # too many addresses: the book keeps nothing

    def __len__(self) -> int:
        """Shards in the book."""
        return int(np.count_nonzero(self._ready))

    def gather(self, ranges: np.ndarray) -> Batch | None:
        """The batch of ``ranges`` (int64 ``(n, 3)``: shard, start, stop; in request order)
        gathered by the addresses the book holds, as :func:`~dataflow.readers.read_across`
        would; ``None`` when one of its shards is not in the book, a range is empty or a row
        out of its shard's bounds, a lease broke or a guard holds none, or the format leaves
        the rows to another path.

        Raises:
            DataflowError: as the format's gather (the caller leaves the request to the usual
                way).
        """
        kind = self._kind
        if kind is None or lease.pending() or not every_guard_leased():
            return None
        shards, starts, stops = ranges[:, 0], ranges[:, 1], ranges[:, 2]
        lengths = stops - starts
        if not len(ranges) or (lengths <= 0).any():
            return None
        if (lengths == 1).all():
            which, rows = shards, starts
        else:
            which, rows = np.repeat(shards, lengths), range_rows(starts, stops)
        if which.min() < 0 or which.max() >= self._shards or rows.min() < 0:
            return None
        if not self._ready[which].all() or (rows >= self._lengths[which]).any():
            return None
        batch = kind.gather_table(self._table, which, rows)
        if batch is None or lease.pending() or not every_guard_leased():
            return None
        return batch

    def note(self, shards: Sequence[int], sources: Sequence[RowSource]) -> None:
        """Keep the address rows of ``sources`` (the row sources of ``shards``, just gathered
        from) that are not in the book yet and have one, of the book's layout.

        Raises:
            InternalError: a shard number outside ``[0, shards)``.
        """
        if self._full:
            return
        numbers = np.asarray(shards, dtype=np.int64)
        if len(numbers) and (numbers.min() < 0 or numbers.max() >= self._shards):
            raise InternalError(f"shard numbers {numbers.min()}-{numbers.max()} noted in a book "
                                f"of {self._shards} shards")
        todo = np.flatnonzero(~self._ready[numbers]).tolist()
        for k in todo:
            source, shard = sources[k], shards[k]
            row = source.standing()
            if row is None:
                continue
            if self._kind is None:
                width = len(row) // 8
                if width * self._shards > MAX_CELLS:
                    self._full = True
                    return
                self._kind = source
                self._table = np.zeros((self._shards, width), dtype=np.int64)
            elif source.layout != self._kind.layout:
                continue
            self._table[shard] = np.frombuffer(row, dtype=np.int64)
            self._lengths[shard] = source.length
            self._sources[shard] = source
            self._ready[shard] = True

    def clear(self) -> None:
        """Forget every shard (before their readers close)."""
        self._kind = None
        self._table = np.zeros((0, 0), dtype=np.int64)
        self._ready[:] = False
        self._sources = [None] * self._shards
