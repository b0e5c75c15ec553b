"""Discovery on loopback: a file registry whose servers join and leave mid-epoch, sample-exact
(``shuffle=False``: every sample once, in plan order). ``DATAFLOW_SERVERS`` and DNS names are
tested across hosts in test_multihost.py."""

from __future__ import annotations

import os

import pytest
from srvtools import RawClient, repo_env, wait_for

from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable

SLOW = '''
import time

def slow(batch):
    time.sleep(0.05)
    return batch
'''


def _count(endpoint: str, name: str = "replies") -> int:
    c = RawClient(endpoint)
    try:
        return int(c.stats()[name])
    finally:
        c.close()


def _publish(reg, text: str) -> None:
    """Replace the registry file at once, as docs/deploy.md asks: a lookup that read a file
    being rewritten in place could find it empty, and a member it finds missing while it is
    lost by the liveness rules leaves at once."""
    tmp = reg.with_name(reg.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, reg)


@pytest.mark.timeout(60)
def test_registry_file_with_no_server_fails_after_the_timeout(tmp_path) -> None:
    reg = tmp_path / "servers.txt"
    reg.write_text("# no server yet\n")
    with pytest.raises(ServerUnavailable, match=f"file://{reg}: no server found within 1.5 s"):
        DataLoader(f"file://{reg}", batch_size=8, rank=0, world_size=1, timeout=1.5)


@pytest.mark.timeout(90)
def test_registry_servers_join_and_leave_mid_epoch(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    (tmp_path / "slow_transform.py").write_text(SLOW)
    kw = dict(env=repo_env(str(tmp_path)), extra_args=["--transform", "slow_transform:slow"])
    a = servers([str(p) for p in demo.paths], **kw)
    b = servers([str(p) for p in demo.paths], **kw)
    reg = tmp_path / "servers.txt"
    reg.write_text(f"{a.endpoint}\n")
    with DataLoader(f"file://{reg}", batch_size=4, rank=0, world_size=1, shuffle=False,
                    prefetch=2, timeout=20, resolve_interval=0.2) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        _publish(reg, f"{a.endpoint}\n{b.endpoint}\n")
        wait_for(lambda: dl.stats()["joined"] == 1, 30, "b to join")
        ids += [i for _ in range(3) for i in next(it)["id"].tolist()]
        _publish(reg, f"{b.endpoint}\n")
        wait_for(lambda: dl.stats()["left"] == 1, 30, "a to leave")
        asked_of_a = _count(a.endpoint, "requests")
        ids += [i for batch in it for i in batch["id"].tolist()]
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["joined"] == 1 and stats["left"] == 1 and stats["servers_lost"] == 0, stats
    assert _count(b.endpoint) > 0
    assert _count(a.endpoint, "requests") == asked_of_a  # nothing asked of it after it left
