"""The dataset index cache: hit, miss on any change, damaged file rebuilt; parallel scans
equal serial ones."""

from __future__ import annotations

import logging
import os
import tarfile

import pytest

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ConfigError, ShardReadError
from dataflow.index.cache import cache_path, load_index
from dataflow.index.scan import scan_shards
from dataflow.storage.sources import resolve

SPEC = DemoSpec(fmt="tar", shards=6, samples_per_shard=12, image_shape=(2,))


@pytest.fixture
def shards(tmp_path) -> list[str]:
    return list(make_demo(str(tmp_path / "data"), SPEC, progress=None).paths)


def _load(shards: list[str], cache: str, **kw):
    return load_index(shards, cache_dir=cache, **kw)


def test_second_load_hits_and_equals_the_first(shards, tmp_path, caplog) -> None:
    cache = str(tmp_path / "cache")
    with caplog.at_level(logging.INFO, "dataflow.index.cache"):
        first = _load(shards, cache)
    assert not first.hit and first.path == cache_path(cache, shards, "raise")
    assert "index cache miss: no cache file" in caplog.text
    second = _load(shards, cache)
    assert second.hit and second.index == first.index
    assert second.index.fingerprint == first.index.fingerprint
    assert second.index == scan_shards(shards, cache_dir=cache).index


def test_other_policy_or_shard_list_is_another_entry(shards, tmp_path) -> None:
    cache = str(tmp_path / "cache")
    _load(shards, cache)
    assert not _load(shards, cache, on_error="skip").hit
    assert not _load(shards[:-1], cache).hit
    assert _load(shards, cache).hit and _load(shards, cache, on_error="skip").hit


@pytest.mark.parametrize("change", ["touch", "rewrite", "remove"])
def test_changed_shard_misses(shards, tmp_path, caplog, change: str) -> None:
    cache = str(tmp_path / "cache")
    before = _load(shards, cache).index
    victim = shards[2]
    if change == "touch":
        st = os.stat(victim)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif change == "rewrite":
        with open(victim, "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * 1024)  # two more end-of-archive blocks: same samples, new size
    else:
        os.remove(victim)
        with pytest.raises(ShardReadError, match=os.path.basename(victim)):
            _load(shards, cache)
        return
    with caplog.at_level(logging.INFO, "dataflow.index.cache"):
        after = _load(shards, cache)
    assert not after.hit
    assert f"1 of {len(shards)} shard(s) changed since it was written, first {victim}" in (
        caplog.text)
    assert after.index.sizes == before.sizes
    assert after.index.fingerprint != before.fingerprint
    assert _load(shards, cache).hit


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage", "directory"])
def test_damaged_cache_is_rebuilt_with_a_warning(shards, tmp_path, caplog, damage: str) -> None:
    cache = str(tmp_path / "cache")
    good = _load(shards, cache)
    assert good.path is not None
    with open(good.path, "rb") as f:
        raw = f.read()
    if damage == "directory":
        os.remove(good.path)
        os.mkdir(good.path)
    else:
        bad = {"flip": raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:], "truncate": raw[:len(raw) // 2],
               "empty": b"", "garbage": b"\x00\xff" * 40}[damage]
        with open(good.path, "wb") as f:
            f.write(bad)
    with caplog.at_level(logging.WARNING, "dataflow.index.cache"):
        again = _load(shards, cache)
    assert not again.hit and again.index == good.index
    assert f"index cache {good.path} rejected, rebuilding" in caplog.text
    if damage != "directory":
        assert _load(shards, cache).hit


def test_hit_reports_the_damage_the_index_left_out(shards, tmp_path, caplog) -> None:
    cache = str(tmp_path / "cache")
    with tarfile.open(shards[1]) as t:
        member = t.getmembers()[-3]  # of the last sample: it and its shard's end are lost
    os.truncate(shards[1], member.offset_data + member.size // 2)
    with caplog.at_level(logging.WARNING):
        built = _load(shards, cache, on_error="skip")
    total = [r.message for r in caplog.records if "skipped in total" in r.message]
    assert len(total) == 1 and total[0].endswith(f"in 1 of {len(shards)} shard(s)")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = _load(shards, cache, on_error="skip")
    assert again.hit and again.index == built.index
    assert [r.message for r in caplog.records if "skipped in total" in r.message] == total
    assert built.index.skipped == (0, 1, *[0] * (len(shards) - 2))
    assert f"{shards[1]}: 1 sample(s) skipped when the cached index was built" in caplog.text


def test_consistent_cache_of_other_shards_is_refused(shards, tmp_path, caplog) -> None:
    """A valid cache file copied under another key: its digest holds, its shards differ."""
    cache = str(tmp_path / "cache")
    other = _load(shards[:3], cache)
    assert other.path is not None
    os.replace(other.path, cache_path(cache, shards, "raise"))
    with caplog.at_level(logging.WARNING, "dataflow.index.cache"):
        got = _load(shards, cache)
    assert not got.hit and len(got.index.shards) == len(shards)
    assert "it indexes other shards" in caplog.text


def test_unwritable_cache_dir_still_loads(shards, tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, "dataflow.index.cache"):
        got = _load(shards, str(blocker))
    assert not got.hit and got.path is None and got.index.total > 0
    assert "index cache not written" in caplog.text


@pytest.mark.parametrize("n_shards", [1, 3, 17])
@pytest.mark.parametrize("workers", [2, 32])
def test_parallel_scan_equals_serial(tmp_path, n_shards: int, workers: int) -> None:
    spec = DemoSpec(fmt="tar", shards=n_shards, samples_per_shard=5, image_shape=(2,))
    data = str(tmp_path / "data")
    make_demo(data, spec, progress=None)
    shards = resolve(data)
    serial = scan_shards(shards, max_workers=1)
    assert scan_shards(shards, max_workers=workers) == serial
    assert scan_shards(shards, max_workers=workers, progress=True) == serial
    assert serial.index.shards == tuple(shards)


def test_progress_bar_goes_to_stderr(shards, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("dataflow.index.scan.PROGRESS_DELAY_S", 0.0)
    _load(shards, str(tmp_path / "quiet"))
    assert capsys.readouterr().err == ""
    _load(shards, str(tmp_path / "shown"), progress=True)
    err = capsys.readouterr().err
    assert "indexing shards" in err and f"/{len(shards)} " in err


@pytest.mark.parametrize("progress", [False, True])
def test_first_unreadable_shard_ends_the_scan(tmp_path, progress: bool) -> None:
    """Shards queued behind a missing one are not opened (their tar indexes are not written),
    however late the scan's caller sees the failure."""
    spec = DemoSpec(fmt="tar", shards=20, samples_per_shard=3, image_shape=(2,))
    paths = list(make_demo(str(tmp_path / "data"), spec, progress=None).paths)
    for p in paths:
        if os.path.exists(p + ".dfidx"):
            os.remove(p + ".dfidx")
    os.remove(paths[1])
    with pytest.raises(ShardReadError, match=os.path.basename(paths[1])):
        scan_shards(paths, max_workers=1, progress=progress)
    assert os.path.exists(paths[0] + ".dfidx")
    assert not any(os.path.exists(p + ".dfidx") for p in paths[2:])


def test_max_workers_is_validated(shards, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"`max_workers` must be an integer >= 1. Found: 0"):
        _load(shards, str(tmp_path / "cache"), max_workers=0)
