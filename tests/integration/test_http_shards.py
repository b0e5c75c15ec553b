"""Shards served over HTTP (fsspec) by a real loopback web server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardReadError
from dataflow.index.scan import build_index
from dataflow.readers import open_shard
from dataflow.server import launch
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import BLOCK_BYTES


@pytest.fixture
def web_root(tmp_path) -> Iterator[tuple[str, str]]:
    """(directory served, base URL) of an http.server on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "http.server did not start"
                time.sleep(0.05)
        yield str(root), f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["arrow", "tar", "parquet"])
def test_http_shards_read_like_local_ones(fmt: str, web_root, tmp_path) -> None:
    root, base = web_root
    demo = make_demo(root, DemoSpec(fmt=fmt, shards=2, samples_per_shard=20,
                                    image_shape=(2, 3)), progress=None)
    urls = [f"{base}/{os.path.basename(p)}" for p in demo.paths]
    cache = str(tmp_path / "cache")
    index = build_index(urls, cache_dir=cache)
    assert index.shards == tuple(urls) and index.sizes == tuple(demo.sizes)
    for url, path in zip(urls, demo.paths, strict=True):
        with open_shard(url, cache_dir=cache) as remote, open_shard(str(path)) as local:
            a, b = remote.read(3, 11), local.read(3, 11)
            np.testing.assert_array_equal(a["id"], b["id"])
            np.testing.assert_array_equal(a["image"], b["image"])


@pytest.mark.timeout(60)
def test_missing_http_shard_names_the_url(web_root, tmp_path) -> None:
    _, base = web_root
    with pytest.raises(ShardReadError, match="nope.arrow"):
        open_shard(f"{base}/nope.arrow", cache_dir=str(tmp_path / "cache"))


@pytest.mark.timeout(90)
def test_server_without_range_support_serves_every_sample_once(web_root, tmp_path) -> None:
    """``http.server`` ignores ``Range`` (it answers 200 with the whole file): each shard
    (more than one cache block) is fetched whole once into the cache, with a warning, and
    served exactly once."""
    root, base = web_root
    demo = make_demo(root, DemoSpec(fmt="tar", shards=2, samples_per_shard=96, uneven=False,
                                    image_shape=(3, 64, 64)), progress=None)
    assert min(os.path.getsize(p) for p in demo.paths) > BLOCK_BYTES
    urls = [f"{base}/{os.path.basename(p)}" for p in demo.paths]
    with launch(urls, workers=1, extra_args=["--cache-dir", str(tmp_path / "cache")]) as server:
        ids: list[int] = []
        with DataLoader([server.endpoint], batch_size=32, rank=0, world_size=1,
                        timeout=60) as dl:
            for batch in dl:
                ids.extend(batch["id"].tolist())
        log = server.stderr_tail(100_000)
    assert sorted(ids) == list(range(demo.total))
    warnings = [line for line in log.splitlines() if "ignores HTTP Range requests" in line]
    assert warnings and all("fetching the whole file" in w for w in warnings)


@pytest.mark.timeout(60)
def test_whole_file_larger_than_the_cache_is_refused_naming_the_flag(web_root,
                                                                     tmp_path) -> None:
    root, base = web_root
    with open(os.path.join(root, "big.tar"), "wb") as f:
        f.write(b"\0" * (3 << 20))
    with pytest.raises(ShardReadError, match=r"big.tar.*--cache-size is 2097152 bytes"):
        open_shard(f"{base}/big.tar", cache_dir=str(tmp_path / "cache"),
                   remote=RemoteConfig(cache_bytes=2 << 20))
