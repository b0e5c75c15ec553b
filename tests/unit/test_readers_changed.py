"""Shards changed after they were indexed: rewritten in place (``cp``), cut short, replaced by
an atomic rename. A reader never returns mixed data and never touches a map past a file's
end (a SIGBUS would kill this test process); it raises ``ShardChangedError`` naming the
shard, or under ``on_error="skip"`` counts the rows it cannot serve."""

from __future__ import annotations

import gzip
import os
import shutil

import fsspec
import numpy as np
import pytest

from dataflow import wire
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardChangedError
from dataflow.readers import IndexedShard, LostShard, ShardReader, open_shard
from dataflow.server.tasks import ReaderCache, WorkerSpec, serve_task
from dataflow.server.transform import Transform
from dataflow.storage.cache import identity
from dataflow.wire.internal import Task

N = 40
KINDS = [("tar", "file"), ("arrow", "file"), ("arrow", "stream"), ("parquet", "file")]
IDS = [f"{fmt}-{kind}" for fmt, kind in KINDS]


def _demo(root: str, fmt: str, kind: str, per_shard: int = N) -> list[str]:
    """Two shards of ``per_shard`` samples each (ids 0.. and per_shard..)."""
    spec = DemoSpec(fmt=fmt, shards=2, samples_per_shard=per_shard, uneven=False,
                    image_shape=(3, 8, 8), arrow_kind=kind)
    return [str(p) for p in make_demo(root, spec, progress=None).paths]


def _indexed(path: str, cache: str) -> IndexedShard:
    with open_shard(path, cache_dir=cache) as r:
        return IndexedShard(identity(path), len(r), r.schema)


def _rewrite(src: str, dst: str) -> None:
    """``cp src dst``: the same inode, new bytes (and a new mtime)."""
    ino = os.stat(dst).st_ino
    shutil.copyfile(src, dst)
    assert os.stat(dst).st_ino == ino


def _ids(r: ShardReader, start: int = 0, stop: int = N) -> list[int]:
    return r.read(start, stop)["id"].tolist()


