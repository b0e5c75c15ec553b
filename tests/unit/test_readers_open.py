"""open_shard: format detection by magic bytes, option validation, remote copies."""

from __future__ import annotations

import os

import fsspec
import numpy as np
import pyarrow as pa
import pytest

from dataflow.errors import ConfigError, ShardReadError
from dataflow.readers import ArrowStreamReader, RemoteArrowReader, detect_format, open_shard


def _table() -> pa.Table:
    return pa.table({"x": np.arange(10), "s": [str(i) * i for i in range(10)]})


@pytest.mark.parametrize(("head", "fmt"), [
    (b"ARROW1\0\0", "arrow-file"), (b"PAR1....", "parquet"), (b"\x1f\x8b\x08\0", "tar.gz"),
    (bytes(257) + b"ustar\x0000" + bytes(10), "tar"),
    (b"\xff\xff\xff\xff\x10\0\0\0", "arrow-stream"),
])
def test_detect_format_by_magic(head: bytes, fmt: str) -> None:
    assert detect_format("s", head, 10_000) == fmt


@pytest.mark.parametrize(("name", "head", "size"), [
    ("x.tar", bytes(512), 10240), ("x.tar", bytes(512), 1024),
])
def test_empty_tars_are_tars(name: str, head: bytes, size: int) -> None:
    assert detect_format(name, head, size) == "tar"


@pytest.mark.parametrize("name", ["x.parquet", "x.arrow", "x.tar.gz", "x.tgz", "x", "x.tar"])
def test_zero_byte_files_are_refused(name: str) -> None:
    with pytest.raises(ShardReadError, match="empty file") as e:
        detect_format(name, b"", 0)
    assert e.value.shard == name and e.value.offset == 0


@pytest.mark.parametrize("head", [b"hello world!", b"\x08\0\0\0\0\0\0\0", bytes(600)])
def test_unknown_magic(head: bytes) -> None:
    with pytest.raises(ShardReadError, match="unknown shard format") as e:
        detect_format("some/shard", head, len(head))
    assert e.value.shard == "some/shard" and e.value.offset == 0


def test_format_comes_from_content_not_name(tmp_path) -> None:
    path = str(tmp_path / "looks-like.tar")
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, _table().schema) as w:
        w.write_table(_table())
    with open_shard(path) as r:
        assert isinstance(r, ArrowStreamReader) and len(r) == 10


def test_legacy_arrow_stream(tmp_path) -> None:
    path = str(tmp_path / "legacy.arrow")
    options = pa.ipc.IpcWriteOptions(use_legacy_format=True)
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, _table().schema, options=options) as w:
        w.write_table(_table(), max_chunksize=3)
    with open(path, "rb") as f:
        assert f.read(4) != b"\xff\xff\xff\xff"
    with open_shard(path) as r:
        assert isinstance(r, ArrowStreamReader)
        assert r.read(2, 8)["s"][3] == "55555"


def test_on_error_is_validated(tmp_path) -> None:
    with pytest.raises(ConfigError, match="`on_error` must be one of"):
        open_shard(str(tmp_path / "x.tar"), on_error="ignore")


def test_remote_arrow_is_read_through_the_block_cache_once(tmp_path) -> None:
    url = "memory://open-test/t.arrow"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, _table().schema) as w:
        w.write_table(_table())
    data = sink.getvalue().to_pybytes()
    fsspec.filesystem("memory").pipe(url, data)
    cache = tmp_path / "cache"
    try:
        with open_shard(url, cache_dir=str(cache)) as r:
            assert isinstance(r, RemoteArrowReader)
            np.testing.assert_array_equal(r.read(0, 10)["x"], np.arange(10))
            assert len(data) <= r.blob.fetched <= len(data) + 512  # + the sniffed head
        assert os.listdir(cache) == ["blocks"]
        with open_shard(url, cache_dir=str(cache)) as r:
            assert len(r) == 10 and r.read(4, 6)["s"][1] == "55555"
            assert r.blob.fetched == 0
    finally:
        fsspec.filesystem("memory").rm(url)


def test_unreadable_url(tmp_path) -> None:
    with pytest.raises(ShardReadError, match="memory://open-test/missing.tar") as e:
        open_shard("memory://open-test/missing.tar", cache_dir=str(tmp_path))
    assert e.value.offset == 0
