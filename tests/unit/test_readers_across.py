"""A request of a few rows from each of many shards, gathered across them in one pass
(dataflow.readers.across): the same batch as reading shard by shard, byte for byte, on real
files; and everything it does not serve exactly (a changed or damaged shard, shards that
disagree, readers closed meanwhile) left to the shard-by-shard read, which raises or counts
as before."""

from __future__ import annotations

import gzip
import io
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
import webdataset as wds

from dataflow.batch import concat
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import SchemaError, ShardChangedError, ShardReadError
from dataflow.plan import rank_batches
from dataflow.readers import IndexedShard, ShardReader, TarOptions, open_shard, read_ranges
from dataflow.readers.across import CHECK_ROWS, MAX_ROWS_PER_RUN, Checks, read_across
from dataflow.readers.arrowrows import ArrowRows
from dataflow.readers.guard import FileGuard
from dataflow.readers.tar.rows import TarRows, address_table
from dataflow.server.tasks import ReaderCache, WorkerSpec
from dataflow.storage.cache import identity
from tests.unit.test_readers_lease import armed  # noqa: F401 (a fixture)
from tests.unit.test_readers_multi import _assert_batches_equal

SHARDS, PER_SHARD, BATCH = 24, 20, 32
GATHERED = ["arrow-file", "arrow-stream", "tar"]


def _demo(root, kind: str, shards: int = SHARDS, shape: tuple[int, ...] = (2, 3),
          uneven: bool = True) -> list[str]:
    fmt, _, arrow_kind = kind.partition("-")
    spec = DemoSpec(fmt=fmt, shards=shards, samples_per_shard=PER_SHARD, image_shape=shape,
                    seed=3, arrow_kind=arrow_kind or "file", uneven=uneven)
    return [str(p) for p in make_demo(str(root / kind), spec, progress=None).paths]


def _open(paths: list[str], cache: str, **kw) -> list[ShardReader]:
    return [open_shard(p, cache_dir=cache, **kw) for p in paths]


def _shuffled(readers: list[ShardReader], epoch: int = 0) -> list[np.ndarray]:
    """Every batch of one epoch of the default shuffle: one-sample ranges of many shards."""
    plan = rank_batches([len(r) for r in readers], world_size=1, rank=0, epoch=epoch, seed=0,
                        batch_size=BATCH)
    return [plan.rows(i) for i in range(len(plan))]


def _by_range(readers: list[ShardReader], ranges: np.ndarray) -> dict:
    return concat([readers[s].read(a, b) for s, a, b in ranges.tolist()])


def _close(readers: list[ShardReader]) -> None:
    for r in readers:
        r.close()


