"""Dataset index: counting shards, schema agreement, fingerprint, JSON round trip."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from dataflow.batch import FieldSpec
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ConfigError, SchemaMismatchError, ShardReadError, SpecError
from dataflow.index import DatasetIndex
from dataflow.scan import build_index


def _arrow(path: str, **cols) -> str:
    table = pa.table(cols)
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "tar"])
def test_build_index_counts_every_shard(tmp_path, fmt: str) -> None:
    spec = DemoSpec(fmt=fmt, shards=5, samples_per_shard=40, image_shape=(2, 2), seed=2)
    demo = make_demo(str(tmp_path / "d"), spec, progress=None)
    index = build_index(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), max_workers=2)
    assert index.shards == demo.paths and index.sizes == demo.sizes
    assert index.total == demo.total
    assert {f.name for f in index.schema} == {"id", "label", "image", "text"}
    assert FieldSpec("image", "uint8", (2, 2)) in index.schema


def test_glob_skips_the_tar_indexes_cached_beside_the_shards(tmp_path) -> None:
    spec = DemoSpec(fmt="tar", shards=3, samples_per_shard=10, image_shape=(2, 2))
    demo = make_demo(str(tmp_path / "d"), spec, progress=None)
    first = build_index(str(tmp_path / "d" / "*"), cache_dir=str(tmp_path / "c"))
    assert all(os.path.exists(p + ".dfidx") for p in demo.paths)
    again = build_index(str(tmp_path / "d" / "*"), cache_dir=str(tmp_path / "c"))
    assert first == again and again.shards == demo.paths


def test_fingerprint_and_json_round_trip(tmp_path) -> None:
    a = _arrow(str(tmp_path / "a.arrow"), x=np.arange(3))
    b = _arrow(str(tmp_path / "b.arrow"), x=np.arange(4))
    index = build_index([b, a])
    assert index.shards == (b, a) and index.sizes == (4, 3)
    again = DatasetIndex.from_json(index.to_json())
    assert again == index and again.fingerprint == index.fingerprint
    assert len(index.fingerprint) == 16
    other = DatasetIndex(index.shards, (4, 2), index.schema)
    assert other.fingerprint != index.fingerprint


@pytest.mark.parametrize(("cols_b", "field"), [
    ({"x": np.arange(3, dtype=np.int32), "y": np.arange(3.0)}, "x"),
    ({"x": np.arange(3)}, "y"),
    ({"x": np.arange(3), "y": np.arange(3.0), "z": np.arange(3)}, "z"),
])
def test_schema_mismatch_names_both_shards_and_field(tmp_path, cols_b, field: str) -> None:
    a = _arrow(str(tmp_path / "a.arrow"), x=np.arange(3), y=np.arange(3.0))
    b = _arrow(str(tmp_path / "b.arrow"), **cols_b)
    with pytest.raises(SchemaMismatchError) as e:
        build_index(str(tmp_path))
    assert e.value.shard_a == a and e.value.shard_b == b and e.value.field == field
    assert a in str(e.value) and b in str(e.value) and repr(field) in str(e.value)


def test_errors_propagate(tmp_path) -> None:
    with pytest.raises(SpecError, match="nothing-here"):
        build_index(str(tmp_path / "nothing-here*.arrow"))
    (tmp_path / "bad.arrow").write_bytes(b"garbage!" * 10)
    with pytest.raises(ShardReadError, match="bad.arrow"):
        build_index(str(tmp_path))
    with pytest.raises(ConfigError, match="on_error"):
        build_index(str(tmp_path), on_error="ignore")
    with pytest.raises(ConfigError, match="max_workers"):
        build_index(str(tmp_path), max_workers=0)


def test_skip_mode_sizes_are_what_the_readers_kept(tmp_path) -> None:
    spec = DemoSpec(fmt="tar", shards=2, samples_per_shard=10, uneven=False, image_shape=(2,))
    demo = make_demo(str(tmp_path / "d"), spec, progress=None)
    with open(demo.paths[1], "r+b") as f:
        f.truncate(os.path.getsize(demo.paths[1]) // 2)
    with pytest.raises(ShardReadError, match="truncated"):
        build_index(demo.paths, cache_dir=str(tmp_path / "c"))
    index = build_index(demo.paths, cache_dir=str(tmp_path / "c"), on_error="skip")
    assert index.sizes[0] == 10 and 0 < index.sizes[1] < 10


def test_index_validates_its_fields() -> None:
    with pytest.raises(ConfigError, match="sizes"):
        DatasetIndex(("a",), (1, 2), ())
    with pytest.raises(ConfigError, match="sizes"):
        DatasetIndex(("a",), (-1,), ())
    with pytest.raises(ConfigError, match="not a dataset index"):
        DatasetIndex.from_json("{}")
