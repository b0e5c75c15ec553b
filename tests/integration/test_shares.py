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



# each call waits (up to 1 s) for as many calls as there are readers to be under way at once,
# and writes down the most it saw: it waits on overlap instead of hoping for it, so a loaded
# machine's slow dispatch cannot hide it
MEET = """
import os
import time


def meet(batch):
    where, readers = os.environ["MEET_DIR"], int(os.environ["MEET_READERS"])
    me = os.path.join(where, f"in-{os.getpid()}")
    open(me, "w").close()
    deadline, most = time.monotonic() + 1.0, 0
    while True:
        most = max(most, sum(name.startswith("in-") for name in os.listdir(where)))
        if most >= readers or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    os.remove(me)
    with open(os.path.join(where, f"most-{os.getpid()}"), "a") as f:
        f.write(f"{most}\\n")
    return batch
"""


@pytest.mark.timeout(120)
def test_every_reader_of_a_server_works_at_once_each_into_shared_memory(
        demo_data, servers, tmp_path) -> None:
    """6 readers and a loader of ``prefetch`` 1: once the first batch told its size, the loader
    keeps a request at each reader (a request could never keep more than one at work), and
    each of them lends a slot of the same-host segment: every batch lands in shared memory. A
    batch a request, so that a run of several does not keep one reader busy."""
    (tmp_path / "meet.py").write_text(MEET)
    (tmp_path / "met").mkdir()
    demo = demo_data("arrow")
    env = {**repo_env(str(tmp_path)), "MEET_DIR": str(tmp_path / "met"), "MEET_READERS": "6"}
    srv = servers([str(p) for p in demo.paths], workers=6, env=env,
                  extra_args=["--transform", "meet:meet"])
    with DataLoader(srv.endpoint, batch_size=16, rank=0, world_size=1, timeout=60,
                    prefetch=1, batches_per_request=1, read_ahead=False) as dl:
        assert dl.server_readers == (6,)
        ids: Counter[int] = Counter()
        for batch in dl:
            ids.update(batch["id"].tolist())
        stats = dl.stats()
    assert ids == Counter(range(demo.total))
    assert stats["shm_sessions"] == 1
    assert stats["shm_batches"] == stats["delivered"] == -(-demo.total // 16), stats
    most = [int(line) for f in (tmp_path / "met").glob("most-*")
            for line in f.read_text().split()]
    assert max(most) == 6, most