@pytest.fixture(params=["fstat", "leases"])
def checks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How the guards check the shards: ``fstat`` (gathered row by row) or leases (armed;
    gathered by address). Counts the gathers by address."""
    if request.param == "leases":
        request.getfixturevalue("armed")
    by_address = [0]
    for kind in (TarRows, ArrowRows):
        at = kind.gather_table

        def counted(self, *args, at=at):
            by_address[0] += 1
            return at(self, *args)

        monkeypatch.setattr(kind, "gather_table", counted)
    return by_address


@pytest.mark.parametrize("kind", [*GATHERED, "parquet"])
def test_a_shuffled_epoch_gathered_across_shards_equals_reads_by_range(
        tmp_path, kind: str, checks: list[int]) -> None:
    """Every batch of an epoch, gathered across shards (Parquet: shard by shard), equals its
    ranges read one by one and joined; every sample arrives once. Tars are gathered by
    address where the shards are leased, else row by row."""
    readers = _open(_demo(tmp_path, kind), str(tmp_path / "c"))
    leased = all(r._guard is not None and r._guard.leased for r in readers)
    try:
        ids = []
        for ranges in _shuffled(readers):
            across = read_across(readers.__getitem__, ranges)
            assert (across is not None) == (kind in GATHERED)
            got = read_ranges(readers.__getitem__, ranges)
            want = _by_range(readers, ranges)
            _assert_batches_equal(got, want)
            for col in got.values():
                arr = col if isinstance(col, np.ndarray) else col.values
                assert arr.flags.writeable, "the batch's columns are its own, not views"
            ids.append(got["id"])
        assert sorted(np.concatenate(ids).tolist()) == list(range(sum(map(len, readers))))
        assert (checks[0] > 0) == (kind in GATHERED and leased)
    finally:
        _close(readers)


def test_runs_of_many_rows_are_read_shard_by_shard(tmp_path) -> None:
    readers = _open(_demo(tmp_path, "tar", shards=2, uneven=False), str(tmp_path / "c"))
    long = MAX_ROWS_PER_RUN + 1
    try:
        assert min(map(len, readers)) >= long
        for ranges, across in (([[0, 0, long], [1, 0, long]], False),
                               ([[0, 0, 2], [0, 5, 7], [1, 0, long - 1]], True)):
            ranges = np.array(ranges, dtype=np.int64)
            assert (read_across(readers.__getitem__, ranges) is not None) == across
            _assert_batches_equal(read_ranges(readers.__getitem__, ranges),
                                  _by_range(readers, ranges))
    finally:
        _close(readers)


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def _conventions_tar(path: str, shard: int) -> str:
    """WebDataset samples with an int, a big-endian ``.npy``, text and bytes; sample 2 of
    every shard lacks its text, sample 4 its ``.npy``."""
    with wds.TarWriter(path) as w:
        for i in range(6):
            n = shard * 10 + i
            fields = {"cls": f"{n}".encode(), "x.npy": _npy(np.full(2, n + 0.5, dtype=">f4")),
                      "txt": f"text {n}".encode(), "bin": bytes([n % 256]) * (i + 1)}
            fields.pop("txt" if i == 2 else "x.npy" if i == 4 else "none", None)
            w.write({"__key__": f"dir/{n:06d}", **fields})
    return path


def _gzipped(path: str) -> str:
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    return path + ".gz"


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_tar_keys_filled_cells_and_foreign_byte_order_across_shards(tmp_path, gz: bool,
                                                                    checks: list[int]) -> None:
    """Gathered row by row, and by address (a gzipped tar is read from its decompressed
    copy, which needs no check: by address even without leases)."""
    paths = [_conventions_tar(str(tmp_path / f"s{s}.tar"), s) for s in range(8)]
    if gz:
        paths = [_gzipped(p) for p in paths]
    readers = _open(paths, str(tmp_path / "c"), tar=TarOptions(keys=True, missing_field="fill"))
    try:
        rng = np.random.default_rng(1)
        rows = [(s, i, i + 1) for s, i in zip(rng.integers(0, 8, 20).tolist(),
                                              rng.integers(0, 6, 20).tolist(), strict=True)]
        ranges = np.array(rows + [(2, 2, 3), (5, 4, 5)], dtype=np.int64)
        assert read_across(readers.__getitem__, ranges) is not None
        got = read_ranges(readers.__getitem__, ranges)
        _assert_batches_equal(got, _by_range(readers, ranges))
        assert got["x"].dtype == np.float32 and got["x"][-2:, 0].tolist() == [22.5, 0.0]
        last = (len(ranges) - 2, len(ranges) - 1)
        assert [got["txt"][k] for k in last] == ["", "text 54"]
        assert [got["__key__"][k] for k in last] == ["dir/000022", "dir/000054"]
        assert (checks[0] > 0) == (gz or all(r._guard.leased for r in readers))
    finally:
        _close(readers)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("missing", ["fill", "skip"])
@pytest.mark.parametrize("n", [1, 7, 64])
def test_a_tar_gather_by_address_equals_the_gather_row_by_row(tmp_path, keys: bool,
                                                              missing: str, n: int) -> None:
    paths = [_conventions_tar(str(tmp_path / f"s{s}.tar"), s) for s in range(8)]
    readers = _open(paths, str(tmp_path / "c"),
                    tar=TarOptions(keys=keys, missing_field=missing))
    try:
        sources = [r._row_source() for r in readers]
        table = address_table(sources)
        assert table is not None
        rng = np.random.default_rng(n)
        for _ in range(20):
            which = rng.integers(0, len(sources), n)
            rows = rng.integers(0, [len(readers[w]) for w in which.tolist()])
            checks = Checks([s.guard for s in sources], [0] * len(sources))
            want = sources[0]._gather_rows(sources, which.tolist(), rows.tolist(), checks)
            got = sources[0].gather_table(table, which, rows)
            assert want is not None and got is not None
            _assert_batches_equal(got, want)
    finally:
        _close(readers)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_tar_index_past_its_map_leaves_the_rows_to_the_row_by_row_gather(
        tmp_path, gz: bool) -> None:
    """What a gather by address reads is first checked to lie inside each shard's map: an
    index past it (here, maps said shorter than they are) reads nothing."""
    paths = [_conventions_tar(str(tmp_path / f"s{s}.tar"), s) for s in range(4)]
    readers = _open([_gzipped(p) for p in paths] if gz else paths, str(tmp_path / "c"),
                    tar=TarOptions(missing_field="fill"))
    try:
        sources = [r._row_source() for r in readers]
        table = address_table(sources)
        which, rows = np.array([0, 3, 1], dtype=np.int64), np.array([5, 1, 0], dtype=np.int64)
        assert sources[0].gather_table(table, which, rows) is not None
        for size in (1, 600):  # before the first header's magic; inside the first sample
            short = table.copy()
            short[:, 1] = size
            assert sources[0].gather_table(short, which, rows) is None
    finally:
        _close(readers)


def _rewrite(src: str, dst: str) -> None:
    """``cp src dst``: the same inode, new bytes (and a new mtime)."""
    ino = os.stat(dst).st_ino
    shutil.copyfile(src, dst)
    assert os.stat(dst).st_ino == ino


@pytest.mark.parametrize("kind", GATHERED)
@pytest.mark.parametrize("shorter", [False, True], ids=["same-size", "shorter"])
def test_a_shard_rewritten_under_a_gather_is_refused_or_counted(tmp_path, kind: str,
                                                                shorter: bool) -> None:
    """Shard 5 rewritten in place (or cut short: its map is never touched, no SIGBUS): a
    batch touching it raises naming it, or under skip leaves its rows out and counts them;
    the other shards' rows are served in order."""
    paths = _demo(tmp_path, kind)
    other = _demo(tmp_path / "other", kind, shards=2 if not shorter else 1)[-1]
    cache = str(tmp_path / "c")
    strict, lenient = _open(paths, cache), _open(paths, cache, on_error="skip")
    try:
        batches = _shuffled(strict)
        ranges = next(b for b in batches if 5 in b[:, 0])
        assert read_across(strict.__getitem__, ranges) is not None
        if shorter:
            with open(paths[5], "r+b") as f:
                f.truncate(os.path.getsize(paths[5]) // 3)
        else:
            _rewrite(other, paths[5])
        assert read_across(strict.__getitem__, ranges) is None
        with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
            read_ranges(strict.__getitem__, ranges)
        assert e.value.shard == paths[5]
        before = lenient[5].skipped
        got = read_ranges(lenient.__getitem__, ranges)
        kept = ranges[ranges[:, 0] != 5]
        assert lenient[5].skipped - before == len(ranges) - len(kept)
        _assert_batches_equal(got, _by_range(strict, kept))
    finally:
        _close(strict + lenient)


def test_a_tar_header_gone_under_a_kept_identity_is_refused_naming_the_sample(tmp_path) -> None:
    paths = _demo(tmp_path, "tar")
    readers = _open(paths, str(tmp_path / "c"))
    try:
        ranges = next(b for b in _shuffled(readers) if 5 in b[:, 0])
        row = int(ranges[ranges[:, 0] == 5][0, 1])
        assert read_across(readers.__getitem__, ranges) is not None
        heads = readers[5]._index.headers  # type: ignore[attr-defined]
        st = os.stat(paths[5])
        with open(paths[5], "r+b") as f:
            f.seek(int(heads[row]) + 257)
            f.write(b"Xsta?")
        os.utime(paths[5], ns=(st.st_atime_ns, st.st_mtime_ns))
        assert read_across(readers.__getitem__, ranges) is None
        with pytest.raises(ShardChangedError, match="no tar header where the index has") as e:
            read_ranges(readers.__getitem__, ranges)
        assert (e.value.shard, e.value.index) == (paths[5], row)
    finally:
        _close(readers)


def _damaged_arrow(path: str, kind: str) -> None:
    """40 rows in record batches of 10; batch 2's strings made invalid UTF-8."""
    table = pa.table({"id": np.arange(40), "s": [f"v{i:04d}" for i in range(40)]})
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with pa.OSFile(path, "wb") as f, new(f, table.schema) as w:
        w.write_table(table, max_chunksize=10)
    with open(path, "r+b") as f:
        f.seek(f.read().index(b"v0025") + 1)
        f.write(b"\xff")


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_an_arrow_record_batch_damaged_is_raised_or_counted(tmp_path, kind: str) -> None:
    paths = [str(tmp_path / f"a{s}.arrow") for s in range(6)]
    for p in paths:
        _damaged_arrow(p, kind)
    ranges = np.array([[s, r, r + 1] for r in (3, 25, 31) for s in range(6)], dtype=np.int64)
    strict, lenient = _open(paths, str(tmp_path / "c")), _open(paths, str(tmp_path / "c"),
                                                                 on_error="skip")
    try:
        good = ranges[ranges[:, 1] != 25]
        assert read_across(strict.__getitem__, good) is not None
        assert read_across(strict.__getitem__, ranges) is None
        with pytest.raises(ShardReadError, match=r"record batch 2 \(samples 20\.\.29\) is "
                           "damaged") as e:
            read_ranges(strict.__getitem__, ranges)
        assert e.value.shard == paths[0]
        got = read_ranges(lenient.__getitem__, ranges)
        assert got["id"].tolist() == [3] * 6 + [31] * 6
        assert [r.skipped for r in lenient] == [1] * 6
    finally:
        _close(strict + lenient)


def test_shards_that_disagree_are_left_to_the_shard_by_shard_read(tmp_path) -> None:
    """Images of two shapes: refused naming the field as before; tar and Arrow shards in one
    batch: read shard by shard."""
    tar = _demo(tmp_path, "tar", shards=4)
    readers = _open(tar[:2] + _demo(tmp_path / "b", "tar", shards=4, shape=(3, 2))[2:],
                    str(tmp_path / "c"))
    mixed = _open(tar[:2] + _demo(tmp_path, "arrow-file", shards=4)[2:], str(tmp_path / "c"))
    ranges = np.array([[s, 1, 2] for s in range(4)], dtype=np.int64)
    try:
        assert read_across(readers.__getitem__, ranges) is None
        with pytest.raises(SchemaError, match="field 'image'"):
            read_ranges(readers.__getitem__, ranges)
        assert read_across(mixed.__getitem__, ranges) is None
        _assert_batches_equal(read_ranges(mixed.__getitem__, ranges), _by_range(mixed, ranges))
    finally:
        _close(readers + mixed)


def test_more_shards_than_a_reader_keeps_open(tmp_path) -> None:
    """A batch of more shards than ``max_open_shards``: opening them closed the first ones,
    so it is read shard by shard, each opened as it is read."""
    paths = _demo(tmp_path, "tar")
    spec = WorkerSpec("ipc://@x", 8, tuple(paths), str(tmp_path / "c"), None, "raise", 1, 20,
                      1 << 30, str(tmp_path) + "/", 16, max_open_shards=4)
    cache = ReaderCache(spec)
    readers = _open(paths, str(tmp_path / "c"))
    try:
        for ranges in _shuffled(readers)[:3]:
            assert read_across(cache.get, ranges) is None
            _assert_batches_equal(read_ranges(cache.get, ranges), _by_range(readers, ranges))
    finally:
        cache.close()
        _close(readers)


def _typed_arrow(path: str, shard: int, chunk: int = 5, large: bool = False,
                 lists: bool = True) -> str:
    """Columns of many types, in record batches of ``chunk`` rows: every gather kind (scalars,
    fixed rows, typed lists unless not ``lists``, bytes and text with 32-bit offsets, or
    64-bit where ``large``)."""
    n = 12
    ids = np.arange(n) + 100 * shard
    columns = {
        "id": ids,
        "small": pa.array(ids % 7 - 3, type=pa.int8()),
        "flag": ids % 3 == 0,
        "x": ids * 0.25,
        "big": pa.array(ids.astype(np.uint64) + np.uint64(2**63), type=pa.uint64()),
        "vec": pa.array([[float(i), -float(i)] for i in ids], type=pa.list_(pa.float32(), 2)),
        "seq": pa.array([list(range(i % 4)) for i in ids], type=pa.list_(pa.int16())),
        "raw": pa.array([bytes([i % 256]) * (i % 5) for i in ids],
                        type=pa.large_binary() if large else pa.binary()),
        "txt": pa.array([f"t{i}" * (i % 3) for i in ids],
                        type=pa.large_string() if large else pa.string()),
    }
    if not lists:
        del columns["seq"]
    table = pa.table(columns)
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=chunk)
    return path


