"""One request's rows gathered across many shards in one pass, where a sample-level shuffle
asks for one or two samples of each of hundreds of shards.

Reading such a request shard by shard (:func:`~dataflow.readers.read_ranges` with one
:meth:`~dataflow.readers.ShardReader.read_many` per run of a shard) pays each shard's fixed
costs (range validation, numpy calls on one-element arrays, column views) for a sample or
two: about 50 microseconds a shard, ten times the CPU of reading the same rows from one
shard. Here the rows come straight from every shard's memory map or column views into the
batch's columns. Where no guard needs a check during the gather (:meth:`Checks.free`: every
shard leased, or nothing to check), a format takes each field for all rows at once, by
address (:mod:`dataflow.readers.addressed`); otherwise row by row, in request order, and the
per-shard work is what the guards need: a shard's file is checked (``fstat``) once shortly
before the batch reads its first row (:data:`CHECK_ROWS`) and once after the batch is read.

A format takes part by giving an open reader's :class:`RowSource` (``_row_source()``): the
reader's arrays and views, prepared once and kept while the reader is open. Whatever this
path does not serve exactly as the shard-by-shard path would (a reader of another format or
of a remote shard, shards whose columns disagree, a range out of bounds or empty, a shard
changed or damaged, a record batch not yet known to be intact), it leaves to that path, which
raises, skips or counts as it always did: :func:`read_across` then returns ``None`` having
changed nothing a reader counts.

What the guards protect against stays covered: a file found changed before its first row is
read is not read (its map is not touched, so a shorter file cannot raise SIGBUS; as before,
without a lease, a change landing between a check and the reads right after it is not seen in
time); a file
changed while the batch was read is found by the check after, and nothing read from it is
returned; a tar sample is still checked to start with a tar header at its indexed offset. The
columns returned are copies, so nothing returned views a map and no later check is owed
(:meth:`~dataflow.readers.ShardReader.verify`).
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, cast

import numpy as np

from dataflow.batch import Batch
from dataflow.errors import DataflowError, InternalError
from dataflow.readers import lease
from dataflow.readers.gather import range_rows
from dataflow.readers.guard import FileGuard, all_unchanged, every_guard_leased

if TYPE_CHECKING:
    from dataflow.readers.base import ShardReader
    from dataflow.readers.book import AddressBook

CHECK_ROWS = 32
"""Rows a gather reads between two rounds of checks that their shards did not change (see
:meth:`RowSource.gather`): a shard is read at most this many rows after its check, about 0.1
ms, where checking all of a batch's shards first would leave the whole gather between the
check of a shard and its read; checking each shard right before its first row interleaves a
system call with every row's copies (tar, 1,024 shards, on a loaded 2-core host: 3.1-4.8 ms
of CPU a batch against 2.7-3.7 with every check first; 32 rows ahead: within the noise of
the latter)."""
MAX_ROWS_PER_RUN = 16
"""Mean rows per run of a request (consecutive ranges of one shard) above which it is read
shard by shard: long runs (a block shuffle's blocks) are as cheap with each shard's vectorized
gather as row by row (tar, batch 256: equal at 64 rows a run, 1.7x faster row by row at 16,
5x at 1). With an address book (:mod:`dataflow.readers.book`), mean rows per range: many
short ranges of a few shards (a sample-level shuffle over 8 shards: ~32 one-row ranges a
shard) are gathered in one numpy pass a field from the book, where shard by shard pays a
vectorized gather a shard (Arrow, 8 x 1,000 samples: 1.8 ms a batch against 0.6 for
``"none"``); long ranges stay zero-copy slices of the shard-by-shard read."""


_CLOSED, _ROWS, _LAYOUT, _LENGTH, _GUARD, _LEASED = map(
    attrgetter, ("closed", "_row_lent", "layout", "length", "guard", "leased"))


def layout_of(source: RowSource, fields: object) -> str:
    """:attr:`RowSource.layout` of ``source`` whose fields are described by ``fields``."""
    return sys.intern(f"{type(source).__name__}{fields!r}")


class RowSource:
    """What one open reader lends a gather across shards. Not thread-safe (one per reader).

    Attributes:
        layout: what the batch's shards must share to be gathered together (the class,
            field names, dtypes, shapes, codecs, row sizes), as interned text
            (:func:`layout_of`): compared between the sources of every batch by identity
            first, where comparing tuples of fields would cost microseconds a shard.
        length: the shard's samples.
        guard: the shard's open file, checked before and after a gather; None when nothing
            can change under the reader (a copy it made, bytes in memory).
        known: chunks whose addresses :meth:`standing` gives; it grows as gathers take them.
    """

    layout: str
    length: int
    guard: FileGuard | None
    known: int = 0

    def gather(self, sources: Sequence[RowSource], which: np.ndarray, rows: np.ndarray,
               checks: Checks) -> Batch | None:
        """Rows ``rows[k]`` of ``sources[which[k]]`` for every ``k`` (both int64 arrays), in
        order, as one batch of new arrays (nothing views a map); ``None`` when one of them
        cannot be served here (see the module). ``sources`` are all of this class and
        layout, numbered in the order the rows first name them.

        Unless the checks are free (:meth:`Checks.free`), every :data:`CHECK_ROWS` rows
        (``k = 0, CHECK_ROWS, ...``), the guards of the sources first named in the next
        :data:`CHECK_ROWS` rows are checked (``checks.ahead(k)``) and the gather returns
        ``None`` at once if one changed: a shard's map is never touched after a check that
        found it changed, and a shard is read within :data:`CHECK_ROWS` rows of its check.
        :func:`read_across` checks every guard again after the gather."""
        raise NotImplementedError

    def standing(self) -> tuple[Sequence[int], list[bytes | None]] | None:
        """Where :meth:`gather_table` can take any of this source's rows, valid while the
        source is kept: its chunks' first rows and its length (``chunks + 1`` ascending
        values from 0), and each chunk's addresses as that gather takes them (native
        int64s, packed), ``None`` for a chunk not known yet; ``None`` where that gather
        never takes this source's rows (:mod:`dataflow.readers.book`)."""
        raise NotImplementedError

    def gather_table(self, table: np.ndarray, which: np.ndarray, rows: np.ndarray) -> Batch | None:
        """Rows ``rows[k]`` of the chunk whose :meth:`standing` addresses are
        ``table[which[k]]`` (rows counted from the chunk's first), for every ``k``, in order,
        by address, as :meth:`gather` does them; ``None`` when one cannot be served so. Every
        chunk named is of a source of this class and layout, and every row in bounds; no
        check of a guard is owed (:meth:`Checks.free`)."""
        raise NotImplementedError


