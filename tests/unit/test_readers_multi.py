"""Several ranges at once: ShardReader.read_many and read_ranges, on real files of every format."""

from __future__ import annotations

import dataclasses
import io
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.batch import Ragged, concat
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ConfigError, InternalError, SchemaError, ShardReadError
from dataflow.readers import LostShard, ShardReader, open_shard, read_ranges
from dataflow.readers.multi import describe_ranges, joined_ranges
from dataflow.readers.sink import BatchSink
from dataflow.readers.tar.indexfile import load_tar_index, save_tar_index

KINDS = ["arrow-file", "arrow-stream", "parquet", "tar"]


def _demo(root, kind: str):
    fmt, _, arrow_kind = kind.partition("-")
    spec = DemoSpec(fmt=fmt, shards=3, samples_per_shard=300, image_shape=(2, 3), seed=5,
                    arrow_kind=arrow_kind or "file")
    return make_demo(str(root / kind), spec, progress=None)


def _assert_batches_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        if isinstance(w, Ragged):
            assert isinstance(g, Ragged) and g.kind == w.kind, name
            np.testing.assert_array_equal(g.offsets, w.offsets, err_msg=name)
            np.testing.assert_array_equal(g.values, w.values, err_msg=name)
        else:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)


def _range_sets(n: int, rng: np.random.Generator) -> list[list[tuple[int, int]]]:
    """Single samples (sorted, as a sample-level shuffle asks), unsorted, overlapping, repeated,
    empty and long ranges, ranges at both ends of the shard."""
    singles = sorted(rng.choice(n, size=min(n, 200), replace=False).tolist())
    mixed = [tuple(sorted(rng.integers(0, n + 1, size=2).tolist())) for _ in range(30)]
    return [
        [(r, r + 1) for r in singles],
        [(r, r + 1) for r in rng.permutation(n)[:50].tolist()],
        mixed,
        [(5, 9), (5, 9), (7, 7), (0, 1), (n - 1, n), (3, 6)],
        [(0, n), (10, 20)],
        [(4, 4), (0, 0)],
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_read_many_equals_reads_concatenated(tmp_path, kind: str) -> None:
    """Each format's gather, and the base class's range-by-range default, equal read()."""
    demo = _demo(tmp_path, kind)
    rng = np.random.default_rng(7)
    with open_shard(demo.paths[0], cache_dir=str(tmp_path / "c")) as r:
        for ranges in _range_sets(len(r), rng):
            starts, stops = (np.array(c, dtype=np.int64) for c in zip(*ranges, strict=True))
            want = concat([r.read(a, b) for a, b in ranges])
            _assert_batches_equal(r.read_many(starts, stops), want)
            keep = stops > starts
            if keep.sum() > 1:
                base = ShardReader._read_many(r, starts[keep], stops[keep])
                _assert_batches_equal(base, want)


@pytest.mark.parametrize("kind", KINDS)
def test_read_ranges_across_shards_in_request_order(tmp_path, kind: str) -> None:
    demo = _demo(tmp_path, kind)
    cache = str(tmp_path / "c")
    readers = [open_shard(p, cache_dir=cache) for p in demo.paths]
    rng = np.random.default_rng(3)
    rows = []
    for shard, n in enumerate(demo.sizes):
        rows += [(shard, r, r + 1) for r in sorted(rng.choice(n, 60, replace=False).tolist())]
    rows += [(2, 0, 5), (0, 7, 12), (2, 3, 4), (1, 0, demo.sizes[1])]
    ranges = np.array(rows, dtype=np.int64)
    try:
        got = read_ranges(readers.__getitem__, ranges)
        want = concat([readers[s].read(a, b) for s, a, b in rows])
        _assert_batches_equal(got, want)
        ids = np.concatenate([np.arange(a, b) + sum(demo.sizes[:s]) for s, a, b in rows])
        np.testing.assert_array_equal(got["id"], ids)
    finally:
        for r in readers:
            r.close()


def test_parquet_read_many_decodes_only_touched_row_groups(tmp_path) -> None:
    """Row group 1 is damaged: ranges around it read fine, a range inside it names it and
    its first sample (not the first row group decoded with it)."""
    path = str(tmp_path / "g.parquet")
    n = 30
    table = pa.table({"x": np.arange(n), "s": [f"row {i} " * 20 for i in range(n)]})
    pq.write_table(table, path, row_group_size=10, compression="snappy")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(1)
    with open(path, "r+b") as f:
        f.seek((chunk.dictionary_page_offset or chunk.data_page_offset) + 20)
        f.write(b"\xff" * (chunk.total_compressed_size - 40))
    with open_shard(path) as r:
        got = r.read_many(np.array([25, 2, 9]), np.array([27, 3, 10]))
        np.testing.assert_array_equal(got["x"], [25, 26, 2, 9])
        assert got["s"][2] == "row 2 " * 20 and got["s"][1] == "row 26 " * 20
        with pytest.raises(ShardReadError, match=r"row group 1 \(samples 10\.\.19\) is "
                           "damaged") as e:
            r.read_many(np.array([2, 15]), np.array([3, 16]))
        assert e.value.shard == path and e.value.index == 10


def test_read_many_bounds_and_close(tmp_path) -> None:
    demo = _demo(tmp_path, "arrow-file")
    r = open_shard(demo.paths[0])
    n = len(r)
    with pytest.raises(ShardReadError, match=rf"range \[{n - 1}, {n + 1}\) outside \[0, {n}\]"):
        r.read_many(np.array([0, n - 1]), np.array([1, n + 1]))
    with pytest.raises(ShardReadError, match=r"range \[5, 4\)"):
        r.read_many(np.array([5]), np.array([4]))
    with pytest.raises(ShardReadError, match="2 range starts but 1 stops"):
        r.read_many(np.array([0, 1]), np.array([1]))
    for start, stop in ((-1, 2), (n - 1, n + 1)):
        with pytest.raises(ShardReadError, match=rf"range \[{start}, {stop}\) outside"):
            r.read_many(np.array([start]), np.array([stop]))
    empty = r.read_many(np.array([3, 0]), np.array([3, 0]))
    assert empty["image"].shape == (0, 2, 3) and len(empty["text"]) == 0
    one = r.read_many(np.array([3]), np.array([3]))
    assert one["image"].shape == (0, 2, 3) and len(one["text"]) == 0
    np.testing.assert_array_equal(r.read_many(np.array([n - 2]), np.array([n]))["image"],
                                  r.read(n - 2, n)["image"])
    r.close()
    with pytest.raises(ShardReadError, match="read after close"):
        r.read_many(np.array([0]), np.array([1]))


def test_read_ranges_validates_its_input(tmp_path) -> None:
    demo = _demo(tmp_path, "arrow-file")
    with open_shard(demo.paths[0]) as r:
        for bad in (np.zeros((0, 3), np.int64), np.zeros((2, 2), np.int64)):
            with pytest.raises(ConfigError, match=r"non-empty \(n, 3\)"):
                read_ranges(lambda _: r, bad)
        with pytest.raises(ShardReadError, match=r"range \[0, 100000\)"):
            read_ranges(lambda _: r, np.array([[0, 0, 100_000]]))


def test_unexpected_errors_name_the_shard_and_ranges(tmp_path) -> None:
    """A cached tar index damaged so that reading fails with a TypeError (not a DataflowError):
    a bug of the reader, raised as one naming the shard, not as damage of it."""
    path = str(tmp_path / "s.tar")
    with tarfile.open(path, "w") as t:
        for i in range(6):
            f = io.BytesIO()
            np.save(f, np.full(3, i, dtype=np.int16))
            info = tarfile.TarInfo(f"{i:04d}.x.npy")
            info.size = len(f.getvalue())
            t.addfile(info, io.BytesIO(f.getvalue()))
    with open_shard(path) as r:
        index_path = r.index_path
    good = load_tar_index(index_path, path)
    damaged = dataclasses.replace(good, codecs=("npy:<not-a-dtype",))
    with open(index_path, "wb") as f:
        save_tar_index(damaged, f)
    with open_shard(path) as r:
        assert not r.index_built
        with pytest.raises(InternalError) as e:
            read_ranges(lambda _: r, np.array([[0, 1, 2], [0, 4, 5]]))
    assert not isinstance(e.value, ShardReadError)
    assert str(e.value).startswith(f"{path}: reading samples [1, 2), [4, 5) failed: TypeError")
    assert isinstance(e.value.__cause__, TypeError)


def test_describe_ranges_names_the_first_few() -> None:
    assert describe_ranges(np.array([1]), np.array([2])) == "samples [1, 2)"
    text = describe_ranges(np.arange(10), np.arange(10) + 1)
    assert text == "samples [0, 1), [1, 2), [2, 3), [3, 4) and 6 more ranges"


def test_a_shard_that_serves_nothing_leaves_no_gap(tmp_path) -> None:
    """A batch of three shards whose middle one is lost (changed since indexed, skipped): the
    rows after it follow the rows before it, the batch holds exactly the rows served, and the
    lost rows are counted."""
    demo = _demo(tmp_path, "tar")
    cache = str(tmp_path / "c")
    readers = [open_shard(p, cache_dir=cache) for p in demo.paths]
    lost = LostShard(demo.paths[1], readers[1].schema, demo.sizes[1],
                     ShardReadError(demo.paths[1], "changed"))
    rows = [(0, 3, 4), (1, 0, 5), (2, 7, 9), (1, 9, 10), (0, 10, 12)]
    try:
        got = read_ranges([readers[0], lost, readers[2]].__getitem__, np.array(rows))
        _assert_batches_equal(got, concat([readers[s].read(a, b) for s, a, b in rows if s != 1]))
        assert lost.skipped == 6
    finally:
        for r in readers:
            r.close()


def test_a_batch_sink_refuses_parts_that_disagree() -> None:
    sink = BatchSink(4)
    part = sink.put({"x": np.ones((2, 3), np.float32), "t": Ragged(np.zeros(0, np.uint8),
                                                                   np.zeros(3, np.int64), "str")})
    sink.advance(2)
    with pytest.raises(SchemaError, match=r"field 'x': float64 \(3,\) rows where earlier shards "
                       r"of the batch gave float32 \(3,\)"):
        sink.put({"x": np.ones((1, 3), np.float64)})
    with pytest.raises(SchemaError, match="field 'y' is in some shards of the batch"):
        sink.batch([part, {**part, "y": part["x"]}])
    with pytest.raises(SchemaError, match="field 'x' is ragged in 1 shards of the batch and "
                       "fixed-size in 1"):
        sink.batch([part, {"x": part["t"], "t": part["t"]}])
    with pytest.raises(InternalError, match="rows up to 5 of a batch of 4"):
        sink.rows("x", np.dtype(np.float32), (3,), 3)
    batch = sink.batch([part])
    assert batch["x"].shape == (2, 3) and batch["x"].sum() == 6 and len(batch["t"]) == 2


def _rows(ranges: np.ndarray) -> list[tuple[int, int]]:
    return [(s, r) for s, a, b in ranges.tolist() for r in range(a, b)]


@pytest.mark.parametrize("seed", range(40))
def test_joined_ranges_name_the_same_rows_in_the_same_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    rows, shard, at = [], 0, 0
    for _ in range(n):  # runs that continue one another, or jump, or change shard
        if rng.random() < 0.3:
            shard = int(rng.integers(0, 3))
        if rng.random() < 0.3:
            at = int(rng.integers(0, 50))
        size = int(rng.integers(0, 6))
        rows.append((shard, at, at + size))
        at += size
    ranges = np.array(rows, dtype=np.int64)
    joined = joined_ranges(ranges)
    assert _rows(joined) == _rows(ranges)
    assert len(joined) <= len(ranges)
    # none of the rows left continues the one before it
    assert not ((joined[1:, 0] == joined[:-1, 0]) & (joined[1:, 1] == joined[:-1, 2])).any()


def test_joined_ranges_keep_reversed_ranges_apart() -> None:
    ranges = np.array([[0, 5, 3], [0, 3, 7], [0, 7, 9]], dtype=np.int64)
    # [5, 3) stays (a reader refuses it, naming it); the two after it are one
    np.testing.assert_array_equal(joined_ranges(ranges), [[0, 5, 3], [0, 3, 9]])
    one = np.array([[1, 0, 4]], dtype=np.int64)
    assert joined_ranges(one) is one


def test_a_run_of_batches_in_one_record_batch_is_read_without_a_copy(tmp_path) -> None:
    path = str(tmp_path / "one.arrow")
    table = pa.table({"x": np.arange(256, dtype=np.int64)})
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)  # one record batch
    reader = open_shard(path)
    try:
        parts = np.array([[0, 0, 64], [0, 64, 128], [0, 128, 192]], dtype=np.int64)
        whole = read_ranges(lambda _: reader, joined_ranges(parts))["x"]
        np.testing.assert_array_equal(whole, np.arange(192))
        first = read_ranges(lambda _: reader, parts[:1])["x"]
        # both views of the shard's map (the record batch's buffer), not gathered copies
        assert np.shares_memory(whole, first)
        gathered = read_ranges(lambda _: reader, parts)["x"]  # three ranges: gathered
        np.testing.assert_array_equal(gathered, whole)
        assert not np.shares_memory(gathered, first)
    finally:
        reader.close()