@pytest.mark.parametrize(("fmt", "kind"), KINDS, ids=IDS)
@pytest.mark.parametrize("shorter", [False, True], ids=["same-count", "shorter"])
def test_rewrite_in_place_under_an_open_reader(tmp_path, fmt: str, kind: str,
                                               shorter: bool) -> None:
    a, b = _demo(str(tmp_path / "d"), fmt, kind)
    new = _demo(str(tmp_path / "small"), fmt, kind, N // 4)[1] if shorter else b
    cache = str(tmp_path / "c")
    indexed = _indexed(a, cache)
    with open_shard(a, cache_dir=cache, indexed=indexed) as r, \
            open_shard(a, cache_dir=cache, indexed=indexed, on_error="skip") as s:
        assert _ids(r) == _ids(s) == list(range(N))
        assert s.read_many(np.array([0, 30]), np.array([20, 40]))["id"].tolist() == [
            *range(20), *range(30, 40)]
        s.verify()  # as a server does after each task
        _rewrite(new, a)
        for read in (lambda: r.read(5, 9), lambda: r.read_many(np.array([0, 30]),
                                                              np.array([3, 31]))):
            with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
                read()
            assert e.value.shard == a
        with pytest.raises(ShardChangedError):
            r.verify()  # its rows of before the change may view the map
        r.verify()  # each read is verified once
        before = s.skipped
        assert len(s.read(5, 9)["id"]) == 0 and s.skipped == before + 4
        assert len(s.read_many(np.array([0, 30]), np.array([3, 31]))["id"]) == 0
        assert s.skipped == before + 8
        assert s.skip_log[-1].count == 4 and "changed since" in s.skip_log[-1].message
        s.verify()  # the reads since returned nothing: a task that lost them replies
    with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
        open_shard(a, cache_dir=cache, indexed=indexed)
    assert e.value.shard == a
    with open_shard(a, cache_dir=cache, indexed=indexed, on_error="skip") as lost:
        assert isinstance(lost, LostShard) and len(lost) == N and lost.schema == indexed.schema
        batch = lost.read_many(np.array([0, 10]), np.array([5, 12]))
        assert batch.keys() == {f.name for f in indexed.schema} and len(batch["id"]) == 0
        assert lost.skipped == 7


@pytest.mark.parametrize(("fmt", "kind"), KINDS, ids=IDS)
def test_atomic_rename_keeps_the_open_file_and_refuses_the_new_one(tmp_path, fmt: str,
                                                                   kind: str) -> None:
    a, b = _demo(str(tmp_path / "d"), fmt, kind)
    cache = str(tmp_path / "c")
    indexed = _indexed(a, cache)
    with open_shard(a, cache_dir=cache, indexed=indexed) as r:
        assert _ids(r, 0, 3) == [0, 1, 2]
        shutil.copyfile(b, str(tmp_path / "tmp"))
        os.replace(str(tmp_path / "tmp"), a)
        assert _ids(r) == list(range(N)), "the indexed content, from the file held open"
        r.verify()
    with pytest.raises(ShardChangedError, match="restart the server to index it again"):
        open_shard(a, cache_dir=cache, indexed=indexed)
    with open_shard(a, cache_dir=cache) as fresh:  # not tied to an index: the file as it is
        assert _ids(fresh) == list(range(N, 2 * N))


@pytest.mark.parametrize(("fmt", "kind"), KINDS, ids=IDS)
def test_a_copy_with_the_indexed_identity_is_served_again(tmp_path, fmt: str,
                                                          kind: str) -> None:
    """``cp -p`` of the original back over a rewritten shard restores size and mtime: the
    shard is the indexed one again."""
    a, b = _demo(str(tmp_path / "d"), fmt, kind)
    cache = str(tmp_path / "c")
    shutil.copy2(a, str(tmp_path / "orig"))
    indexed = _indexed(a, cache)
    with open_shard(a, cache_dir=cache, indexed=indexed) as r:
        _rewrite(b, a)
        with pytest.raises(ShardChangedError):
            r.read(0, 1)
        shutil.copy2(str(tmp_path / "orig"), a)
        assert _ids(r) == list(range(N))


def test_tar_header_check_catches_a_change_that_kept_size_and_mtime(tmp_path) -> None:
    a, _ = _demo(str(tmp_path / "d"), "tar", "file")
    cache = str(tmp_path / "c")
    with open_shard(a, cache_dir=cache) as r:
        heads = r._index.headers  # type: ignore[attr-defined]
        st = os.stat(a)
        with open(a, "r+b") as f:
            f.seek(int(heads[7]) + 257)
            f.write(b"Xsta?")
        os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert _ids(r, 0, 7) == list(range(7))
        with pytest.raises(ShardChangedError, match="no tar header where the index has") as e:
            r.read(5, 9)
        assert e.value.index == 7 and e.value.offset == int(heads[7])


def test_gzipped_tar_serves_its_copy_and_a_new_open_refuses_the_change(tmp_path) -> None:
    a, b = _demo(str(tmp_path / "d"), "tar", "file")
    gz_a, gz_b = a + ".gz", b + ".gz"
    for src, dst in ((a, gz_a), (b, gz_b)):
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as f:
            f.write(gzip.compress(data, mtime=0))
    cache = str(tmp_path / "c")
    indexed = _indexed(gz_a, cache)
    with open_shard(gz_a, cache_dir=cache, indexed=indexed) as r:
        _rewrite(gz_b, gz_a)
        assert _ids(r) == list(range(N)), "reads map the decompressed copy of the indexed file"
    with pytest.raises(ShardChangedError, match="changed since the dataset index"):
        open_shard(gz_a, cache_dir=cache, indexed=indexed)


def test_a_shard_with_another_sample_count_is_refused(tmp_path) -> None:
    """The identity matches but the reader counts other samples than the index: refused."""
    a, _ = _demo(str(tmp_path / "d"), "arrow", "file")
    cache = str(tmp_path / "c")
    indexed = _indexed(a, cache)
    wrong = IndexedShard(indexed.identity, N + 1, indexed.schema)
    with pytest.raises(ShardChangedError, match=f"has {N} sample.*recorded {N + 1}"):
        open_shard(a, cache_dir=cache, indexed=wrong)


@pytest.mark.parametrize(("fmt", "kind"), KINDS, ids=IDS)
def test_a_remote_shard_is_checked_against_its_etag_when_opened(tmp_path, fmt: str,
                                                                kind: str) -> None:
    """A remote shard replaced since it was indexed (another identity: size, ETag or
    modification time) is refused when a reader opens it; under skip it serves none of the
    indexed samples and counts them."""
    a, b = _demo(str(tmp_path / "d"), fmt, kind)
    url = f"memory://changed-{fmt}-{kind}/{os.path.basename(a)}"
    memory = fsspec.filesystem("memory")
    cache = str(tmp_path / "c")
    try:
        with open(a, "rb") as f:
            memory.pipe(url, f.read())
        indexed = _indexed(url, cache)
        with open_shard(url, cache_dir=cache, indexed=indexed) as r:
            assert _ids(r) == list(range(N))
        with open(b, "rb") as f:
            memory.pipe(url, f.read())
        assert identity(url) != indexed.identity
        with pytest.raises(ShardChangedError, match="changed since the dataset index") as e:
            open_shard(url, cache_dir=cache, indexed=indexed)
        assert e.value.shard == url
        with open_shard(url, cache_dir=cache, indexed=indexed, on_error="skip") as lost:
            assert isinstance(lost, LostShard) and len(lost) == N
            assert len(lost.read(0, N)["id"]) == 0 and lost.skipped == N
    finally:
        memory.rm(url)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_task_whose_arrays_may_view_a_changed_shard_replies_an_error(tmp_path,
                                                                       on_error: str) -> None:
    """An Arrow read of one record batch returns views of the map; the shard rewritten after
    the read (here by the transform) fails the reply, naming the shard, whatever
    ``on_error``: the batch is built. The next task reads nothing of the shard: it is
    refused, or under skip its samples are counted."""
    a, b = _demo(str(tmp_path / "d"), "arrow", "file")
    cache = str(tmp_path / "c")
    spec = WorkerSpec("ipc://@x", 8, (a, b), cache, None, on_error, 1, 20, 1 << 30,
                      str(tmp_path / "d") + "/", 16, indexed=(_indexed(a, cache),
                                                              _indexed(b, cache)))
    rewrite = Transform("test:rewrite", lambda batch: (_rewrite(b, a), batch)[1], False)
    readers = ReaderCache(spec)
    try:
        def serve(transform: Transform | None, req_id: int, rows: list) -> wire.Message:
            task = Task(b"tok", req_id, np.array(rows, dtype=np.int64))
            return wire.decode(serve_task(readers, transform, spec, task)[0])

        ok = serve(None, 1, [[0, 0, 8]])
        assert isinstance(ok, wire.BatchMsg) and ok.size == 8
        failed = serve(rewrite, 2, [[0, 8, 16]])
        assert isinstance(failed, wire.ErrorMsg)
        assert failed.message.startswith("ShardChangedError: train-000000.arrow: changed since")
        after = serve(None, 3, [[0, 0, 8], [1, 0, 8]])
        if on_error == "raise":
            assert isinstance(after, wire.ErrorMsg) and "train-000000.arrow" in after.message
        else:
            assert isinstance(after, wire.BatchMsg) and (after.size, after.skipped) == (8, 8)
    finally:
        readers.close()