class Checks:
    """The checks of one gather's shards (see :meth:`RowSource.gather`). Not thread-safe.

    Attributes:
        guards: each source's guard (None: nothing to check), in source order.
    """

    def __init__(self, guards: list[FileGuard | None], firsts: list[int]) -> None:
        """
        Args:
            guards: see the attribute.
            firsts: the row of the gather that first names each source, ascending (the
                sources are numbered in that order).
        """
        self.guards = guards
        self._firsts = firsts
        self._done = 0

    def ahead(self, k: int) -> bool:
        """Check the guards of the sources first named in rows ``[k, k + CHECK_ROWS)``, ``k``
        a multiple of :data:`CHECK_ROWS` called in order from 0 (those not checked yet: the
        sources first named before row ``k + CHECK_ROWS``).

        Returns:
            Whether none of them changed.
        """
        end = bisect.bisect_left(self._firsts, k + CHECK_ROWS)
        todo, self._done = self.guards[self._done : end], end
        return all_unchanged(todo)

    def free(self) -> bool:
        """Whether no guard needs a check during the gather: each holds its lease (no writer
        can get in before the reader's next turn between tasks) or there is nothing to check.
        The gather may then read every row at once. Where every open guard of the process
        holds its lease, one comparison says so
        (:func:`~dataflow.readers.guard.every_guard_leased`), without asking each of the
        batch's."""
        if lease.pending():
            return False
        if every_guard_leased():
            return True
        guards = self.guards
        if None in guards:
            guards = [g for g in guards if g is not None]
        return all(map(_LEASED, guards))

    def after(self) -> bool:
        """Check every guard again, after the gather: whether none changed (at once where
        every open guard holds its lease, :func:`~dataflow.readers.guard.all_unchanged`)."""
        return all_unchanged(self.guards)


