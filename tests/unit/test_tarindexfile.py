"""The flat binary tar index file: round trip, and every kind of damage refused by name."""

from __future__ import annotations

import dataclasses
import io
import zipfile

import numpy as np
import pytest

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import IndexCacheError, OutdatedIndex
from dataflow.readers import open_shard
from dataflow.readers.base import SkipRecord
from dataflow.readers.tar.index import TarIndex
from dataflow.readers.tar.indexfile import INDEX_VERSION, load_tar_index, save_tar_index

SPEC = DemoSpec(fmt="tar", shards=1, samples_per_shard=40, image_shape=(2, 3))


@pytest.fixture
def indexed(tmp_path) -> tuple[str, TarIndex]:
    """A demo tar, the path of its index file, and the index as loaded."""
    shard = make_demo(str(tmp_path / "demo"), SPEC, progress=None).paths[0]
    with open_shard(shard) as r:
        assert r.index_built and r.index_path is not None
        path = r.index_path
    return path, load_tar_index(path, shard)


def _same(a: TarIndex, b: TarIndex) -> None:
    assert (a.schema, a.codecs, a.skipped, a.skips, a.identity) == (
        b.schema, b.codecs, b.skipped, b.skips, b.identity)
    for name in ("offsets", "sizes", "ints", "headers"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert getattr(a, name).shape == getattr(b, name).shape


@pytest.mark.parametrize("samples", [0, 1, 7])
def test_round_trip(tmp_path, indexed, samples: int) -> None:
    _, index = indexed
    skip = SkipRecord("s.tar", 3, 1536, 1, "s.tar: bad sample")
    cut = dataclasses.replace(
        index, offsets=index.offsets[:samples], sizes=index.sizes[:samples],
        ints=index.ints[:samples], headers=index.headers[:samples], skipped=1, skips=(skip,))
    path = str(tmp_path / "i.dfidx")
    with open(path, "wb") as f:
        save_tar_index(cut, f)
    back = load_tar_index(path, "s.tar")
    _same(back, cut)
    assert not back.offsets.flags.writeable


def test_empty_index_round_trips(tmp_path) -> None:
    empty = np.zeros((0, 0), dtype=np.int64)
    index = TarIndex((), (), empty, empty, empty, np.zeros(0, dtype=np.int64), 0, (), "id")
    path = str(tmp_path / "e.dfidx")
    with open(path, "wb") as f:
        save_tar_index(index, f)
    _same(load_tar_index(path, "e.tar"), index)


@pytest.mark.parametrize("keep", [0, 10, 40, -8, -1])
def test_truncated_file_names_the_shard(indexed, keep: int) -> None:
    path, _ = indexed
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep])
    with pytest.raises(IndexCacheError, match=r"truncated") as e:
        load_tar_index(path, "the-shard.tar")
    assert "the-shard.tar" in str(e.value) and path in str(e.value)


@pytest.mark.parametrize("where", [70, 100, -1])
def test_flipped_byte_fails_the_digest(indexed, where: int) -> None:
    path, _ = indexed
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[where] ^= 0x40
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(IndexCacheError, match=r"does not match its digest") as e:
        load_tar_index(path, "the-shard.tar")
    assert "the-shard.tar" in str(e.value)


def test_foreign_and_outdated_files(indexed) -> None:
    path, _ = indexed
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(b"NOTANIDX" + data[8:])
    with pytest.raises(IndexCacheError, match=r"not a tar index"):
        load_tar_index(path, "s.tar")
    with open(path, "wb") as f:
        f.write(data[:8] + (2).to_bytes(4, "little") + data[12:])
    with pytest.raises(OutdatedIndex, match=rf"index version 2, not {INDEX_VERSION}"):
        load_tar_index(path, "s.tar")
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("version.npy", b"x")
    with open(path, "wb") as f:
        f.write(zipped.getvalue())
    with pytest.raises(OutdatedIndex, match=r"older \.npz form"):
        load_tar_index(path, "s.tar")


def test_old_npz_index_is_rebuilt_quietly(tmp_path, caplog) -> None:
    shard = make_demo(str(tmp_path / "demo"), SPEC, progress=None).paths[0]
    with open(shard + ".dfidx", "wb") as f:
        np.savez(f, version=np.int64(2))
    with caplog.at_level("WARNING"):
        with open_shard(shard) as r:
            assert r.index_built and len(r) > 0
    assert not caplog.records
    with open_shard(shard) as r:
        assert not r.index_built
