"""Damaged shards of every format under ``on_error="raise"`` and ``"skip"``.

Files are written by webdataset's TarWriter, ``tarfile`` and pyarrow, then damaged on
purpose. Under ``skip`` every test checks the arithmetic the server relies on: across a read,
rows returned plus the increase of ``reader.skipped`` equal the rows asked for.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import os
import re
import struct
import subprocess
import tarfile

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardReadError
from dataflow.index.scan import build_index
from dataflow.readers import ShardReader, open_shard
from dataflow.readers.damage import split_damaged
from dataflow.readers.tar.indexfile import load_tar_index, save_tar_index

TAR_SPEC = DemoSpec(fmt="tar", shards=1, samples_per_shard=234, uneven=False,
                    image_shape=(3, 16, 16), seed=2)
N_TAR = 234


def _served(batch: dict) -> int:
    return len(next(iter(batch.values())))


def _read_many_counted(r: ShardReader, ranges: list[tuple[int, int]]) -> tuple[dict, int]:
    """``read_many`` of ``ranges``; asserts served + skipped-delta == requested."""
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    stops = np.array([b for _, b in ranges], dtype=np.int64)
    before = r.skipped
    batch = r.read_many(starts, stops)
    lost = r.skipped - before
    assert _served(batch) + lost == int((stops - starts).sum())
    return batch, lost


def _read_counted(r: ShardReader, start: int, stop: int) -> tuple[dict, int]:
    before = r.skipped
    batch = r.read(start, stop)
    lost = r.skipped - before
    assert _served(batch) + lost == stop - start
    return batch, lost


def _flip(path: str, offset: int, data: bytes = b"\xff") -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# --- tar ------------------------------------------------------------------------------------

@pytest.fixture
def tar_shard(tmp_path) -> str:
    return make_demo(str(tmp_path / "demo"), TAR_SPEC, progress=None).paths[0]


def _members(path: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as t:
        return {m.name: m for m in t.getmembers()}


def _check_tar_skip(r: ShardReader, lost: set[int]) -> None:
    """The reader serves every sample but ``lost`` (ids), each counted once, and reads count
    nothing more."""
    want = [i for i in range(N_TAR) if i not in lost]
    assert len(r) == len(want) and r.skipped == len(lost)
    assert len(r) + r.skipped == N_TAR
    np.testing.assert_array_equal(r.read(0, len(r))["id"], want)
    batch, more = _read_many_counted(r, [(0, 5), (len(r) - 3, len(r)), (7, 9)])
    assert more == 0 and _served(batch) == 10
    assert sum(rec.count for rec in r.skip_log) == r.skipped


def test_tar_corrupt_header_skips_only_its_sample(tar_shard, tmp_path) -> None:
    header = _members(tar_shard)["000000100.image.npy"].offset_data - 512
    _flip(tar_shard, header + 5)
    with pytest.raises(ShardReadError, match="checksum mismatch") as e:
        open_shard(tar_shard, cache_dir=str(tmp_path / "c"))
    assert e.value.shard == tar_shard and e.value.offset == header
    with open_shard(tar_shard, cache_dir=str(tmp_path / "c"), on_error="skip") as r:
        _check_tar_skip(r, {100})
        damage, sample = r.skip_log
        assert (damage.offset, damage.count) == (header, 0)
        assert "resumed at the next valid header" in damage.message
        assert (sample.shard, sample.index, sample.count) == (tar_shard, 100, 1)
        assert "'000000100'" in sample.message
    with open_shard(tar_shard, cache_dir=str(tmp_path / "c"), on_error="skip") as r:
        assert not r.index_built  # the skip records come back with the cached index
        _check_tar_skip(r, {100})
        assert [rec.index for rec in r.skip_log] == [None, 100]
    with pytest.raises(ShardReadError, match="checksum mismatch"):  # never the skip index
        open_shard(tar_shard, cache_dir=str(tmp_path / "c"))


def test_tar_member_cut_short_is_dropped_and_the_rest_recovered(tar_shard, tmp_path) -> None:
    info = _members(tar_shard)["000000050.image.npy"]
    with open(tar_shard, "rb") as f:
        data = f.read()
    cut = info.offset_data + 100
    with open(tar_shard, "wb") as f:
        f.write(data[:cut] + data[cut + 1000:])  # the headers after it move off the grid
    with pytest.raises(ShardReadError) as e:
        open_shard(tar_shard, cache_dir=str(tmp_path / "c"))
    assert e.value.shard == tar_shard and e.value.offset is not None
    with open_shard(tar_shard, cache_dir=str(tmp_path / "c"), on_error="skip") as r:
        _check_tar_skip(r, {50})
        damage = r.skip_log[0]
        assert "'000000050.image.npy' before it looks cut short" in damage.message
        assert r.skip_log[1].index == 50


def test_tar_truncated_at_the_end_counts_its_last_sample(tar_shard, tmp_path) -> None:
    info = _members(tar_shard)["000000200.image.npy"]
    with open(tar_shard, "r+b") as f:
        f.truncate(info.offset_data + 300)
    with open_shard(tar_shard, cache_dir=str(tmp_path / "c"), on_error="skip") as r:
        assert len(r) == 200 and r.skipped == 1
        np.testing.assert_array_equal(r.read(0, 200)["id"], np.arange(200))
        assert "the rest of the tar is lost" in r.skip_log[0].message
        assert r.skip_log[1].index == 200


def test_tar_gz_damaged_stream_loses_the_rest(tar_shard, tmp_path) -> None:
    with open(tar_shard, "rb") as f:
        packed = bytearray(gzip.compress(f.read(), mtime=0))
    mid = len(packed) // 2
    packed[mid : mid + 64] = b"\xff" * 64
    path = str(tmp_path / "bad.tar.gz")
    with open(path, "wb") as f:
        f.write(packed)
    cache = str(tmp_path / "c")
    with pytest.raises(ShardReadError, match="gzip stream damaged") as e:
        open_shard(path, cache_dir=cache)
    assert e.value.shard == path
    with open_shard(path, cache_dir=cache, on_error="skip") as r:
        n = len(r)
        assert 0 < n < N_TAR and r.skipped <= 1
        np.testing.assert_array_equal(r.read(0, n)["id"], np.arange(n))
        assert _read_many_counted(r, [(0, n), (n - 1, n)])[1] == 0
        gz = r.skip_log[0]
        assert gz.count == 0 and "gzip stream damaged" in gz.message
        assert "the rest of the shard, from the first damage the tar walk meets, is lost" in (
            gz.message)
    with pytest.raises(ShardReadError, match="gzip stream damaged"):  # remembered with the copy
        open_shard(path, cache_dir=cache)


def _py_tar(path: str, members: list[tuple[str, bytes]]) -> dict[int, int]:
    """Write ``members`` with tarfile; header offset of each, by position."""
    offsets = {}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i, (name, data) in enumerate(members):
            offsets[i] = t.offset
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return offsets


def test_tar_repeated_member_is_never_served_twice(tmp_path) -> None:
    members = [(f"{k}.{ext}", (f"{i}" if ext == "cls" else k).encode())
               for i, k in enumerate("abcbd") for ext in ("cls", "txt")]
    path = str(tmp_path / "rep.tar")
    offsets = _py_tar(path, members)
    first, again = offsets[2], offsets[6]
    with pytest.raises(ShardReadError) as e:
        open_shard(path)
    assert str(e.value).startswith(
        f"{path} (sample 1, byte offset {again}): member 'b.cls' repeats: first at byte offset "
        f"{first}, again at byte offset {again} (a sample's key and extension must name one "
        "member: rewrite the shard without the repeat")
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 3 and r.skipped == 1
        assert [r.read(0, 3)["txt"][i] for i in range(3)] == ["a", "c", "d"]
        (rec,) = r.skip_log
        assert (rec.index, rec.offset, rec.count) == (1, again, 1)


def test_tar_members_of_a_sample_need_not_be_adjacent(tmp_path) -> None:
    keys = [f"imgs/s{i:05d}" for i in range(6)]
    by_extension = [(f"{k}.{ext}", (str(i) if ext == "cls" else f"{k}.{ext}").encode())
                    for ext in ("txt", "cls", "jpg") for i, k in enumerate(keys)]
    path = str(tmp_path / "by-extension.tar")
    _py_tar(path, [by_extension[i] for i in (5, 0, 17, 9, 3, 12, 1, 16, 8, 2, 14, 6, 11, 4, 15,
                                             7, 10, 13)])
    with open_shard(path) as r:
        assert len(r) == 6 and r.skipped == 0
        got = r.read(0, 6)
        samples = [{f: got[f][i] for f in ("txt", "cls", "jpg")} for i in range(6)]
    assert sorted(s["txt"] for s in samples) == [f"{k}.txt" for k in keys]
    for s in samples:  # every sample whole: its members share its key
        key = s["txt"].removesuffix(".txt")
        assert keys[s["cls"]] == key and s["jpg"] == f"{key}.jpg".encode()


@pytest.mark.timeout(60)
def test_a_tar_made_by_gnu_tar_from_a_directory_is_served_whole(tmp_path) -> None:
    src = tmp_path / "imgs"
    src.mkdir()
    rng = np.random.default_rng(0)
    files = {f"s{i:05d}.{ext}": (str(i) if ext == "cls" else f"jpeg {i}").encode()
             for i in range(40) for ext in ("jpg", "cls")}
    for name in rng.permutation(sorted(files)).tolist():  # created in no particular order
        (src / name).write_bytes(files[name])
    path = str(tmp_path / "x.tar")
    subprocess.run(["tar", "cf", path, "-C", str(tmp_path), "imgs"], check=True, timeout=30)
    with open_shard(path) as r:
        assert len(r) == 40 and r.skipped == 0
        got = r.read(0, 40)
    pairs = {(bytes(got["jpg"][i]), int(got["cls"][i])) for i in range(40)}
    assert pairs == {(f"jpeg {i}".encode(), i) for i in range(40)}


# --- cached tar index -----------------------------------------------------------------------

def _index_of(path: str, **changes) -> None:
    """Rewrite the cached index of ``path`` with ``changes``, and a valid digest."""
    index = load_tar_index(path + ".dfidx", path)
    with open(path + ".dfidx", "wb") as f:
        save_tar_index(dataclasses.replace(index, **changes), f)


def test_tampered_index_is_rebuilt(tar_shard, caplog) -> None:
    open_shard(tar_shard).close()
    idx = tar_shard + ".dfidx"
    with open(idx, "r+b") as f:
        f.seek(-8, os.SEEK_END)  # the last sample header's offset: the digest no longer matches
        f.write((512).to_bytes(8, "little"))
    with caplog.at_level(logging.WARNING, "dataflow.readers.tar"):
        with open_shard(tar_shard) as r:
            assert r.index_built
            np.testing.assert_array_equal(r.read(0, N_TAR)["id"], np.arange(N_TAR))
    assert "does not match its digest" in caplog.text and idx in caplog.text
    caplog.clear()
    _index_of(tar_shard, headers=load_tar_index(idx, tar_shard).headers + 512)
    with caplog.at_level(logging.WARNING, "dataflow.readers.tar"):
        with open_shard(tar_shard) as r:
            assert r.index_built
    assert "no valid tar header at byte offset" in caplog.text
    caplog.clear()
    with open(idx, "r+b") as f:
        f.seek(os.path.getsize(idx) // 2)
        f.write(b"\x00" * 16)
    with caplog.at_level(logging.WARNING, "dataflow.readers.tar"):
        with open_shard(tar_shard) as r:
            assert r.index_built and len(r) == N_TAR
    assert "rejected, rebuilding" in caplog.text
    with open_shard(tar_shard) as r:
        assert not r.index_built


# --- Parquet --------------------------------------------------------------------------------

def _parquet(tmp_path, checksums: bool = True) -> str:
    """60 rows in row groups of 10, plain-encoded and uncompressed so a value can be flipped;
    the last value of column ``x`` in row group 2 (row 29) is then flipped."""
    path = str(tmp_path / "p.parquet")
    table = pa.table({"x": np.arange(60, dtype=np.int64), "s": [f"s{i}" for i in range(60)]})
    pq.write_table(table, path, row_group_size=10, compression="none", use_dictionary=False,
                   write_page_checksum=checksums)
    col = pq.ParquetFile(path).metadata.row_group(2).column(0)
    _flip(path, col.data_page_offset + col.total_compressed_size - 8, b"\x63")
    return path


def test_parquet_flipped_value_is_caught_by_the_page_checksum(tmp_path) -> None:
    path = _parquet(tmp_path)
    assert pq.read_table(path)["x"][29].as_py() == 0x63  # without verification: served as is
    with open_shard(path) as r:
        np.testing.assert_array_equal(r.read(0, 20)["x"], np.arange(20))
        with pytest.raises(ShardReadError, match=r"row group 2 \(samples 20\.\.29\) is "
                           "damaged.*CRC") as e:
            r.read(15, 40)
        assert e.value.shard == path and e.value.index == 20
        with pytest.raises(ShardReadError, match="row group 2") as e:
            r.read_many(np.array([0, 45, 25]), np.array([1, 46, 26]))
        assert e.value.index == 20


def test_parquet_skip_leaves_out_the_damaged_row_group(tmp_path) -> None:
    path = _parquet(tmp_path)
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 60
        b, lost = _read_counted(r, 0, 60)
        assert lost == 10
        np.testing.assert_array_equal(b["x"], [i for i in range(60) if not 20 <= i < 30])
        b, lost = _read_many_counted(r, [(15, 25), (28, 31), (0, 2)])
        assert lost == 7
        np.testing.assert_array_equal(b["x"], [15, 16, 17, 18, 19, 30, 0, 1])
        _, lost = _read_many_counted(r, [(15, 25), (28, 31), (0, 2)])
        assert lost == 7  # counted per read
        _, lost = _read_counted(r, 22, 24)
        assert lost == 2
        assert r.skipped == 26
        assert [(rec.index, rec.count) for rec in r.skip_log] == [(20, 10), (20, 7), (20, 7),
                                                                 (20, 2)]
        assert all(rec.shard == path and "row group 2" in rec.message for rec in r.skip_log)


@pytest.mark.parametrize("batch", [1, 3, 7, 25])
def test_parquet_skip_in_sequential_reads(tmp_path, batch: int) -> None:
    """Reads in order (the decoded span and read-ahead at work) meet the damage first in a
    read-ahead, not in the rows asked for."""
    path = _parquet(tmp_path)
    with open_shard(path, on_error="skip") as r:
        xs = []
        for start in range(0, 60, batch):
            xs.append(_read_counted(r, start, min(start + batch, 60))[0]["x"])
        np.testing.assert_array_equal(np.concatenate(xs),
                                      [i for i in range(60) if not 20 <= i < 30])
        assert r.skipped == 10


# --- Arrow ----------------------------------------------------------------------------------

def _arrow(tmp_path, kind: str) -> str:
    """1000 rows in record batches of 100; batch 3's string data made invalid UTF-8."""
    path = str(tmp_path / f"a-{kind}.arrow")
    table = pa.table({"x": np.arange(1000), "s": [f"v{i:04d}" for i in range(1000)]})
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with pa.OSFile(path, "wb") as f, new(f, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    with open(path, "rb") as f:
        where = f.read().index(b"v0350")
    _flip(path, where + 1)
    return path


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_arrow_damaged_record_batch(tmp_path, kind: str) -> None:
    path = _arrow(tmp_path, kind)
    with open_shard(path) as r:
        np.testing.assert_array_equal(r.read(0, 300)["x"], np.arange(300))
        with pytest.raises(ShardReadError, match=r"record batch 3 \(samples 300\.\.399\) is "
                           "damaged.*UTF8") as e:
            r.read(250, 450)
        assert e.value.shard == path and e.value.index == 300
        with pytest.raises(ShardReadError, match="record batch 3"):
            r.read_many(np.array([0, 399]), np.array([1, 400]))
    with open_shard(path, on_error="skip") as r:
        b, lost = _read_counted(r, 250, 450)
        assert lost == 100
        np.testing.assert_array_equal(b["x"], [*range(250, 300), *range(400, 450)])
        b, lost = _read_many_counted(r, [(390, 402), (5, 6), (300, 301)])
        assert lost == 11 and b["x"].tolist() == [400, 401, 5]
        _, lost = _read_counted(r, 300, 400)
        assert lost == 100
        assert r.skipped == 211
        assert [(rec.index, rec.count) for rec in r.skip_log] == [(300, 100), (300, 11),
                                                                 (300, 100)]


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_arrow_unreadable_batch_metadata(tmp_path, kind: str) -> None:
    """Batch 3's message metadata overwritten: its row count is unknown. A file's footer
    still finds the batches after it; a stream cannot find them."""
    path = str(tmp_path / f"{kind}.arrow")
    table = pa.table({"x": np.arange(1000)})
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with pa.OSFile(path, "wb") as f, new(f, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    head = 8 if kind == "file" else 0  # a file is "ARROW1\0\0" and then a stream
    with open(path, "rb") as f:
        src = pa.BufferReader(f.read()[head:])
    reader, starts = pa.ipc.open_stream(src), []
    for _ in range(4):
        starts.append(head + src.tell())
        reader.read_next_batch()
    _flip(path, starts[3] + 8, b"\xee" * 32)
    with pytest.raises(ShardReadError, match=f"record batch 3 of the {kind} is unreadable") as e:
        open_shard(path)
    assert e.value.shard == path and e.value.index == 300
    assert e.value.offset == (None if kind == "file" else starts[3])
    with open_shard(path, on_error="skip") as r:
        want = [*range(300), *range(400, 1000)] if kind == "file" else list(range(300))
        assert len(r) == len(want) and r.skipped == 0
        np.testing.assert_array_equal(r.read(0, len(r))["x"], want)
        (rec,) = r.skip_log
        assert rec.count == 0 and rec.index == 300 and "how many" in rec.message


def _stream_with_cut(cut_in: int) -> tuple[bytes, int]:
    """A stream of 1000 rows in record batches of 100, cut ``cut_in`` bytes into the body of
    record batch 4 (``-1``: in its metadata), and where batch 4 starts."""
    table = pa.table({"x": np.arange(1000)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    data = sink.getvalue().to_pybytes()
    src = pa.BufferReader(data)
    reader = pa.ipc.open_stream(src)
    for _ in range(4):
        reader.read_next_batch()
    start = src.tell()
    reader.read_next_batch()
    body = src.tell() - 8 * 100  # the batch's body (800 bytes of int64) ends its message
    return data[: body + cut_in if cut_in >= 0 else start + 12], start


@pytest.mark.parametrize("remote", [False, True], ids=["local", "memory-url"])
@pytest.mark.parametrize(("cut_in", "counted"), [(400, 100), (-1, 0)],
                         ids=["in-the-body", "in-the-metadata"])
def test_arrow_stream_cut_short_counts_the_rows_its_metadata_gives(tmp_path, remote: bool,
                                                                   cut_in: int,
                                                                   counted: int) -> None:
    """A stream cut inside record batch 4: its 100 rows are counted when its metadata is
    whole (the shard ends within it, so nothing else is lost), else the count is unknown."""
    data, start = _stream_with_cut(cut_in)
    url = f"memory://damage-{cut_in}/s.arrow" if remote else str(tmp_path / "s.arrow")
    if remote:
        fsspec.filesystem("memory").pipe(url, data)
    else:
        with open(url, "wb") as f:
            f.write(data)
    try:
        with pytest.raises(ShardReadError, match="record batch 4") as e:
            open_shard(url, cache_dir=str(tmp_path / "c"))
        assert e.value.shard == url and e.value.offset == start and e.value.index == 400
        with open_shard(url, on_error="skip", cache_dir=str(tmp_path / "c")) as r:
            assert len(r) == 400 and r.skipped == counted
            np.testing.assert_array_equal(r.read(0, 400)["x"], np.arange(400))
            (rec,) = r.skip_log
            assert rec.count == counted and rec.index == 400
            assert ("its 100 row(s) are lost (the shard ends within it)" if counted
                    else "how many rows is unknown") in rec.message
    finally:
        if remote:
            fsspec.filesystem("memory").rm(url)


def test_arrow_stream_batch_unreadable_mid_way_counts_it_and_says_the_rest_is_unknown(
        tmp_path) -> None:
    """Record batch 4's metadata names a buffer longer than the file, so the batch cannot be
    loaded; its row count and body length are intact: its 100 rows are counted, the batches
    after it cannot be."""
    table = pa.table({"x": np.arange(1000)})
    path = str(tmp_path / "s.arrow")
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    with open(path, "rb") as f:
        data = f.read()
    src = pa.BufferReader(data)
    reader = pa.ipc.open_stream(src)
    for _ in range(4):
        reader.read_next_batch()
    start = src.tell()
    meta_len = int.from_bytes(data[start + 4 : start + 8], "little")
    values = data.index(struct.pack("<qq", 0, 800), start, start + 8 + meta_len)  # (offset, len)
    _flip(path, values + 8, struct.pack("<q", 1 << 40))
    with pytest.raises(ShardReadError, match="record batch 4 of the stream is unreadable"):
        open_shard(path)
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 400 and r.skipped == 100
        (rec,) = r.skip_log
        assert rec.count == 100 and rec.offset == start
        assert re.search(r"its 100 row\(s\) and the rest of the shard, from byte offset \d+, are "
                         r"lost \(how many rows there is unknown\)", rec.message), rec.message


# --- dataset scan ---------------------------------------------------------------------------

def test_build_index_logs_skips_per_shard_and_total(tmp_path, caplog) -> None:
    spec = dataclasses.replace(TAR_SPEC, shards=2, samples_per_shard=30)
    demo = make_demo(str(tmp_path / "d"), spec, progress=None)
    bad = demo.paths[1]
    first = demo.sizes[0]
    _flip(bad, _members(bad)[f"{first + 4:09d}.text"].offset_data - 512 + 5)
    with caplog.at_level(logging.WARNING, "dataflow.index.scan"):
        index = build_index(demo.paths, on_error="skip", cache_dir=str(tmp_path / "c"))
    assert index.sizes == (demo.sizes[0], demo.sizes[1] - 1)
    assert f"{bad}: 1 sample(s) skipped, 2 damage record(s)" in caplog.text
    assert "1 sample(s) skipped in total, in 1 of 2 shard(s)" in caplog.text
    with open_shard(bad, on_error="skip", cache_dir=str(tmp_path / "c")) as r:
        assert _served(r.read(0, len(r))) == index.sizes[1]


def test_tar_end_marker_before_more_members(tmp_path) -> None:
    """Two tars concatenated: the first one's end-of-archive blocks hide the second's members
    from a plain walk; they are damage, and under skip the members after them are kept."""
    a, b = str(tmp_path / "a.tar"), str(tmp_path / "b.tar")
    _py_tar(a, [(f"{k}.txt", k.encode()) for k in "abc"])
    _py_tar(b, [(f"{k}.txt", k.encode()) for k in "de"])
    path = str(tmp_path / "ab.tar")
    with open(path, "wb") as f, open(a, "rb") as fa, open(b, "rb") as fb:
        f.write(fa.read() + fb.read())
    end = 3 * 1024
    with pytest.raises(ShardReadError, match="end-of-archive block, but a member header "
                       f"follows at byte offset {os.path.getsize(a)}") as e:
        open_shard(path)
    assert e.value.offset == end
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 5 and r.skipped == 0
        assert [r.read(0, 5)["txt"][i] for i in range(5)] == list("abcde")
        (rec,) = r.skip_log
        assert rec.count == 0 and rec.offset == end


def test_split_damaged() -> None:
    bounds = np.array([0, 10, 20, 30, 40])
    rows = np.array([35, 5, 12, 25, 19, 5, 0, 39])
    kept, lost = split_damaged(rows, bounds, {1: "x", 3: "y"})
    assert kept.tolist() == [5, 25, 5, 0] and lost == {1: 2, 3: 2}
    kept, lost = split_damaged(rows, bounds, {})
    assert kept is rows and lost == {}
