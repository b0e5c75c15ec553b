"""The readers' decoded-sample cache through real servers: the disk tier's bound and files, and
a new decode version never served the old one's entries.

Shards are Arrow IPC files written by pyarrow; the ``Stages`` transform is a module written in
``tmp_path`` and found in the server's start directory.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from srvtools import run_ranks

from dataflow.client import DataLoader
from dataflow.server.filemap import MEMORY_FILESYSTEMS, filesystem_type

SAMPLES = 48
WIDTH = 2048  # bytes of one decoded sample's ``pixels``

MODULE = '''
import numpy as np
from dataflow.transform import Stages

def decode(batch):
    x = batch["x"]
    return {{"x": x, "pixels": np.repeat((x * {scale}) % 251, {width}).astype(np.uint8)
                              .reshape(len(x), {width})}}

def shift(batch, ctx):
    batch["pixels"] = batch["pixels"] + np.uint8(ctx.rng().integers(0, 4))
    return batch

STAGES = Stages(decode, shift, version="{version}")
'''


def _shards(root: Path) -> list[str]:
    paths = []
    for s in range(3):
        table = pa.table({"x": pa.array(range(s * 16, s * 16 + 16), pa.int64())})
        path = root / f"part-{s}.arrow"
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        paths.append(str(path))
    return paths


def _module(where: Path, scale: int, version: str) -> Path:
    where.mkdir(exist_ok=True)
    (where / "stagemod.py").write_text(MODULE.format(scale=scale, width=WIDTH, version=version))
    return where


def _epoch(endpoint: str, epoch: int, seed: int = 3, batch: int = 8) -> dict[int, np.ndarray]:
    """Each sample's pixels, with the batch's shift taken off (checked equal in a row)."""
    out: dict[int, np.ndarray] = {}
    with DataLoader(endpoint, batch_size=batch, rank=0, world_size=1, seed=seed,
                    timeout=30) as dl:
        dl.set_epoch(epoch)
        for b in dl:
            for x, row in zip(b["x"].tolist(), b["pixels"].numpy(), strict=True):
                assert x not in out and len(set(row.tolist())) == 1
                out[x] = row
    assert sorted(out) == list(range(SAMPLES))
    return out


def _files(run_dir: Path) -> int:
    """Bytes of the cache files under ``run_dir`` now (not those being written; a file removed
    while it is listed counts 0)."""
    total = 0
    for path in run_dir.rglob("*"):
        if not path.name.startswith(".tmp-"):
            try:
                total += path.stat().st_size if path.is_file() else 0
            except FileNotFoundError:
                pass
    return total


def _scaled(got: dict[int, np.ndarray], scale: int) -> bool:
    """Whether every sample's pixels are ``(x * scale) % 251`` plus a shift of 0 to 3."""
    return all(0 <= int(row[0]) - (x * scale) % 251 <= 3 for x, row in got.items())


@pytest.mark.timeout(120)
def test_the_disk_tier_holds_its_bound_and_leaves_nothing_after_the_server(
        servers, raw_client, tmp_path) -> None:
    shards = _shards(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    memory, disk_bytes = 16 * 1024, 64 * 1024  # per reader: 8 KiB (3 samples), 32 KiB
    server = servers(shards, workers=2, cwd=_module(tmp_path / "v1", 3, "1"),
                     extra_args=["--transform", "stagemod:STAGES", "--cache-memory", str(memory),
                                 "--cache-disk", str(disk), "--cache-disk-bytes",
                                 str(disk_bytes)])
    run_dir = disk / f"dataflow-cache-{server.pid}"
    probe = raw_client(server.endpoint)
    for epoch in range(3):
        assert _scaled(_epoch(server.endpoint, epoch), 3)
        stats = probe.stats()
        on_disk = _files(run_dir)
        assert 0 < stats["cache_disk_bytes"] <= disk_bytes and on_disk <= disk_bytes
        assert stats["cache_bytes"] <= memory
    stats = probe.stats()
    assert stats["cache_disk_hits"] > 0 and stats["cache_evictions"] > 0
    assert stats["cache_disk_evictions"] > 0
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        f"reader-{pid}" for pid in server.ready["worker_pids"])
    server.close(grace=10)
    assert list(disk.iterdir()) == []


