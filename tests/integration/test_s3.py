"""Shards on S3 (a moto server on loopback) served exactly once through real servers."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from srvtools import run_ranks

from dataflow.bench.experiments.s3local import CREDENTIALS, S3Proxy, moto_s3, s3_client
from dataflow.client import DataLoader
from dataflow.demo import DemoResult, DemoSpec, make_demo
from dataflow.errors import ServerUnavailable, SpecError
from dataflow.index.scan import build_index
from dataflow.server import launch
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import BLOCKS_DIR

WORLD = 2
BATCH = 8
BUCKET = "data"
LIMIT = 1 << 20


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A moto S3 endpoint with bucket :data:`BUCKET`."""
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        with moto_s3() as endpoint:
            s3_client(endpoint).create_bucket(Bucket=BUCKET)
            yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _upload(endpoint: str, root: str, prefix: str, spec: DemoSpec) -> DemoResult:
    demo = make_demo(root, spec, progress=None)
    client = s3_client(endpoint)
    for p in demo.paths:
        client.upload_file(str(p), BUCKET, f"{prefix}/{os.path.basename(p)}")
    return demo


def _epoch(endpoint: str) -> list[list[int]]:
    """Sample ids per rank of one epoch, ranks as concurrent threads."""

    def run(rank: int) -> list[int]:
        out: list[int] = []
        with DataLoader([endpoint], batch_size=BATCH, rank=rank, world_size=WORLD,
                        timeout=60, seed=3) as dl:
            for batch in dl:
                ids = batch["id"].numpy()
                image = batch["image"].numpy().reshape(len(ids), -1)
                want = (ids[:, None] + np.arange(image.shape[1])) % 256
                assert (image == want).all(), "image bytes do not match their ids"
                out.append(len(ids))
                out.extend(ids.tolist())
        return out

    return run_ranks(WORLD, run, 120)


def _check_exactly_once(per_rank: list[list[int]], total: int) -> None:
    """Every id once over the ranks, in equal numbers of full batches (``total`` is a
    multiple of ``WORLD * BATCH``)."""
    ids: list[int] = []
    for seq in per_rank:
        batches = 0
        i = 0
        while i < len(seq):
            assert seq[i] == BATCH
            ids.extend(seq[i + 1 : i + 1 + BATCH])
            i += 1 + BATCH
            batches += 1
        assert batches == total // (WORLD * BATCH)
    assert Counter(ids) == Counter(range(total))


def _args(endpoint: str, cache: str, *more: str) -> list[str]:
    return ["--storage-option", f"endpoint_url={endpoint}", "--cache-dir", cache, *more]


KINDS = [("arrow", "file"), ("arrow", "stream"), ("parquet", "file"), ("tar", "file")]


@pytest.mark.timeout(120)
def test_four_kinds_through_a_throttling_s3_exactly_once(s3: str, tmp_path) -> None:
    """Arrow file, Arrow stream, Parquet and tar shards in one dataset, behind a proxy that
    answers every third object GET with ``503 SlowDown``: every sample still arrives once,
    and the server counts its backoff.

    Shard k of an even demo holds ids ``[k * n, (k + 1) * n)`` whatever its format, so taking
    shard k of kind k keeps the ids unique.
    """
    client = s3_client(s3)
    total = 0
    for k, (fmt, kind) in enumerate(KINDS):
        spec = DemoSpec(fmt=fmt, shards=len(KINDS), samples_per_shard=32, uneven=False,
                        image_shape=(3, 8, 8), arrow_kind=kind)
        demo = make_demo(str(tmp_path / f"{fmt}-{kind}"), spec, progress=None)
        path = demo.paths[k]
        client.upload_file(str(path), BUCKET, f"mixed/{k}-{kind}-{os.path.basename(path)}")
        total += demo.sizes[k]
    with S3Proxy(s3, every=3) as proxy, launch(
            [f"s3://{BUCKET}/mixed/*"], workers=1, env=CREDENTIALS,
            extra_args=_args(proxy.endpoint, str(tmp_path / "cache"))) as server:
        _check_exactly_once(_epoch(server.endpoint), total)
        log = server.stderr_tail(100_000)
    assert proxy.throttled > 0
    m = re.search(r"remote reads while indexing: \{'retries': (\d+), 'backoff_s': [\d.]+, "
                  r"'throttles': (\d+)\}", log)
    assert m, log
    retries, throttles = map(int, m.groups())
    assert retries == throttles >= 1  # each 503 backed off and retried, none given up
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith((".copy", ".id"))]


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if not n.startswith("."))


@pytest.mark.timeout(120)
def test_cache_never_exceeds_its_limit_on_disk(s3: str, tmp_path) -> None:
    spec = DemoSpec(fmt="tar", shards=2, samples_per_shard=96, uneven=False,
                    image_shape=(3, 64, 64))
    demo = _upload(s3, str(tmp_path / "src"), "big", spec)
    assert sum(os.path.getsize(p) for p in demo.paths) > 2 * LIMIT
    blocks = tmp_path / "cache" / BLOCKS_DIR
    seen: list[int] = []
    with launch([f"s3://{BUCKET}/big/*"], workers=1, env=CREDENTIALS,
                extra_args=_args(s3, str(tmp_path / "cache"), "--cache-size", "1M")) as server:
        seen.append(_disk_bytes(str(blocks)))
        ids: list[int] = []
        with DataLoader([server.endpoint], batch_size=BATCH, rank=0, world_size=1,
                        timeout=60, shuffle=False) as dl:
            for batch in dl:
                ids.extend(batch["id"].tolist())
                seen.append(_disk_bytes(str(blocks)))
    assert sorted(ids) == list(range(demo.total))
    assert 0 < max(seen) <= LIMIT


def _refused(data: str, endpoint: str, tmp_path) -> str:
    with pytest.raises(ServerUnavailable) as e:
        launch([data], workers=1, env=CREDENTIALS, timeout=60,
               extra_args=_args(endpoint, str(tmp_path / "cache")))
    return str(e.value)


@pytest.mark.timeout(90)
def test_wrong_endpoint_is_one_line_naming_it(s3: str, tmp_path) -> None:
    wrong = "http://127.0.0.1:9"  # discard port: nothing listens
    text = _refused(f"s3://{BUCKET}/x/*.tar", wrong, tmp_path)
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot connect to {wrong}" in errors[0]
    assert "Traceback" not in text


@pytest.mark.timeout(60)
def test_missing_bucket_is_one_line_naming_it(s3: str, tmp_path) -> None:
    with pytest.raises(SpecError) as e:
        build_index("s3://no-such-bucket/*.tar", cache_dir=str(tmp_path),
                    remote=RemoteConfig.of({"endpoint_url": s3}))
    assert "bucket 'no-such-bucket' does not exist at " + s3 in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.timeout(60)
def test_missing_credentials_is_one_line(s3: str, tmp_path, monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookups
    remote = RemoteConfig.of({"endpoint_url": s3, "skip_instance_cache": True})
    with pytest.raises(SpecError) as e:
        build_index(f"s3://{BUCKET}/*.tar", cache_dir=str(tmp_path), remote=remote)
    assert f"access denied at {s3}: check the credentials" in str(e.value)
    assert "\n" not in str(e.value)