def test_arrow_columns_of_every_kind_across_shards(tmp_path) -> None:
    paths = [_typed_arrow(str(tmp_path / f"t{s}.arrow"), s) for s in range(6)]
    readers = _open(paths, str(tmp_path / "c"))
    try:
        rng = np.random.default_rng(2)
        ranges = np.array([(s, r, r + 1) for s, r in zip(rng.integers(0, 6, 30).tolist(),
                                                         rng.integers(0, 12, 30).tolist(),
                                                         strict=True)], dtype=np.int64)
        assert read_across(readers.__getitem__, ranges) is not None
        got = read_ranges(readers.__getitem__, ranges)
        _assert_batches_equal(got, _by_range(readers, ranges))
        assert got["id"].tolist() == (ranges[:, 0] * 100 + ranges[:, 1]).tolist()
        assert got["big"].dtype == np.uint64 and int(got["big"][0]) == int(got["id"][0]) + 2**63
    finally:
        _close(readers)


def test_shards_are_opened_in_request_order(tmp_path) -> None:
    """Two shards changed since they were indexed: the batch is refused naming the one the
    request names first, as a read shard by shard names it."""
    paths = _demo(tmp_path, "tar", shards=12)
    other = _demo(tmp_path / "other", "tar", shards=2)[1]
    cache = str(tmp_path / "c")
    with open_shard(paths[0], cache_dir=cache) as r:
        schema = r.schema
    indexed = []
    for p in paths:
        with open_shard(p, cache_dir=cache) as r:
            indexed.append(IndexedShard(identity(p), len(r), schema))
    _rewrite(other, paths[3])
    _rewrite(other, paths[9])
    ranges = np.array([[s, 0, 1] for s in (0, 9, 1, 3, 2, 4)], dtype=np.int64)
    opened: list[ShardReader] = []

    def get(shard: int) -> ShardReader:
        opened.append(open_shard(paths[shard], cache_dir=cache, indexed=indexed[shard]))
        return opened[-1]

    try:
        with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
            read_ranges(get, ranges)
        assert e.value.shard == paths[9]
    finally:
        _close(opened)


