"""Dataset index: counting shards, schema agreement, fingerprint, JSON round trip."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tarfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.batch import FieldSpec
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ConfigError, SchemaMismatchError, ShardReadError, SpecError
from dataflow.index import DatasetIndex
from dataflow.index.scan import build_index
from dataflow.readers import open_shard


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


def test_fingerprint_and_json_round_trip_without_the_files(tmp_path) -> None:
    a = _arrow(str(tmp_path / "a.arrow"), x=np.arange(3))
    b = _arrow(str(tmp_path / "b.arrow"), x=np.arange(4))
    index = build_index([b, a])
    assert index.shards == (b, a) and index.sizes == (4, 3)
    st = os.stat(b)
    assert index.identities[0] == f"size={st.st_size};mtime_ns={st.st_mtime_ns}"
    assert index.root == str(tmp_path) + "/"
    text = index.to_json()
    os.unlink(a)
    os.unlink(b)
    again = DatasetIndex.from_json(text)
    assert again == index and again.fingerprint == index.fingerprint
    assert len(index.fingerprint) == 16
    other = DatasetIndex(index.shards, (4, 2), index.schema, index.identities)
    assert other.fingerprint != index.fingerprint
    renamed = DatasetIndex((b, a + "x"), index.sizes, index.schema, index.identities)
    assert renamed.fingerprint != index.fingerprint


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "tar"])
def test_fingerprint_follows_content_not_location(tmp_path, fmt: str) -> None:
    spec = DemoSpec(fmt=fmt, shards=3, samples_per_shard=20, image_shape=(2,), seed=4)
    make_demo(str(tmp_path / "data" / "train"), spec, progress=None)
    index = build_index(str(tmp_path / "data"), cache_dir=str(tmp_path / "c"))
    shutil.copytree(tmp_path / "data", tmp_path / "elsewhere" / "copy")
    copied = build_index(str(tmp_path / "elsewhere" / "copy"), cache_dir=str(tmp_path / "c"))
    assert copied.shards != index.shards
    assert copied.root == str(tmp_path / "elsewhere" / "copy" / "train") + "/"
    assert copied.fingerprint == index.fingerprint

    assert copied.identities == index.identities


def _write_values(fmt: str, path: str, values: np.ndarray) -> None:
    """A shard of ``len(values)`` samples whose byte size depends on the count only."""
    if fmt == "arrow":
        _arrow(path, x=values)
    elif fmt == "parquet":
        pq.write_table(pa.table({"x": values}), path, compression="none", use_dictionary=False,
                       write_statistics=False)
    else:
        with tarfile.open(path, "w") as t:
            for i, v in enumerate(values.tolist()):
                data = f"{v:08d}".encode()
                info = tarfile.TarInfo(f"{i:06d}.cls")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "tar"])
def test_fingerprint_changes_when_a_shard_is_rewritten(tmp_path, fmt: str) -> None:
    paths = [str(tmp_path / f"s{i}.{fmt}") for i in range(2)]
    for p in paths:
        _write_values(fmt, p, np.arange(10))
    index = build_index(paths, cache_dir=str(tmp_path / "c"))
    before = os.stat(paths[1])
    time.sleep(0.05)
    _write_values(fmt, paths[1], np.arange(10)[::-1].copy())
    after = os.stat(paths[1])
    assert after.st_size == before.st_size and after.st_mtime_ns != before.st_mtime_ns
    changed = build_index(paths, cache_dir=str(tmp_path / "c"))
    assert changed.sizes == index.sizes and changed.shards == index.shards
    assert changed.fingerprint != index.fingerprint


def _empty_tar(path: str) -> None:
    with tarfile.open(path, "w"):
        pass


def _empty_tar_gz(path: str) -> None:
    with tarfile.open(path, "w:gz"):
        pass


def _zero_bytes(path: str) -> None:
    open(path, "wb").close()


def _empty_like(fmt: str, kind: str = "file"):
    """A writer of a zero-row shard with the schema of ``fmt``'s demo shards."""

    def write(path: str, template: str) -> None:
        if fmt == "parquet":
            pq.write_table(pq.read_schema(template).empty_table(), path)
            return
        with pa.memory_map(template) as src:
            schema = (pa.ipc.open_file(src) if kind == "file" else pa.ipc.open_stream(src)).schema
        with pa.OSFile(path, "wb") as f:
            (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(f, schema).close()

    return write


@pytest.mark.parametrize(("fmt", "kind", "name", "write"), [
    ("tar", "file", "empty.tar", lambda p, _: _empty_tar(p)),
    ("tar", "file", "empty.tar.gz", lambda p, _: _empty_tar_gz(p)),
    ("parquet", "file", "empty.tar", lambda p, _: _empty_tar(p)),
    ("arrow", "file", "empty.arrow", _empty_like("arrow", "file")),
    ("arrow", "stream", "empty.arrow", _empty_like("arrow", "stream")),
    ("parquet", "file", "empty.parquet", _empty_like("parquet")),
], ids=["tar-end-blocks", "tar-gz", "empty-tar-among-parquet", "arrow-file", "arrow-stream",
        "parquet"])
def test_empty_shards_count_zero_samples(tmp_path, fmt: str, kind: str, name: str,
                                         write) -> None:
    spec = DemoSpec(fmt=fmt, shards=2, samples_per_shard=15, image_shape=(2, 2),
                    arrow_kind=kind)
    demo = make_demo(str(tmp_path / "d"), spec, progress=None)
    empty = str(tmp_path / "d" / name)
    write(empty, demo.paths[0])
    index = build_index(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"))
    sizes = dict(zip(index.shards, index.sizes, strict=True))
    assert sizes == {empty: 0, **dict(zip(demo.paths, demo.sizes, strict=True))}
    with open_shard(demo.paths[0]) as r:
        assert index.schema == r.schema
    with open_shard(empty, cache_dir=str(tmp_path / "c")) as r:
        assert len(r) == 0 and r.read(0, 0).keys() == {f.name for f in r.schema}
        assert r.read_many(np.array([0]), np.array([0])).keys() == r.read(0, 0).keys()


@pytest.mark.parametrize("name", ["b.tar", "b.parquet"])
def test_zero_byte_shards_are_damaged(tmp_path, caplog, name: str) -> None:
    """Zero bytes are a failed write, whatever the name: the index refuses the shard under
    ``raise``; under ``skip`` it has no sample and its damage is logged."""
    a = _arrow(str(tmp_path / "a.arrow"), x=np.arange(3))
    empty = str(tmp_path / name)
    _zero_bytes(empty)
    with pytest.raises(ShardReadError, match=rf"{re.escape(empty)}.*empty file \(zero bytes\)"):
        build_index(str(tmp_path), cache_dir=str(tmp_path / "c"))
    with caplog.at_level(logging.WARNING, "dataflow.index.scan"):
        index = build_index(str(tmp_path), cache_dir=str(tmp_path / "c"), on_error="skip")
    assert dict(zip(index.shards, index.sizes, strict=True)) == {a: 3, empty: 0}
    assert index.skipped == ()
    assert f"{empty}: 0 sample(s) skipped, 1 damage record(s), first: {empty}" in caplog.text
    assert "0 sample(s) skipped in total, in 1 of 2 shard(s)" in caplog.text


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
        DatasetIndex(("a",), (1, 2), (), ("i",))
    with pytest.raises(ConfigError, match="sizes"):
        DatasetIndex(("a",), (-1,), (), ("i",))
    with pytest.raises(ConfigError, match="`identities` must have one entry per shard"):
        DatasetIndex(("a",), (1,), (), ())
    with pytest.raises(ConfigError, match="`identities` must be strings"):
        DatasetIndex(("a",), (1,), (), (5,))
    with pytest.raises(ConfigError, match="not a dataset index"):
        DatasetIndex.from_json("{}")
    with pytest.raises(ConfigError, match="identities"):
        DatasetIndex.from_json('{"shards": ["a"], "sizes": [1], "schema": []}')
    with pytest.raises(ConfigError, match="`skipped` must have one entry per shard"):
        DatasetIndex(("a", "b"), (1, 1), (), ("i", "j"), skipped=(1,))
    for bad in (-1, 1.0, True):
        with pytest.raises(ConfigError, match=r"`skipped\[0\]` must be an integer >= 0"):
            DatasetIndex(("a",), (1,), (), ("i",), skipped=(bad,))
    with pytest.raises(ConfigError, match="skipped"):
        DatasetIndex.from_json('{"shards": ["a"], "sizes": [1], "schema": [], '
                               '"identities": ["i"], "skipped": ["2"]}')


def test_samples_lost_at_indexing_travel_in_the_json_and_leave_the_fingerprint() -> None:
    index = DatasetIndex(("d/a", "d/b"), (3, 4), (), ("i", "j"), skipped=(0, 2))
    again = DatasetIndex.from_json(index.to_json())
    assert again == index and again.lost == 2
    assert index.fingerprint == DatasetIndex(("d/a", "d/b"), (3, 4), (), ("i", "j")).fingerprint
    older = json.loads(index.to_json())
    del older["skipped"]  # an index from a server without the field: nothing lost
    assert DatasetIndex.from_json(json.dumps(older)).skipped == ()


@pytest.mark.parametrize(("shards", "root"), [
    (("/d/a/x.tar", "/d/ab/y.tar"), "/d/"), (("/d/train-0.tar", "/d/train-01.tar"), "/d/"),
    (("s3://b/p/x.tar",), "s3://b/p/"), (("a.tar", "b.tar"), ""),
])
def test_root_is_the_common_directory(shards: tuple[str, ...], root: str) -> None:
    index = DatasetIndex(shards, (1,) * len(shards), (), ("i",) * len(shards))
    assert index.root == root
