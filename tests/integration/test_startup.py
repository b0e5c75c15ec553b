"""A restarted server takes its dataset index from the cache, says so, and still serves every
sample exactly once; a changed shard makes it rebuild."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest
from srvtools import wait_for

from dataflow.client import DataLoader

BATCH = 16


def _epoch(endpoint: str) -> Counter:
    with DataLoader([endpoint], batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=30) as dl:
        return Counter(i for batch in dl for i in batch["id"].tolist())


def _start(servers, shards: list[str], cache: str, want: str):
    handle = servers(shards, extra_args=["--cache-dir", cache])
    assert handle.ready["index_cache"] == want
    line = f"shards, {handle.ready['samples']} samples, index cache {want})"
    wait_for(lambda: line in handle.stderr_tail(), 30, f"the log line {line!r}")
    return handle


@pytest.mark.timeout(120)
def test_restart_uses_the_index_cache(demo_data, servers, tmp_path) -> None:
    demo = demo_data("tar")
    os.mkdir(tmp_path / "data")
    shards = [shutil.copy2(p, tmp_path / "data") for p in demo.paths]  # one is touched below
    cache = str(tmp_path / "cache")
    everything = Counter(range(demo.total))

    first = _start(servers, shards, cache, "miss")
    assert "index cache miss: no cache file" in first.stderr_tail()
    assert _epoch(first.endpoint) == everything
    first.close()

    second = _start(servers, shards, cache, "hit")
    assert second.ready["fingerprint"] == first.ready["fingerprint"]
    assert second.ready["samples"] == demo.total
    assert _epoch(second.endpoint) == everything
    second.close()

    st = os.stat(shards[3])
    os.utime(shards[3], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = _start(servers, shards, cache, "miss")
    assert f"1 of {len(shards)} shard(s) changed" in third.stderr_tail()
    assert third.ready["fingerprint"] != first.ready["fingerprint"]
    assert _epoch(third.endpoint) == everything
