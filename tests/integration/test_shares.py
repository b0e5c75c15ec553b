"""Requests shared over servers in proportion to capacity: three servers with equal readers
serve an epoch to a consumer slower than they are, each taking a third of the requests (their
own STATS count), every sample once (under the old rule, the fewest outstanding and the first
on a tie, the first server took most: idle servers all tie); a server whose every batch takes
50 ms more takes far fewer than an equal one beside it."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from srvtools import repo_env, server_stat, wait_for

from dataflow.client import DataLoader


@pytest.mark.timeout(120)
def test_servers_alike_take_equal_shares_of_an_epoch(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoints = [servers([str(p) for p in demo.paths], workers=2).endpoint for _ in range(3)]
    # one batch a request: the choice of server is per request, and an epoch of 346 batches
    # is enough requests to hold it to +-15% (runs of 8 would be 43)
    with DataLoader(endpoints, batch_size=1, rank=0, world_size=1, seed=3, prefetch=2,
                    timeout=30, batches_per_request=1) as dl:
        # the loader starts with the first server: an epoch begun before the others joined
        # would be theirs only in part
        wait_for(lambda: len(dl.server_readers) == 3, 30, "every server to join")
        assert dl.server_readers == (2, 2, 2)
        ids: Counter[int] = Counter()
        for batch in dl:
            ids.update(batch["id"].tolist())
            time.sleep(0.003)  # a training step: the servers wait for the consumer
    assert ids == Counter(range(demo.total))
    counts = [server_stat(e, "requests") for e in endpoints]
    mean = sum(counts) / 3
    assert sum(counts) >= demo.total  # the epoch (and the next one's start, read ahead)
    assert all(abs(c - mean) <= 0.15 * mean for c in counts), counts


SLOW = """
import time

def slow(batch):
    time.sleep(0.05)
    return batch
"""


@pytest.mark.timeout(120)
def test_a_slow_server_gets_less_than_an_equal_share(demo_data, servers, tmp_path) -> None:
    (tmp_path / "slowdown.py").write_text(SLOW)
    paths = [str(p) for p in demo_data("arrow").paths]
    fast = servers(paths, workers=2).endpoint
    slow = servers(paths, workers=2, env=repo_env(str(tmp_path)),
                   extra_args=["--transform", "slowdown:slow"]).endpoint
    with DataLoader([fast, slow], batch_size=1, rank=0, world_size=1, seed=3, prefetch=2,
                    timeout=30) as dl:
        wait_for(lambda: len(dl.server_readers) == 2, 30, "both servers to join")
        ids: Counter[int] = Counter()
        for batch in dl:
            ids.update(batch["id"].tolist())
    assert ids == Counter(range(demo_data("arrow").total))
    fast_count, slow_count = server_stat(fast, "requests"), server_stat(slow, "requests")
    assert slow_count <= 0.5 * fast_count, (fast_count, slow_count)


# each batch's reader writes when it began and ended (the system's monotonic clock)
SPANS = """
import os
import time


def span(batch):
    start = time.monotonic()
    time.sleep(0.2)
    with open(os.path.join(os.environ["SPANS_DIR"], str(os.getpid())), "a") as f:
        f.write(f"{start} {time.monotonic()}\\n")
    return batch
"""


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans that overlap at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.timeout(120)
def test_every_reader_of_a_server_works_at_once_with_the_default_prefetch(
        demo_data, servers, tmp_path) -> None:
    """6 readers taking 200 ms a batch, a loader's default ``prefetch`` (4): once the first
    batch told its size, the loader keeps a request at each reader (4 requests could never
    keep more than 4 at work)."""
    (tmp_path / "spans.py").write_text(SPANS)
    (tmp_path / "spans").mkdir()
    demo = demo_data("arrow")
    env = {**repo_env(str(tmp_path)), "SPANS_DIR": str(tmp_path / "spans")}
    srv = servers([str(p) for p in demo.paths], workers=6, env=env,
                  extra_args=["--transform", "spans:span"])
    with DataLoader(srv.endpoint, batch_size=16, rank=0, world_size=1, timeout=60) as dl:
        assert dl.server_readers == (6,)
        ids: Counter[int] = Counter()
        for batch in dl:
            ids.update(batch["id"].tolist())
    assert ids == Counter(range(demo.total))
    spans = [tuple(map(float, line.split())) for f in (tmp_path / "spans").iterdir()
             for line in f.read_text().splitlines()]
    assert _most_at_once(spans) == 6, sorted(spans)