def read_across(get_reader: Callable[[int], ShardReader], ranges: np.ndarray,
                get_many: Callable[[list[int]], list[ShardReader]] | None = None,
                book: AddressBook | None = None) -> Batch | None:
    """The batch of ``ranges`` gathered across their shards in one pass, or ``None`` where the
    shard-by-shard path must read it (see the module): a request of more than
    :data:`MAX_ROWS_PER_RUN` rows a run on average (with a ``book``: a range), or one this
    path does not serve exactly.

    Args:
        get_reader: the open reader of a shard, by shard number.
        ranges: int64 of shape ``(n, 3)``: ``(shard, start, stop)``, in request order.
        get_many: the open readers of a list of distinct shards, in order (default: one
            call of ``get_reader`` each); they are read by this gather only, which changes
            nothing a reader counts.
        book: the standing addresses of shards that stay open until it is cleared
            (:mod:`dataflow.readers.book`): a request whose shards are all in it is gathered
            from it, and the shards of a request gathered otherwise are noted in it.

    Raises:
        InternalError: a gather failed on anything but the data (a bug), naming the shards.
    """
    starts, stops = ranges[:, 1], ranges[:, 2]
    lengths = stops - starts
    if (lengths <= 0).any():
        return None
    total = int(lengths.sum())
    if book is not None and total <= MAX_ROWS_PER_RUN * len(ranges):
        batch = _gathered(lambda: book.gather(ranges), total, lambda: [
            f"#{shard}" for shard in dict.fromkeys(ranges[:, 0].tolist())])
        if batch is not None:
            return batch
    elif total > MAX_ROWS_PER_RUN * (int(np.count_nonzero(ranges[1:, 0] != ranges[:-1, 0])) + 1):
        return None
    shards, first_at, which = np.unique(np.repeat(ranges[:, 0], lengths), return_index=True,
                                        return_inverse=True)
    # Sources are numbered, and readers got, in the order the request first names their
    # shards, as the shard-by-shard read gets them: a shard that cannot be opened is the one
    # it would name.
    order = np.argsort(first_at)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    shards, which, firsts = shards[order], rank[which], first_at[order]
    # Per shard, C loops (map, attrgetter, sets): a batch has hundreds of shards.
    wanted = shards.tolist()
    readers = get_many(wanted) if get_many is not None else list(map(get_reader, wanted))
    if any(map(_CLOSED, readers)):  # more shards than a cache of open readers holds
        return None
    got = list(map(_ROWS, readers))  # each source once prepared (a C loop), else prepared now
    if None in got:
        got = [reader._row_source() for reader in readers]
        if None in got:
            return None
    sources = cast(list[RowSource], got)
    if len(set(map(_LAYOUT, sources))) > 1:
        return None
    rows = range_rows(starts, stops)
    lens = np.fromiter(map(_LENGTH, sources), dtype=np.int64, count=len(sources))
    if (rows < 0).any() or (rows >= lens[which]).any():
        return None
    checks = Checks(list(map(_GUARD, sources)), firsts.tolist())
    batch = _gathered(lambda: sources[0].gather(sources, which, rows, checks), total,
                      lambda: [reader.url for reader in readers])
    if batch is None or not checks.after():
        return None
    if book is not None:
        book.note(wanted, sources)
    return batch


def _gathered(gather: Callable[[], Batch | None], total: int,
              names: Callable[[], list[str]]) -> Batch | None:
    """What ``gather`` returns, ``None`` if it raised a :class:`DataflowError` (the data's:
    the shard-by-shard path raises or counts it).

    Raises:
        InternalError: it raised one (a bug), or anything else, naming the shards
            (``names``).
    """
    try:
        return gather()
    except InternalError:
        raise
    except DataflowError:
        return None
    except Exception as e:
        shards = names()
        raise InternalError(f"gathering {total} rows across {len(shards)} shards "
                            f"({', '.join(shards[:4])}{', ...' if len(shards) > 4 else ''}) "
                            f"failed: {type(e).__name__}: {e}") from e
