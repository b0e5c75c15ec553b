"""The bounded LRU cache: the pure eviction choice and the on-disk accounting."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from dataflow.errors import ConfigError
from dataflow.storage.lru import DiskLru, Entry, evictions


def test_nothing_evicted_while_it_fits() -> None:
    entries = [Entry("a", 40, 1.0), Entry("b", 40, 2.0)]
    assert evictions(entries, 100, 20) == []


def test_least_recently_used_go_first_down_to_the_low_water_mark() -> None:
    entries = [Entry("new", 30, 9.0), Entry("old", 30, 1.0), Entry("mid", 30, 5.0)]
    # 90 + 30 > 100: drop until <= 90
    assert evictions(entries, 100, 30) == ["old"]
    assert evictions(entries, 100, 30, low_water=0.6) == ["old", "mid"]
    assert evictions(entries, 100, 100) == ["old", "mid", "new"]


def test_ties_break_by_key_and_oversized_entries_are_refused() -> None:
    assert evictions([Entry("b", 10, 1.0), Entry("a", 10, 1.0)], 10, 10) == ["a", "b"]
    with pytest.raises(ConfigError, match="cannot fit"):
        evictions([], 10, 11)


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if not n.startswith("."))


def test_disk_cache_stays_under_its_limit_and_keeps_recent_entries(tmp_path) -> None:
    lru = DiskLru(str(tmp_path), 10_000)
    for i in range(30):
        lru.put(f"k{i}", bytes([i]) * 1000)
        os.utime(tmp_path / f"k{i}", (i, i))  # a deterministic use order
        assert _disk_bytes(str(tmp_path)) <= 10_000
    assert lru.get("k29") == bytes([29]) * 1000
    assert lru.get("k0") is None
    assert lru.get("k29", 10, 13) == bytes([29]) * 3
    assert lru.usage() == _disk_bytes(str(tmp_path)) and lru.evicted >= 20
    with pytest.raises(ConfigError):
        lru.put("big", b"x" * 10_001)


def _fill(args: tuple[str, int]) -> None:
    path, worker = args
    lru = DiskLru(path, 50_000)
    for i in range(40):
        lru.put(f"w{worker}-{i}", b"x" * 3000)


def test_processes_sharing_a_directory_keep_the_limit(tmp_path) -> None:
    with ProcessPoolExecutor(3) as pool:
        list(pool.map(_fill, [(str(tmp_path), w) for w in range(3)]))
    assert 40_000 < _disk_bytes(str(tmp_path)) <= 50_000
    assert DiskLru(str(tmp_path), 50_000).usage() == _disk_bytes(str(tmp_path))