@pytest.mark.parametrize("kind", GATHERED)
def test_a_shard_first_read_late_in_a_gather_is_checked_before_it_is_read(tmp_path,
                                                                           kind: str) -> None:
    """Shard 15 first comes after CHECK_ROWS rows of others and is cut short: the check made
    a few rows ahead of it finds the change (its map untouched: no SIGBUS)."""
    paths = _demo(tmp_path, kind, uneven=False)
    readers = _open(paths, str(tmp_path / "c"))
    try:
        rows = [(s, k, k + 1) for k in range(4) for s in range(10)][:CHECK_ROWS + 8]
        ranges = np.array(rows + [(15, PER_SHARD - 2, PER_SHARD - 1), (0, 9, 10)], dtype=np.int64)
        assert read_across(readers.__getitem__, ranges) is not None
        with open(paths[15], "r+b") as f:
            f.truncate(os.path.getsize(paths[15]) // 3)
        assert read_across(readers.__getitem__, ranges) is None
        with pytest.raises(ShardChangedError) as e:
            read_ranges(readers.__getitem__, ranges)
        assert e.value.shard == paths[15]
    finally:
        _close(readers)


def test_checks_ahead_cover_the_sources_first_named_in_the_next_rows(tmp_path) -> None:
    """At row ``k`` a gather checks each source first named before ``k + CHECK_ROWS`` and not
    checked yet (one without a guard: nothing), each once; after the gather, all again."""
    paths = [tmp_path / f"f{i}" for i in range(3)]
    for p in paths:
        p.write_bytes(b"x" * 10)
    guards = [FileGuard(str(p)) for p in paths]
    try:
        with open(paths[1], "ab") as f:
            f.write(b"y")
        checks = Checks([guards[0], None, guards[1]], [0, CHECK_ROWS - 1, CHECK_ROWS])
        assert checks.ahead(0)  # sources 0 and 1: the changed file is source 2's
        assert not checks.ahead(CHECK_ROWS)
        checks = Checks([guards[0], None, guards[2]], [0, CHECK_ROWS - 1, 3 * CHECK_ROWS])
        assert checks.ahead(0)
        with open(paths[0], "ab") as f:
            f.write(b"y")
        assert checks.ahead(CHECK_ROWS) and checks.ahead(2 * CHECK_ROWS)  # 0 checked before
        assert checks.ahead(3 * CHECK_ROWS)  # source 2
        assert not checks.after()
    finally:
        for g in guards:
            g.close()


@pytest.mark.parametrize("chunk", [12, 5, 1], ids=["one-batch", "batches-of-5", "rows"])
@pytest.mark.parametrize("offsets", ["32", "64", "mixed"])
def test_an_arrow_gather_by_address_equals_the_gather_row_by_row(tmp_path, chunk: int,
                                                                 offsets: str) -> None:
    paths = [_typed_arrow(str(tmp_path / f"t{s}.arrow"), s, chunk, lists=False,
                          large=offsets == "64" or (offsets == "mixed" and s % 2 == 1))
             for s in range(6)]
    readers = _open(paths, str(tmp_path / "c"))
    try:
        sources = [r._row_source() for r in readers]
        rng = np.random.default_rng(chunk)
        for n in (1, 9, 40):
            which = rng.integers(0, len(sources), n)
            rows = rng.integers(0, 12, n)
            checks = Checks([s.guard for s in sources], [0] * len(sources))
            want = sources[0]._gather_rows(sources, which.tolist(), rows.tolist(), checks)
            got = sources[0]._gather_at(sources, which, rows)
            assert want is not None and got is not None
            _assert_batches_equal(got, want)
            assert got["id"].tolist() == (which * 100 + rows).tolist()
    finally:
        _close(readers)
