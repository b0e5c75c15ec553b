"""The disk tier of the readers' decoded-sample cache: file round trips, its bound, the files
of readers that are gone, the memory tier spilling to it, and files on a memory filesystem read
as mappings."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dataflow.batch import Ragged
from dataflow.errors import ConfigError
from dataflow.server.diskcache import (
    DiskTier,
    decode_sample,
    encode_sample,
    remove_server_directory,
    server_directory,
)
from dataflow.server.filemap import MEMORY_FILESYSTEMS, filesystem_type
from dataflow.server.samplecache import SampleCache, assemble, sample_bytes, split


def _samples(n: int, size: int = 300) -> list:
    ids = np.arange(n, dtype=np.int64)
    offsets = np.arange(n + 1, dtype=np.int64) * 3
    return split({"id": ids, "img": np.repeat(ids, size).astype(np.uint8).reshape(n, size),
                  "txt": Ragged(np.arange(3 * n, dtype=np.uint8), offsets, "str")})


def _file(sample: tuple) -> bytes:
    return b"".join(bytes(piece) for piece in encode_sample(sample))


def test_a_sample_file_round_trips_every_field_and_refuses_a_cut_one() -> None:
    sample = _samples(3)[2]
    back = decode_sample(_file(sample))
    assert [(n, k) for n, _, k in back] == [(n, k) for n, _, k in sample]
    for (_, a, _), (_, b, _) in zip(back, sample, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    with pytest.raises(ValueError):
        decode_sample(_file(sample)[:-1])


def test_files_of_one_header_decode_each_to_its_own_values() -> None:
    """Samples whose headers are the same (a header is parsed once) or differ (ragged fields
    of other lengths) decode to their own values; a damaged header is refused."""
    samples = _samples(4)
    longer = split({"id": np.array([9]), "img": np.full((1, 300), 9, np.uint8),
                    "txt": Ragged(np.arange(7, dtype=np.uint8), np.array([0, 7]), "str")})[0]
    for sample in [*samples, longer, *samples]:
        back = decode_sample(_file(sample))
        for (_, a, _), (_, b, _) in zip(back, sample, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    data = bytearray(_file(samples[0]))
    data[8] = ord("{")  # the JSON header's first character
    with pytest.raises(ValueError):
        decode_sample(bytes(data))


def test_the_tier_holds_its_bound_and_removes_the_least_recently_used(tmp_path: Path) -> None:
    server = server_directory(str(tmp_path), 4242)
    one = len(_file(_samples(1)[0]))
    disk = DiskTier(server, 3 * one)
    samples = _samples(5)
    for row in range(3):
        assert disk.put((0, row), samples[row])
    assert disk.get((0, 0)) is not None
    assert disk.put((0, 3), samples[3])
    assert disk.get((0, 1)) is None and disk.evictions == 1
    assert sorted(os.listdir(disk.directory)) == ["0-0", "0-2", "0-3"]
    assert disk.bytes == 3 * one == sum(os.path.getsize(os.path.join(disk.directory, f))
                                        for f in os.listdir(disk.directory))
    assert not disk.put((1, 0), split({"x": np.zeros((1, 4 * one), np.uint8)})[0])
    disk.close()
    assert not os.path.exists(disk.directory)
    remove_server_directory(server)
    assert not os.path.exists(server)


def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    disk = DiskTier(server_directory(str(tmp_path), 1), 1 << 20)
    disk.put((2, 7), _samples(1)[0])
    path = os.path.join(disk.directory, "2-7")
    with open(path, "r+b") as f:
        f.truncate(20)
    assert disk.get((2, 7)) is None and not os.path.exists(path) and disk.bytes == 0


def test_a_reader_removes_the_files_of_readers_that_are_gone(tmp_path: Path) -> None:
    server = server_directory(str(tmp_path), 7)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    os.makedirs(os.path.join(server, f"reader-{gone}"))
    os.makedirs(os.path.join(server, f"reader-{os.getppid()}"))  # alive: kept
    DiskTier(server, 1 << 20)
    assert sorted(os.listdir(server)) == sorted([f"reader-{os.getppid()}",
                                                 f"reader-{os.getpid()}"])


def test_new_entries_are_written_through_and_found_on_disk_once_memory_evicted_them(
        tmp_path: Path) -> None:
    samples = _samples(6)
    cache = SampleCache(2 * sample_bytes(samples[0]),
                        DiskTier(server_directory(str(tmp_path), 3), 1 << 20))
    for row, sample in enumerate(samples):
        cache.put((0, row), sample)
    counts = cache.counts()
    assert counts.entries == 2 and counts.evictions == 4
    assert cache.disk is not None and len(os.listdir(cache.disk.directory)) == 6
    order = [4, 5, 0, 1, 2, 3]  # the two in memory, then four from disk
    got = [cache.get((0, row)) for row in order]
    assert all(s is not None for s in got)
    assert assemble(got, "t")["id"].tolist() == order
    counts = cache.counts()
    assert (counts.hits, counts.disk_hits, counts.misses) == (2, 4, 0)
    assert counts.bytes <= 2 * sample_bytes(samples[0])
    assert cache.get((1, 0)) is None and cache.counts().misses == 1
    cache.close()


def test_the_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="`cache_disk_bytes` must be a positive number"):
        DiskTier(str(tmp_path), 0)


def test_a_reader_finds_the_files_its_siblings_wrote_whole_only(tmp_path: Path) -> None:
    server = server_directory(str(tmp_path), 9)
    sibling = Path(server) / f"reader-{os.getppid()}"  # a live process: a sibling reader
    sibling.mkdir()
    sample = _samples(1)[0]
    (sibling / "0-5").write_bytes(_file(sample))
    (sibling / ".tmp-0-6").write_bytes(_file(sample))  # being written: not found
    (sibling / "0-7").write_bytes(_file(sample)[:-3])  # not whole: a miss
    disk = DiskTier(server, 1 << 20)
    found = disk.get((0, 5))
    assert found is not None and np.array_equal(found[1][1], sample[1][1])
    assert disk.get((0, 6)) is None and disk.get((0, 7)) is None
    assert disk.hits == 1 and disk.bytes == 0  # a sibling's file is not this reader's
    cache = SampleCache(1 << 20, disk)
    assert cache.get((0, 5)) is not None and cache.counts().disk_hits == 2
    assert cache.get((0, 5)) is not None and cache.counts().hits == 1  # now in memory


def _on_shm() -> bool:
    return os.path.isdir("/dev/shm") and filesystem_type("/dev/shm") in MEMORY_FILESYSTEMS


def test_the_filesystem_of_a_path_is_its_longest_mount_point_s() -> None:
    assert filesystem_type("/proc/self") == "proc"
    assert filesystem_type("/proc") == "proc"
    if _on_shm():
        assert filesystem_type("/dev/shm/no/such/file") == filesystem_type("/dev/shm")


@pytest.mark.skipif(not _on_shm(), reason="needs /dev/shm on tmpfs")
def test_on_a_memory_filesystem_files_are_read_as_mappings_that_outlive_their_files() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        server = server_directory(root, 11)
        sibling = Path(server) / f"reader-{os.getppid()}"
        sibling.mkdir()
        samples = _samples(3)
        (sibling / "0-0").write_bytes(_file(samples[0]))
        disk = DiskTier(server, 1 << 20)
        assert disk.maps is not None and disk.maps.live == 0
        assert disk.put((0, 1), samples[1])
        theirs, mine = disk.get((0, 0)), disk.get((0, 1))
        assert theirs is not None and mine is not None and disk.maps.live == 2
        (sibling / "0-0").unlink()  # the writer evicts it; the mapping still holds it whole
        disk.close()  # this reader's files removed too
        for got, want in ((theirs, samples[0]), (mine, samples[1])):
            assert [(n, k) for n, _, k in got] == [(n, k) for n, _, k in want]
            for (_, a, _), (_, b, _) in zip(got, want, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
                assert not a.flags.writeable
        assert assemble([theirs, mine], "t")["id"].tolist() == [0, 1]
        del got, want, a, b, theirs, mine
        assert disk.maps.live == 0  # unmapped with the last array viewing them
        remove_server_directory(server)


@pytest.mark.skipif(not _on_shm(), reason="needs /dev/shm on tmpfs")
def test_past_its_mappings_the_tier_reads_files() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        disk = DiskTier(server_directory(root, 12), 1 << 20, max_mappings=1)
        samples = _samples(2)
        for row, sample in enumerate(samples):
            disk.put((0, row), sample)
        first, second = disk.get((0, 0)), disk.get((0, 1))
        assert first is not None and second is not None and disk.maps is not None
        assert disk.maps.live == 1 and disk.hits == 2
        assert second[1][1].base is not None and np.array_equal(second[1][1], samples[1][1][1])
        del first
        assert disk.maps.live == 0
        again = disk.get((0, 1))
        assert again is not None and disk.maps.live == 1
        assert np.array_equal(again[1][1], samples[1][1][1])
        disk.close()


@pytest.mark.skipif(not _on_shm(), reason="needs /dev/shm on tmpfs")
def test_on_a_memory_filesystem_memory_holds_the_mapping_of_the_file_just_written() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        batch = {"id": np.arange(3, dtype=np.int64),
                 "img": np.repeat(np.arange(3), 300).astype(np.uint8).reshape(3, 300)}
        disk = DiskTier(server_directory(root, 13), 1 << 20)
        cache = SampleCache(2 * sample_bytes(split(batch)[0]), disk)
        for row, sample in enumerate(split(batch, copy=False)):
            assert cache.put((0, row), sample)
        batch["img"][:] = 0  # the decoded batch, reused: the cache holds the files' pages
        assert disk.maps is not None and disk.maps.live == 2  # row 0 evicted from memory
        held = [cache.get((0, row)) for row in (1, 2)]
        assert all(s is not None and not s[1][1].flags.writeable for s in held)
        assert cache.counts().hits == 2
        assert assemble(held, "t")["img"][:, 0].tolist() == [1, 2]
        del held
        cache.close()
        assert disk.maps.live == 2  # memory still holds them, their files removed
        del cache  # nothing views them any more: unmapped
        assert disk.maps.live == 0
