"""The standing addresses of a reader process's open shards: a gather across shards
(:mod:`dataflow.readers.across`) with no Python a shard, once each of a request's shards has
been gathered from before.

A gather across shards pays a few hundred nanoseconds of Python for each shard of a request:
its reader, its row source, their layout, length and guard, its addresses joined into the
batch's table. A batch of the default shuffle names about 250 shards, and after each batch's
copies those objects are cache misses: 0.3 ms a batch of 256 samples of 12 KB (Arrow,
4,096 shards), a third of the gather. Where a process keeps every shard open while it runs
(no reader is closed before the book is cleared), a shard's addresses do not change: an
:class:`AddressBook` keeps the address row of each record batch of each shard (a tar is one;
:meth:`RowSource.standing <dataflow.readers.across.RowSource.standing>`), where it starts,
and each shard's length, in arrays, and a request whose shards are all in it is gathered from
those arrays alone (:meth:`RowSource.gather_table
<dataflow.readers.across.RowSource.gather_table>`): a row's record batch is found by one
``searchsorted`` over all of them (its shard's only one, where every shard has one).

What keeps that as safe as the gather it replaces:

* a record batch enters the book only after a gather across shards took its rows (the record
  batch validated, a tar's index checked against its map), a shard serves from it only once
  all of its record batches did, and the book keeps its row source, so the memory its
  addresses name stays mapped;
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
"""Addresses (int64) a book holds at most: 32 MiB. Shards whose record batches' addresses
would take it past that are not noted (their requests go the usual way)."""
MAX_ROWS = 1 << 40
"""Rows a shard may have to be noted: a row's key is its shard number and row, packed."""


class AddressBook:
    """The address rows of the record batches of up to ``shards`` open shards (a tar: one),
    by shard number (see the module). Not thread-safe (one reader process's serving thread).

    Args:
        shards: the shard numbers a request may name are ``[0, shards)``.
    """

    def __init__(self, shards: int) -> None:
        self._shards = shards
        self._reset()

    def _reset(self) -> None:
        shards = self._shards
        self._kind: RowSource | None = None  # the first source noted: its layout and gather
        self._sources: list[RowSource | None] = [None] * shards  # keeps their maps' views
        self._first = np.full(shards, -1, dtype=np.int64)  # a shard's first chunk row
        self._lengths = np.zeros(shards, dtype=np.int64)
        self._whole = np.zeros(shards, dtype=bool)  # every chunk of the shard noted
        self._out = np.zeros(shards, dtype=bool)  # never in the book (layout, size, room)
        self._seen = np.zeros(shards, dtype=np.int64)  # its source's `known` when last noted
        self._single = True  # every shard noted has one chunk: its row is its first
        self._chunks = 0  # chunk rows in use
        self._table = np.zeros((0, 0), dtype=np.int64)  # a chunk's addresses a row
        self._starts = np.zeros(0, dtype=np.int64)  # a chunk's first row in its shard
        self._owner = np.zeros(0, dtype=np.int64)  # its shard
        self._ready = np.zeros(0, dtype=bool)  # its addresses noted
        self._keys: tuple[np.ndarray, np.ndarray] | None = None  # sorted (shard, start), rows

    def __len__(self) -> int:
        """Shards in the book: every record batch of theirs noted."""
        return int(np.count_nonzero(self._whole))

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
        ranges = np.asarray(ranges, dtype=np.int64)
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
        if not self._whole[which].all() or (rows >= self._lengths[which]).any():
            return None
        if self._single:
            chunk, local = self._first[which], rows
        else:
            keys, order = self._sorted()
            chunk = order[np.searchsorted(keys, (which << 40) | rows, side="right") - 1]
            local = rows - self._starts[chunk]
        batch = kind.gather_table(self._table, chunk, local)
        if batch is None or lease.pending() or not every_guard_leased():
            return None
        return batch

    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """Every chunk row's key (its shard and first row, packed), ascending, and the chunk
        rows in that order."""
        if self._keys is None:
            n = self._chunks
            keys = (self._owner[:n] << 40) | self._starts[:n]
            order = np.argsort(keys, kind="stable")
            self._keys = keys[order], order
        return self._keys

    def note(self, shards: Sequence[int], sources: Sequence[RowSource]) -> None:
        """Keep the address rows of ``sources`` (the row sources of ``shards``, just gathered
        from) that are not in the book yet and have one, of the book's layout.

        Raises:
            InternalError: a shard number outside ``[0, shards)``, or a shard noted before
                with another row source (its reader is never replaced while the book holds
                it).
        """
        numbers = np.asarray(shards, dtype=np.int64)
        if len(numbers) and (numbers.min() < 0 or numbers.max() >= self._shards):
            raise InternalError(f"shard numbers {numbers.min()}-{numbers.max()} noted in a book "
                                f"of {self._shards} shards")
        for k in np.flatnonzero(~(self._whole | self._out)[numbers]).tolist():
            source, shard = sources[k], shards[k]
            if source.known == self._seen[shard]:  # no record batch taken since
                continue
            standing = source.standing()
            if standing is None:
                self._out[shard] = True
                continue
            bounds, rows = standing
            first = int(self._first[shard])
            if first < 0:
                known = next((row for row in rows if row is not None), None)
                if known is None:
                    continue
                first = self._enter(shard, source, bounds, len(known))
                if first < 0:
                    self._out[shard] = True
                    continue
            elif self._sources[shard] is not source:
                raise InternalError(f"shard {shard} noted with another row source")
            self._seen[shard] = source.known
            ready = self._ready
            for i in np.flatnonzero(~ready[first : first + len(rows)]).tolist():
                row = rows[i]
                if row is not None:
                    self._table[first + i] = np.frombuffer(row, dtype=np.int64)
                    ready[first + i] = True
            self._whole[shard] = bool(ready[first : first + len(rows)].all())

    def _enter(self, shard: int, source: RowSource, bounds: Sequence[int], size: int) -> int:
        """Give ``shard`` (``source``, record batches starting at ``bounds``, addresses of
        ``size`` bytes a record batch) chunk rows, those of empty record batches ready (no row
        is found in one); their first, or -1 where it is never entered: another layout, too
        many rows or addresses."""
        kind = self._kind
        if kind is None:
            kind = self._kind = source
            self._table = np.zeros((0, size // 8), dtype=np.int64)
        elif source.layout != kind.layout:
            return -1
        count = len(bounds) - 1
        if bounds[-1] >= MAX_ROWS or count < 1:
            return -1
        first, end = self._chunks, self._chunks + count
        if end > len(self._starts):
            width = self._table.shape[1]
            grown = max(end, 2 * len(self._starts), 64)
            if min(grown, MAX_CELLS // max(width, 1)) < end:
                return -1
            grown = min(grown, MAX_CELLS // max(width, 1))
            self._table = np.resize(self._table, (grown, width))
            self._starts = np.resize(self._starts, grown)
            self._owner = np.resize(self._owner, grown)
            self._ready = np.concatenate([self._ready, np.zeros(grown - len(self._ready),
                                                                dtype=bool)])
        starts = np.asarray(bounds, dtype=np.int64)
        self._starts[first:end] = starts[:-1]
        self._owner[first:end] = shard
        self._ready[first:end] = starts[1:] == starts[:-1]
        self._chunks = end
        self._first[shard] = first
        self._lengths[shard] = bounds[-1]
        self._sources[shard] = source
        self._single = self._single and count == 1
        self._keys = None
        return first

    def clear(self) -> None:
        """Forget every shard (before their readers close)."""
        self._reset()