@pytest.mark.timeout(120)
def test_a_new_decode_version_never_serves_the_old_one_s_entries(servers, raw_client,
                                                                tmp_path) -> None:
    shards = _shards(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    flags = ["--transform", "stagemod:STAGES", "--cache-memory", "1M", "--cache-disk",
             str(disk)]
    old = servers(shards, workers=1, cwd=_module(tmp_path / "v1", 3, "1"), extra_args=flags)
    for epoch in range(2):
        assert _scaled(_epoch(old.endpoint, epoch), 3)
    assert raw_client(old.endpoint).stats()["cache_hits"] >= SAMPLES
    old.close(grace=10)
    new = servers(shards, workers=1, cwd=_module(tmp_path / "v2", 5, "2"), extra_args=flags)
    for epoch in range(2):
        assert _scaled(_epoch(new.endpoint, epoch), 5)
    stats = raw_client(new.endpoint).stats()
    assert stats["cache_misses"] == SAMPLES and stats["cache_hits"] >= SAMPLES
    assert [p.name for p in disk.iterdir()] == [f"dataflow-cache-{new.pid}"]
    assert os.path.isdir(disk / f"dataflow-cache-{new.pid}")


@pytest.mark.timeout(120)
def test_readers_share_the_disk_tier_so_the_server_decodes_a_sample_about_once(
        servers, raw_client, tmp_path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    _decoded_about_once(servers, raw_client, tmp_path, disk)


@pytest.mark.timeout(120)
@pytest.mark.skipif(filesystem_type("/dev/shm") not in MEMORY_FILESYSTEMS,
                    reason="needs /dev/shm on tmpfs")
def test_on_dev_shm_readers_serve_their_siblings_samples_mapped(servers, raw_client,
                                                               tmp_path) -> None:
    """The tier's files read as mappings (:mod:`dataflow.server.filemap`) serve the same
    values."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as disk:
        _decoded_about_once(servers, raw_client, tmp_path, Path(disk))


def _decoded_about_once(servers, raw_client, tmp_path: Path, disk: Path) -> None:
    shards = _shards(tmp_path)
    # Memory holds 3 samples a reader: without the shared files every epoch decodes again.
    server = servers(shards, workers=2, cwd=_module(tmp_path / "v1", 3, "1"),
                     extra_args=["--transform", "stagemod:STAGES", "--cache-memory",
                                 str(16 * 1024), "--cache-disk", str(disk)])
    for epoch in range(3):
        for seed, batch in ((3, 8), (4, 6)):
            assert _scaled(_epoch(server.endpoint, epoch, seed=seed, batch=batch), 3)
    stats = raw_client(server.endpoint).stats()
    # Every sample decoded once; a few more where both readers missed one at the same moment
    # (a loader reads its next epoch's first batches ahead while the last ones are served).
    assert SAMPLES <= stats["cache_misses"] <= SAMPLES + SAMPLES // 2
    assert stats["cache_disk_hits"] >= 4 * SAMPLES
    server.close(grace=10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plan", [[], ["--cache-plan-window", "24"]], ids=["lru", "plan"])
def test_under_concurrent_jobs_both_tiers_stay_in_their_bounds(servers, raw_client, tmp_path,
                                                               plan: list[str]) -> None:
    shards = _shards(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    memory, disk_bytes = 24 * 1024, 48 * 1024  # both far smaller than the decoded set
    server = servers(shards, workers=2, cwd=_module(tmp_path / "v1", 7, "1"),
                     extra_args=["--transform", "stagemod:STAGES", "--cache-memory", str(memory),
                                 "--cache-disk", str(disk), "--cache-disk-bytes",
                                 str(disk_bytes), *plan])
    run_dir = disk / f"dataflow-cache-{server.pid}"
    probe = raw_client(server.endpoint)
    done = threading.Event()
    seen: list[tuple[int, int, int]] = []

    def watch() -> None:
        while not done.is_set():
            stats = probe.stats()
            seen.append((stats["cache_bytes"], stats["cache_disk_bytes"], _files(run_dir)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = run_ranks(4, lambda j: [_epoch(server.endpoint, e, seed=j, batch=2 + j)
                                          for e in range(2)], timeout=90)
    finally:
        done.set()
        watcher.join()
    assert all(_scaled(got, 7) for job in results for got in job)
    assert len(seen) > 3
    assert all(m <= memory and d <= disk_bytes and f <= disk_bytes for m, d, f in seen), seen
    stats = probe.stats()
    assert stats["cache_evictions"] > 0 and stats["cache_disk_evictions"] > 0
    assert (stats["cache_announced"] > 0) == bool(plan)
