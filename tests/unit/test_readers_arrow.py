"""Arrow IPC readers (file and stream) on files written by pyarrow."""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pytest

from dataflow.batch import FieldSpec
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardReadError
from dataflow.readers import ArrowFileReader, ArrowStreamReader, open_shard

SPEC = DemoSpec(fmt="arrow", shards=2, samples_per_shard=300, image_shape=(2, 3, 4), seed=3)


@pytest.fixture(params=["file", "stream"])
def shards(request, tmp_path):
    spec = DemoSpec(**{**SPEC.__dict__, "arrow_kind": request.param})
    return request.param, make_demo(str(tmp_path), spec, progress=None)


def test_count_schema_and_values(shards) -> None:
    kind, demo = shards
    first = 0
    for path, size in zip(demo.paths, demo.sizes, strict=True):
        with open_shard(path) as r:
            assert type(r) is (ArrowFileReader if kind == "file" else ArrowStreamReader)
            assert len(r) == size
            assert r.schema == (
                FieldSpec("id", "int64"), FieldSpec("label", "int64"),
                FieldSpec("image", "uint8", (2, 3, 4)), FieldSpec("text", "uint8", ragged="str"),
            )
            b = r.read(0, size)
            ids = np.arange(first, first + size)
            np.testing.assert_array_equal(b["id"], ids)
            np.testing.assert_array_equal(b["label"], ids % 10)
            assert b["image"].shape == (size, 2, 3, 4)
            np.testing.assert_array_equal(b["image"][:, 0, 0, 1], (ids + 1) % 256)
            assert b["text"][5].startswith(f"sample {first + 5} ")
            first += size


def test_ranges_match_full_read_across_record_batches(shards, assert_ranges_match) -> None:
    _, demo = shards
    with open_shard(demo.paths[0]) as r:
        assert_ranges_match(r)
        part = r.read(120, 140)
        np.testing.assert_array_equal(part["id"], np.arange(120, 140))


def test_local_reads_are_read_only_views(shards) -> None:
    _, demo = shards
    with open_shard(demo.paths[0]) as r:
        image = r.read(0, 10)["image"]
        assert not image.flags.writeable


def test_empty_range_and_out_of_bounds(shards) -> None:
    _, demo = shards
    with open_shard(demo.paths[0]) as r:
        empty = r.read(7, 7)
        assert len(empty["id"]) == 0 and len(empty["text"]) == 0
        assert empty["image"].shape == (0, 2, 3, 4)
        with pytest.raises(ShardReadError, match=r"range \[0, 100000\)"):
            r.read(0, 100_000)


def test_close_is_idempotent(shards) -> None:
    _, demo = shards
    r = open_shard(demo.paths[0])
    r.close()
    r.close()
    assert r.closed
    with pytest.raises(ShardReadError, match="read after close"):
        r.read(0, 1)


def test_memory_url(shards, tmp_path, assert_ranges_match) -> None:
    kind, demo = shards
    url = f"memory://arrow-test-{kind}/s.arrow"
    with open(demo.paths[0], "rb") as f:
        fsspec.filesystem("memory").pipe(url, f.read())
    try:
        cache = str(tmp_path / "c")
        with open_shard(url, cache_dir=cache) as r, open_shard(demo.paths[0]) as local:
            assert len(r) == len(local)
            assert_ranges_match(r)
            np.testing.assert_array_equal(r.read(3, 9)["image"], local.read(3, 9)["image"])
    finally:
        fsspec.filesystem("memory").rm(url)


def test_truncated_file_names_shard_and_offset(tmp_path) -> None:
    demo = make_demo(str(tmp_path), SPEC, progress=None)
    path = demo.paths[0]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ShardReadError, match="byte offset") as e:
        open_shard(path)
    assert e.value.shard == path and e.value.offset == len(data) // 2


def test_truncated_stream_names_shard_and_offset(tmp_path) -> None:
    spec = DemoSpec(**{**SPEC.__dict__, "arrow_kind": "stream"})
    path = make_demo(str(tmp_path), spec, progress=None).paths[0]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ShardReadError) as e:
        open_shard(path)
    assert e.value.shard == path and e.value.offset is not None
    assert 0 < e.value.offset <= len(data) // 2


def test_stream_with_empty_table(tmp_path) -> None:
    path = str(tmp_path / "empty.arrow")
    schema = pa.schema([("x", pa.float32())])
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema):
        pass
    with open_shard(path) as r:
        assert len(r) == 0
        assert r.read(0, 0)["x"].dtype == np.float32
