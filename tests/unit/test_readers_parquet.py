"""Parquet reader on files written by pyarrow."""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.batch import FieldSpec
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardReadError
from dataflow.readers import ParquetReader, open_shard

SPEC = DemoSpec(fmt="parquet", shards=2, samples_per_shard=300, image_shape=(2, 3, 4), seed=5)


@pytest.fixture
def demo(tmp_path):
    return make_demo(str(tmp_path), SPEC, progress=None)


def test_count_schema_shape_metadata_and_values(demo) -> None:
    first = 0
    for path, size in zip(demo.paths, demo.sizes, strict=True):
        with open_shard(path) as r:
            assert isinstance(r, ParquetReader)
            assert len(r) == size
            assert r.schema[2] == FieldSpec("image", "uint8", (2, 3, 4))
            b = r.read(0, size)
            ids = np.arange(first, first + size)
            np.testing.assert_array_equal(b["id"], ids)
            np.testing.assert_array_equal(b["image"][:, 1, 2, 3], (ids + 23) % 256)
            assert b["text"][size - 1].startswith(f"sample {first + size - 1} ")
            first += size


def test_ranges_match_full_read_across_row_groups(demo, assert_ranges_match) -> None:
    with open_shard(demo.paths[0]) as r:
        assert len(r._lengths) > 2
        assert_ranges_match(r)
        np.testing.assert_array_equal(r.read(100, 300)["id"], np.arange(100, 300))


def test_plain_table_without_metadata(tmp_path, assert_ranges_match) -> None:
    path = str(tmp_path / "plain.parquet")
    table = pa.table({
        "x": np.arange(50, dtype=np.float32),
        "v": pa.array([[1, 2, 3, 4]] * 50, pa.list_(pa.int16(), 4)),
        "b": pa.array([bytes([i]) * i for i in range(50)], pa.binary()),
    })
    pq.write_table(table, path, row_group_size=7)
    with open_shard(path) as r:
        assert r.schema == (FieldSpec("x", "float32"), FieldSpec("v", "int16", (4,)),
                            FieldSpec("b", "uint8", ragged="bytes"))
        assert_ranges_match(r)
        assert r.read(10, 12)["b"][1] == bytes([11]) * 11


@pytest.mark.parametrize("batch", [1, 5, 7, 13, 300, 2000])
def test_sequential_reads_reuse_the_decoded_span(tmp_path, batch: int) -> None:
    path = str(tmp_path / "seq.parquet")
    n = 1500
    pq.write_table(pa.table({"x": np.arange(n), "s": [str(i) for i in range(n)]}), path,
                   row_group_size=7)
    with open_shard(path) as r:
        xs, ss = [], []
        for start in range(0, n, batch):
            b = r.read(start, min(start + batch, n))
            xs.append(b["x"])
            ss += [b["s"][i] for i in range(len(b["s"]))]
        np.testing.assert_array_equal(np.concatenate(xs), np.arange(n))
        assert ss == [str(i) for i in range(n)]
        np.testing.assert_array_equal(r.read(3, 9)["x"], np.arange(3, 9))
    r.close()
    with pytest.raises(ShardReadError, match="read after close"):
        r.read(0, 1)


def test_shape_metadata_must_match_size(tmp_path) -> None:
    path = str(tmp_path / "bad.parquet")
    field = pa.field("image", pa.list_(pa.uint8(), 4), metadata={b"dataflow.shape": b"[3,3]"})
    col = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.uint8)), 4)
    pq.write_table(pa.table([col], schema=pa.schema([field])), path)
    with pytest.raises(ShardReadError, match="'image'.*does not match") as e:
        open_shard(path)
    assert e.value.shard == path


def test_memory_url(demo, assert_ranges_match) -> None:
    url = "memory://parquet-test/s.parquet"
    with open(demo.paths[0], "rb") as f:
        fsspec.filesystem("memory").pipe(url, f.read())
    try:
        with open_shard(url) as r:
            assert len(r) == demo.sizes[0]
            assert_ranges_match(r)
    finally:
        fsspec.filesystem("memory").rm(url)


def test_truncated_file_names_shard(demo) -> None:
    path = demo.paths[0]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-100])
    with pytest.raises(ShardReadError, match="byte offset 0") as e:
        open_shard(path)
    assert e.value.shard == path
