"""The transform API end to end: the JPEG example through real servers, reproducible crops.

Shards are real WebDataset tars of JPEGs written by Pillow through ``webdataset.ShardWriter``
(the example's own writer); servers are real processes; the transform module is found in the
server's start directory or ``--transform-path``, never through PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from srvtools import run_ranks

from dataflow.client import DataLoader

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BATCH = 4
SAMPLES = 32


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jpeg_crop", EXAMPLES / "jpeg_crop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return _example().write_shards(tmp_path_factory.mktemp("jpeg"), SAMPLES, per_shard=10)


def _epoch(endpoint: str, *, rank: int = 0, world: int = 1, epoch: int = 0,
           seed: int = 5, per_request: int | str = "auto",
           batch: int = BATCH) -> list[dict[str, np.ndarray]]:
    with DataLoader(endpoint, batch_size=batch, rank=rank, world_size=world, seed=seed,
                    drop_last=True, timeout=30, batches_per_request=per_request) as dl:
        dl.set_epoch(epoch)
        return [{k: v.numpy() for k, v in b.items()} for b in dl]


@pytest.mark.timeout(90)
def test_the_example_runs_end_to_end(tmp_path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "jpeg_crop.py"), "--out",
                          str(tmp_path), "--samples", "24", "--batch-size", "6"],
                         capture_output=True, text=True, timeout=80, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["samples"] == summary["distinct"] == 24
    assert summary["last_shape"] == [6, 32, 32, 3] and summary["dtype"] == "torch.uint8"


@pytest.mark.timeout(90)
def test_crops_are_the_same_for_a_batch_on_any_server_and_rank_split(jpeg_shards, servers,
                                                                     tmp_path) -> None:
    spec = ["--transform", "jpeg_crop:decode_crop"]
    one = servers(jpeg_shards, workers=1, extra_args=spec, cwd=EXAMPLES)
    two = servers(jpeg_shards, workers=2, cwd=tmp_path,
                  extra_args=[*spec, "--transform-path", str(EXAMPLES)])
    whole = _epoch(one.endpoint)
    ranks = [_epoch(two.endpoint, rank=r, world=2) for r in range(2)]
    assert len(whole) == SAMPLES // BATCH and all(len(r) == len(whole) // 2 for r in ranks)
    ids = sorted(i for b in whole for i in b["cls"].tolist())
    assert ids == list(range(SAMPLES))
    for g, batch in enumerate(whole):
        other = ranks[g % 2][g // 2]  # global batch g is batch g // 2 of rank g % 2
        assert batch["cls"].tolist() == other["cls"].tolist()
        assert batch["image"].shape == (BATCH, 32, 32, 3) and batch["image"].dtype == np.uint8
        np.testing.assert_array_equal(batch["image"], other["image"])
    # Same samples in another epoch or under another seed: other crops.
    again = _epoch(one.endpoint, epoch=1)
    reseeded = _epoch(one.endpoint, seed=6)
    for other_run in (again, reseeded):
        crops = {i: img.tobytes() for b in whole for i, img in
                 zip(b["cls"].tolist(), b["image"], strict=True)}
        moved = sum(crops[i] != img.tobytes() for b in other_run
                    for i, img in zip(b["cls"].tolist(), b["image"], strict=True))
        assert moved > SAMPLES // 2


@pytest.mark.timeout(90)
def test_crops_are_the_same_whatever_the_batches_a_request_carries(jpeg_shards,
                                                                    servers) -> None:
    """The transform runs on each batch of a request of several alone, seeded by its own tag:
    the same crops as requests of one batch, for every batch."""
    one = servers(jpeg_shards, workers=2, extra_args=["--transform", "jpeg_crop:decode_crop"],
                  cwd=EXAMPLES)
    alone = _epoch(one.endpoint, per_request=1)
    for per_request in (3, "auto"):
        got = _epoch(one.endpoint, per_request=per_request)
        assert [b["cls"].tolist() for b in got] == [b["cls"].tolist() for b in alone]
        for mine, theirs in zip(got, alone, strict=True):
            np.testing.assert_array_equal(mine["image"], theirs["image"])


@pytest.mark.timeout(90)
def test_an_epoch_read_ahead_gets_the_crops_of_its_own_epoch(jpeg_shards, servers) -> None:
    one = servers(jpeg_shards, workers=1, extra_args=["--transform", "jpeg_crop:decode_crop"],
                  cwd=EXAMPLES)
    with DataLoader(one.endpoint, batch_size=BATCH, rank=0, world_size=1, seed=5,
                    drop_last=True, timeout=30) as dl:
        epochs = [[{k: v.numpy() for k, v in b.items()} for b in dl] for _ in range(2)]
    for epoch, got in enumerate(epochs):
        cold = _epoch(one.endpoint, epoch=epoch)
        assert [b["cls"].tolist() for b in got] == [b["cls"].tolist() for b in cold]
        for mine, theirs in zip(got, cold, strict=True):
            np.testing.assert_array_equal(mine["image"], theirs["image"])


CACHED = ["--transform", "jpeg_crop:STAGES"]
JOBS = [(5, 4, 1), (6, 8, 2), (7, 2, 4)]
"""(seed, batch size, world size) of jobs on one dataset."""


def _job(endpoint: str, seed: int, batch: int, world: int, epoch: int = 0) -> list[list[dict]]:
    return run_ranks(world, lambda r: _epoch(endpoint, rank=r, world=world, seed=seed,
                                             batch=batch, epoch=epoch), timeout=60)


def _same(a: list[list[dict]], b: list[list[dict]]) -> None:
    assert [len(r) for r in a] == [len(r) for r in b] and len({len(r) for r in a}) == 1
    for mine, theirs in zip(a, b, strict=True):
        for x, y in zip(mine, theirs, strict=True):
            assert x["cls"].tolist() == y["cls"].tolist()
            np.testing.assert_array_equal(x["image"], y["image"])


@pytest.mark.timeout(120)
def test_jobs_of_any_seed_batch_and_world_share_the_cache_and_get_the_uncached_crops(
        jpeg_shards, servers, raw_client) -> None:
    plain = servers(jpeg_shards, workers=1, extra_args=["--transform", "jpeg_crop:decode_crop"],
                    cwd=EXAMPLES)
    cached = servers(jpeg_shards, workers=2, extra_args=[*CACHED, "--cache-memory", "64M"],
                     cwd=EXAMPLES)
    served = 0
    for seed, batch, world in JOBS:
        for epoch in (0, 1):
            got = _job(cached.endpoint, seed, batch, world, epoch)
            ids = sorted(i for rank in got for b in rank for i in b["cls"].tolist())
            assert ids == list(range(SAMPLES))  # every sample once per epoch
            _same(got, _job(plain.endpoint, seed, batch, world, epoch))
            served += SAMPLES
    stats = raw_client(cached.endpoint).stats()
    # Each of the 2 readers decodes a sample at most once; every other lookup is a hit (a
    # loader also reads the first batches of its next epoch ahead: more lookups than served).
    assert stats["cache_hits"] + stats["cache_misses"] >= served
    assert SAMPLES <= stats["cache_misses"] <= 2 * SAMPLES
    assert stats["cache_evictions"] == 0 and 0 < stats["cache_bytes"] <= 64 << 20


@pytest.mark.timeout(120)
def test_a_cache_smaller_than_the_decoded_set_holds_its_bound_and_serves_every_sample(
        jpeg_shards, servers, raw_client) -> None:
    bound = 48 * 1024  # the 32 decoded images take ~250 KiB; each of 2 readers gets 24 KiB
    cached = servers(jpeg_shards, workers=2, extra_args=[*CACHED, "--cache-memory", str(bound)],
                     cwd=EXAMPLES)
    plain = servers(jpeg_shards, workers=1, extra_args=["--transform", "jpeg_crop:decode_crop"],
                    cwd=EXAMPLES)
    probe = raw_client(cached.endpoint)
    for seed, batch, world in JOBS:
        got = _job(cached.endpoint, seed, batch, world)
        _same(got, _job(plain.endpoint, seed, batch, world))
        assert 0 < probe.stats()["cache_bytes"] <= bound
    stats = probe.stats()
    assert stats["cache_evictions"] > 0
    assert stats["cache_hits"] + stats["cache_misses"] >= len(JOBS) * SAMPLES


@pytest.mark.timeout(60)
def test_a_missing_transform_module_stops_the_server_naming_where_it_looked(
        jpeg_shards, servers, tmp_path) -> None:
    from dataflow.errors import ServerUnavailable

    with pytest.raises(ServerUnavailable, match=r"no module 'jpeg_crop' on sys.path or in "
                                                + str(tmp_path)):
        servers(jpeg_shards, cwd=tmp_path, extra_args=["--transform", "jpeg_crop:decode_crop"])


def _gappy_shards(root: Path) -> list[str]:
    """Two WebDataset shards of 10 samples; every fifth sample has no ``cls``."""
    import webdataset as wds

    paths = []
    for s in range(2):
        path = root / f"gappy-{s}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(s * 10, s * 10 + 10):
                sample = {"__key__": f"k/{i:04d}", "txt": f"t{i}"}
                if i % 5:
                    sample["cls"] = i
                w.write(sample)
        paths.append(str(path))
    return paths


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["skip", "fill"])
def test_key_field_and_missing_field_policies_through_a_server(servers, tmp_path,
                                                               policy) -> None:
    shards = _gappy_shards(tmp_path)
    server = servers(shards, extra_args=["--key-field", "--missing-field", policy])
    with DataLoader(server.endpoint, batch_size=3, rank=0, world_size=1, timeout=30) as dl:
        rows = []
        for b in dl:
            values, offsets = b["__key__"].numpy(), b["__key__.offsets"].tolist()
            keys = [values[offsets[i]:offsets[i + 1]].tobytes().decode()
                    for i in range(len(offsets) - 1)]
            rows.extend(zip(keys, b["cls"].tolist(), strict=True))
    kept = [i for i in range(20) if i % 5 or policy == "fill"]
    assert sorted(rows) == [(f"k/{i:04d}", i if i % 5 else -1) for i in kept]
