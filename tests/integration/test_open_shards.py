"""Each reader keeps every shard of the dataset open by default (``--max-open-shards auto``),
or as many as given, the least recently used closed first: counted in a real reader's open
descriptors after an epoch of the default shuffle, which reads every shard."""

from __future__ import annotations

import os
import resource

import pytest
from srvtools import wait_for

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo

SHARDS = 40


def _open_shards(pid: int, root: str) -> set[str]:
    """The shard files process ``pid`` holds open."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith(root) and target.endswith((".tar", ".arrow")):
            held.add(target)
    return held


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fmt", "flag"), [("tar", None), ("arrow", None), ("tar", "8")])
def test_readers_keep_every_shard_open_unless_told_fewer(tmp_path, servers, fmt: str,
                                                          flag: str | None) -> None:
    root = str(tmp_path / fmt)
    demo = make_demo(root, DemoSpec(fmt=fmt, shards=SHARDS, samples_per_shard=4,
                                    image_shape=(1, 2, 2), uneven=False), progress=None)
    extra = [] if flag is None else ["--max-open-shards", flag]
    server = servers([root], extra_args=extra)
    if flag is None:  # logged before the ready line
        assert f"each reader keeps up to {SHARDS} of the {SHARDS} shard(s) open" in \
            server.stderr_tail()
        assert "reopen shards for every batch" not in server.stderr_tail()
    else:
        assert f"give --max-open-shards {SHARDS}" in server.stderr_tail()
    ids = []
    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=60) as loader:
        for batch in loader:
            ids += batch["id"].tolist()
    assert sorted(ids) == sorted(range(len(ids))) and len(ids) == demo.total
    if flag is None:
        assert len(_open_shards(server.ready["worker_pids"][0], os.path.realpath(root))) == SHARDS
    else:  # a shard closed while a reply still views its map is closed when the view goes
        wait_for(lambda: 1 <= len(_open_shards(server.ready["worker_pids"][0],
                                               os.path.realpath(root))) <= int(flag), 10,
                 f"at most {flag} shards open")


@pytest.mark.timeout(180)
def test_a_thousand_shards_are_served_whole_under_the_usual_soft_limit_of_1024(
        tmp_path, servers) -> None:
    """A shard held open costs two descriptors (its guard's and its map's): with the usual soft
    limit of 1,024, a server that raised it for one a shard ran out of descriptors mid-epoch
    ("Too many open files") on a dataset of 1,024 shards."""
    root = str(tmp_path / "tar")
    demo = make_demo(root, DemoSpec(fmt="tar", shards=1024, samples_per_shard=2,
                                    image_shape=(1, 1, 1), uneven=False), progress=None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the open-file hard limit {hard} is below what 1,024 shards need")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # the server inherits it
    try:
        server = servers([root], timeout=120)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    ids = []
    with DataLoader(server.endpoint, batch_size=256, rank=0, world_size=1,
                    timeout=60) as loader:
        for batch in loader:
            ids += batch["id"].tolist()
    assert sorted(ids) == list(range(demo.total))
    assert len(_open_shards(server.ready["worker_pids"][0], os.path.realpath(root))) == 1024
