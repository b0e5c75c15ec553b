"""The standing addresses of a process's open shards (dataflow.readers.book): once a gather
across shards noted a request's shards, the next requests of those shards are gathered from
the book alone, byte for byte as before; and it serves nothing while a lease is broken or
missing, a row or shard is out of bounds, or a shard is not of its one layout. Real files,
real leases, a real writer process."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataflow.errors import InternalError, ShardChangedError
from dataflow.readers import ShardReader, lease, read_ranges
from dataflow.readers import guard as guards
from dataflow.readers.across import MAX_ROWS_PER_RUN, read_across
from dataflow.readers.arrowrows import ArrowRows
from dataflow.readers.book import AddressBook
from dataflow.readers.guard import settle
from dataflow.readers.tar.rows import TarRows
from dataflow.server.tasks import ReaderCache, WorkerSpec
from tests.unit.test_readers_across import (
    GATHERED,
    PER_SHARD,
    SHARDS,
    _by_range,
    _close,
    _demo,
    _open,
    _shuffled,
    _typed_arrow,
)
from tests.unit.test_readers_lease import (
    WRITE,
    _child,
    _leasable_dir,
    _wait,
    armed,  # noqa: F401 (a fixture)
)
from tests.unit.test_readers_multi import _assert_batches_equal


@pytest.fixture
def root(tmp_path: Path, request: pytest.FixtureRequest,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on a filesystem leases are taken on, leases armed, and only this test's
    guards counted."""
    request.getfixturevalue("armed")
    monkeypatch.setattr(guards, "_OPEN", {})
    monkeypatch.setattr(guards, "_LEASED", {})
    d = _leasable_dir(tmp_path) / f"book-{time.monotonic_ns()}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d)


def _not_gathered(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, a gather across shards other than the book's fails the test."""
    for kind in (TarRows, ArrowRows):
        def refuse(*args: object) -> None:
            raise AssertionError("gathered shard by shard, not from the book")

        monkeypatch.setattr(kind, "gather", refuse)


def _epoch(readers: list[ShardReader], book: AddressBook, epoch: int) -> np.ndarray:
    """Every batch of one epoch read with ``book``, checked against reads by range; the ids."""
    ids = []
    for ranges in _shuffled(readers, epoch):
        got = read_ranges(readers.__getitem__, ranges, None, book)
        _assert_batches_equal(got, _by_range(readers, ranges))
        ids.append(got["id"])
    return np.concatenate(ids)


@pytest.mark.parametrize("kind", GATHERED)
def test_a_second_epoch_comes_from_the_book_exactly_once(root: Path, kind: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    readers = _open(_demo(root, kind), str(root / "c"))
    book = AddressBook(len(readers))
    try:
        assert all(r._guard is not None and r._guard.leased for r in readers)
        everything = list(range(sum(map(len, readers))))
        assert sorted(_epoch(readers, book, 0).tolist()) == everything
        assert len(book) == SHARDS
        _not_gathered(monkeypatch)
        assert sorted(_epoch(readers, book, 1).tolist()) == everything
    finally:
        book.clear()
        _close(readers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tar", "arrow-file"])
def test_nothing_from_the_book_while_a_lease_is_broken(root: Path, kind: str) -> None:
    """A writer opening shard 5 breaks its lease: the book serves no request (not only those
    of shard 5) until every guard holds its lease again; the usual read then finds shard 5
    changed, naming it."""
    paths = _demo(root, kind)
    readers = _open(paths, str(root / "c"))
    book = AddressBook(len(readers))
    try:
        _epoch(readers, book, 0)
        batches = _shuffled(readers, 1)
        with_five = next(b for b in batches if 5 in b[:, 0])
        without = next(b for b in batches if 5 not in b[:, 0])
        assert book.gather(with_five) is not None and book.gather(without) is not None
        with _child(WRITE, paths[5]) as writer:
            _wait(lease.pending)
            assert book.gather(with_five) is None and book.gather(without) is None
            settle()
            assert writer.wait(timeout=30) == 0
        assert book.gather(without) is None
        _assert_batches_equal(read_ranges(readers.__getitem__, without, None, book),
                              _by_range(readers, without))
        with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
            read_ranges(readers.__getitem__, with_five, None, book)
        assert e.value.shard == paths[5]
    finally:
        book.clear()
        _close(readers)


def test_nothing_from_the_book_where_a_guard_holds_no_lease(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _demo(root, "tar")
    readers = _open(paths, str(root / "c"))
    monkeypatch.setattr(lease, "take", lambda fd, url: lease.Taken.NONE)
    unleased = _open(paths[:1], str(root / "c"))
    book = AddressBook(len(readers))
    try:
        _epoch(readers, book, 0)
        assert len(book) == SHARDS
        assert all(book.gather(ranges) is None for ranges in _shuffled(readers, 1))
    finally:
        book.clear()
        _close(readers + unleased)


def test_rows_and_shards_out_of_bounds_are_left_to_the_usual_read(root: Path) -> None:
    readers = _open(_demo(root, "arrow-file"), str(root / "c"))
    book = AddressBook(len(readers))
    try:
        _epoch(readers, book, 0)
        ranges = _shuffled(readers, 1)[0]
        assert book.gather(ranges) is not None
        for shard, row in ((0, len(readers[0])), (SHARDS, 0), (-1, 0), (0, -1)):
            bad = ranges.copy()
            bad[3] = [shard, row, row + 1]
            assert book.gather(bad) is None
        longer = ranges.copy()
        longer[3, 2] += 1  # a range of two rows: still served, rows in bounds
        if longer[3, 2] <= len(readers[longer[3, 0]]):
            _assert_batches_equal(book.gather(longer), _by_range(readers, longer))
    finally:
        book.clear()
        _close(readers)


def test_one_layout_and_a_bounded_table(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The book keeps the first layout it is shown and no shard of another, and no more
    addresses than :data:`MAX_CELLS`."""
    tars = _open(_demo(root, "tar"), str(root / "c"))
    arrows = _open(_demo(root, "arrow-file"), str(root / "c"))
    try:
        for first, second in ((tars, arrows), (arrows, tars)):
            book = AddressBook(SHARDS)
            shards = list(range(SHARDS))
            book.note(shards, [r._row_source() for r in first])
            assert len(book) == SHARDS or first is arrows  # Arrow: once a gather took them
            read_across(first.__getitem__, _shuffled(first)[0], None, book)
            held = len(book)
            assert held > 0
            book.clear()
            book.note(shards[:1], [first[0]._row_source()])
            book.note(shards[1:], [r._row_source() for r in second[1:]])
            assert len(book) == 1
            book.clear()
        monkeypatch.setattr("dataflow.readers.book.MAX_CELLS", 3 * 8)  # 3 tars' addresses
        book = AddressBook(SHARDS)
        book.note(list(range(5)), [r._row_source() for r in tars[:5]])
        assert len(book) == 3
        inside = np.array([[2, 0, 1], [0, 3, 4], [1, 1, 3]], dtype=np.int64)
        _assert_batches_equal(book.gather(inside), _by_range(tars, inside))
        assert book.gather(np.array([[2, 0, 1], [3, 0, 1]], dtype=np.int64)) is None
    finally:
        _close(tars + arrows)


@pytest.mark.parametrize(("chunk", "lists", "kept"), [(12, False, True), (5, False, True),
                                                      (1, False, True), (12, True, False)],
                         ids=["one-record-batch", "several", "a-row-each", "a-list-column"])
def test_arrow_shards_of_any_record_batches_without_list_columns(
        root: Path, chunk: int, lists: bool, kept: bool) -> None:
    """A shard is in the book once every record batch of it was gathered; each row is taken
    from its own record batch, byte for byte as the usual read."""
    paths = [_typed_arrow(str(root / f"t{s}.arrow"), s, chunk=chunk, lists=lists)
             for s in range(6)]
    readers = _open(paths, str(root / "c"))
    book = AddressBook(len(readers))
    try:
        some = np.array([[s, r, r + 1] for r in (3, 0) for s in (4, 1, 5, 0)], dtype=np.int64)
        assert read_across(readers.__getitem__, some, None, book) is not None
        assert len(book) == (4 if kept and chunk == 12 else 0)  # and shards 2 and 3 unread
        every = np.array([[s, r, r + 1] for r in range(12) for s in (4, 1, 5, 0)],
                         dtype=np.int64)
        _assert_batches_equal(read_ranges(readers.__getitem__, every, None, book),
                              _by_range(readers, every))
        assert len(book) == (4 if kept else 0)
        rng = np.random.default_rng(chunk)
        for _ in range(5):
            ranges = every[rng.permutation(len(every))[:17]]
            ranges[:, 2] = np.minimum(ranges[:, 1] + rng.integers(1, 4, len(ranges)), 12)
            got = book.gather(ranges)
            assert (got is not None) == kept
            if got is not None:
                _assert_batches_equal(got, _by_range(readers, ranges))
    finally:
        book.clear()
        _close(readers)


def test_a_reader_cache_keeps_a_book_only_while_no_reader_is_closed(root: Path) -> None:
    paths = _demo(root, "tar")
    every = WorkerSpec("ipc://@x", 8, tuple(paths), str(root / "c"), None, "raise", 1, 20,
                       1 << 30, str(root) + "/", 16, max_open_shards=SHARDS)
    some = WorkerSpec("ipc://@x", 8, tuple(paths), str(root / "c"), None, "raise", 1, 20,
                      1 << 30, str(root) + "/", 16, max_open_shards=SHARDS - 1)
    assert ReaderCache(some).book is None
    cache = ReaderCache(every)
    book = cache.book
    assert book is not None
    readers = _open(paths, str(root / "c"))
    try:
        for ranges in _shuffled(readers):
            _assert_batches_equal(read_ranges(cache.get, ranges, cache.get_many, book),
                                  _by_range(readers, ranges))
        assert len(book) == SHARDS
    finally:
        cache.close()
        _close(readers)
    assert len(book) == 0


def test_a_shard_number_out_of_the_dataset_is_an_internal_error(root: Path) -> None:
    """Never another shard's reader under that number (shard -1 would open the last one,
    one reader more than the cache holds, and close the first under the book)."""
    paths = _demo(root, "tar", shards=4)
    spec = WorkerSpec("ipc://@x", 8, tuple(paths), str(root / "c"), None, "raise", 1, 20,
                      1 << 30, str(root) + "/", 16, max_open_shards=4)
    cache = ReaderCache(spec)
    book = cache.book
    assert book is not None
    try:
        for shard in (-1, 4):
            with pytest.raises(InternalError, match=f"no shard {shard} in a dataset of 4"):
                cache.get(shard)
        with pytest.raises(InternalError, match="shard numbers -1-0 noted in a book of 4"):
            book.note([-1, 0], [cache.get(0)._row_source()] * 2)
        assert len(book) == 0
        ranges = np.array([[0, 0, 1], [1, 0, 1]], dtype=np.int64)
        read_ranges(cache.get, ranges, cache.get_many, book)
        assert len(book) == 2
        for bad in ([[0, 0, 0], [1, 0, 1]], [[0, 1, 1], [1, 0, 1]]):
            assert book.gather(np.array(bad, dtype=np.int64)) is None
        assert book.gather(np.zeros((0, 3), dtype=np.int64)) is None
    finally:
        cache.close()


@pytest.mark.parametrize("noted", [False, True], ids=["usual", "book"])
def test_a_bug_in_a_gather_raises_and_is_not_left_to_the_usual_read(
        root: Path, noted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    readers = _open(_demo(root, "tar"), str(root / "c"))
    book = AddressBook(len(readers))
    try:
        if noted:
            _epoch(readers, book, 0)

        def bug(*args: object) -> None:
            raise InternalError("a bug")

        monkeypatch.setattr(TarRows, "gather_table", bug)
        with pytest.raises(InternalError, match="a bug"):
            read_across(readers.__getitem__, _shuffled(readers, 1)[0], None, book)
    finally:
        book.clear()
        _close(readers)


@pytest.mark.parametrize("kind", ["tar", "arrow-file"])
def test_short_ranges_of_few_shards_come_from_the_book_long_ones_are_read_by_shard(
        root: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shards, one-row ranges (a sample shuffle over few shards: many rows a run) are
    noted and then served by the book; ranges of many rows are left to the shard-by-shard
    read (slices), book or not."""
    readers = _open(_demo(root, kind, shards=2, uneven=False), str(root / "c"))
    book = AddressBook(len(readers))
    try:
        rows = np.arange(PER_SHARD)[::-1]  # more than MAX_ROWS_PER_RUN a shard
        one_row = np.array([[s, r, r + 1] for s in (0, 1) for r in rows], dtype=np.int64)
        assert read_across(readers.__getitem__, one_row) is None  # no book: many rows a run
        _assert_batches_equal(read_ranges(readers.__getitem__, one_row, None, book),
                              _by_range(readers, one_row))
        assert len(book) == 2
        long = np.array([[0, 0, MAX_ROWS_PER_RUN + 1], [1, 0, MAX_ROWS_PER_RUN + 1]],
                        dtype=np.int64)
        assert read_across(readers.__getitem__, long, None, book) is None
        _not_gathered(monkeypatch)
        _assert_batches_equal(read_ranges(readers.__getitem__, one_row, None, book),
                              _by_range(readers, one_row))
        _assert_batches_equal(read_ranges(readers.__getitem__, long, None, book),
                              _by_range(readers, long))
    finally:
        book.clear()
        _close(readers)


def _with_empty_batches(path: str, shard: int) -> str:
    """12 rows in record batches of 5, 0, 7 and 0 rows."""
    ids = np.arange(12) + 100 * shard
    table = pa.table({"id": ids, "txt": pa.array([f"t{i}" for i in ids])})
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        for lo, hi in ((0, 5), (5, 5), (5, 12), (12, 12)):
            w.write_batch(table.slice(lo, hi - lo).to_batches(max_chunksize=12)[0]
                          if hi > lo else pa.record_batch([pa.array([], pa.int64()),
                                                           pa.array([], pa.string())],
                                                          schema=table.schema))
    return path


def test_empty_record_batches_and_a_shard_noted_again_without_news(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty record batches (never gathered) do not keep a shard out of the book; a shard
    whose source took no record batch since it was last noted is not looked at again."""
    paths = [_with_empty_batches(str(root / f"e{s}.arrow"), s) for s in range(3)]
    readers = _open(paths, str(root / "c"))
    book = AddressBook(len(readers))
    try:
        assert [r._row_source().bounds for r in readers[:1]] == [[0, 5, 5, 12, 12]]
        every = np.array([[s, r, r + 1] for r in range(12) for s in (2, 0, 1)],
                         dtype=np.int64)
        _assert_batches_equal(read_ranges(readers.__getitem__, every, None, book),
                              _by_range(readers, every))
        assert len(book) == 3
        _assert_batches_equal(book.gather(every[::-1]), _by_range(readers, every[::-1]))
        looked = []
        monkeypatch.setattr(ArrowRows, "standing",
                            lambda self: looked.append(self) or (self.bounds, self.ats))
        fresh = _open(paths, str(root / "c"))
        readers += fresh
        partly = AddressBook(len(fresh))
        first = np.array([[0, 1, 2], [1, 3, 4]], dtype=np.int64)  # record batch 0 of each
        assert read_across(fresh.__getitem__, first, None, partly) is not None
        assert len(looked) == 2 and len(partly) == 0
        partly.note([0, 1], [r._row_source() for r in fresh[:2]])  # nothing new taken
        assert len(looked) == 2
        rest = np.array([[0, 6, 7], [1, 11, 12]], dtype=np.int64)  # record batch 2
        _assert_batches_equal(read_ranges(fresh.__getitem__, rest, None, partly),
                              _by_range(fresh, rest))
        assert len(looked) == 4 and len(partly) == 2
    finally:
        book.clear()
        _close(readers)
