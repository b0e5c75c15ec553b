"""Distributed on one machine: N server hosts and M trainer hosts as network namespaces on a
bridge (:func:`netns.network`), each trainer a real process running the DataLoader with its
rank, counting sample ids over an epoch: every sample exactly once across ranks and the same
number of batches on every rank; servers named by a static list (``DATAFLOW_SERVERS``) and by a
DNS name (the test's own resolver: the hosts' ``/etc/hosts``), with a server's link cut
mid-epoch, and servers joining and leaving mid-epoch.

Trainers pause at fixed batches (printing ``paused``) until the test says ``go`` on their
stdin, so each fault happens mid-epoch on every rank whatever the load; while a trainer
pauses its I/O thread runs on (lookups, joins, leaves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from netns import Host, Network, network, servers_on, unavailable
from srvtools import repo_env

PORT = 5555
RANKS = 2
BATCH = 5  # 420 demo samples: 42 batches per rank, no padding
NAME = "loader.test"
SLOW = '''
import time

def slow(batch):
    time.sleep(0.03)
    return batch
'''

TRAINER = textwrap.dedent(f"""
    import json, sys, time
    from dataflow.client import DataLoader

    rank, world = int(sys.argv[1]), int(sys.argv[2])
    pauses = dict(item.split("=") for item in sys.argv[3].split(","))  # batch -> counter
    servers = sys.argv[4] if len(sys.argv) > 4 else None  # else DATAFLOW_SERVERS
    # two batches a request: every server still holds requests when a trainer pauses
    with DataLoader(servers, batch_size={BATCH}, rank=rank, world_size=world, seed=3, prefetch=2,
                    timeout=30, grace=1.0, resolve_interval=0.2, batches_per_request=2) as dl:
        batches = []
        for i, batch in enumerate(dl):
            batches.append(batch["id"].tolist())
            wait = pauses.get(str(i))
            if wait is not None:
                print("paused", flush=True)
                assert sys.stdin.readline().strip() == "go"
                deadline = time.monotonic() + 60
                while wait and dl.stats()[wait] < 1:  # the I/O thread sees the change
                    assert time.monotonic() < deadline, dl.stats()
                    time.sleep(0.05)
        out = {{"len": len(dl), "batches": batches, "stats": dl.stats()}}
    print("done", json.dumps(out), flush=True)
""")


def _skip_without_namespaces() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


class _Trainers:
    """One trainer process per host, rank = position."""

    def __init__(self, hosts: Sequence[Host], pauses: str, servers: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.procs = [subprocess.Popen(
            h.exec_args([sys.executable, "-c", TRAINER, str(rank), str(len(hosts)), pauses,
                         *servers]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env) for rank, h in enumerate(hosts)]

    def wait_paused(self) -> None:
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # bounded by the test's timeout
            assert line == "paused\n", (line, self._stderr(p))

    def go(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()

    def results(self) -> list[dict]:
        out = []
        for p in self.procs:
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, stderr[-4000:]
            out.append(json.loads(stdout.split("done ", 1)[1]))
        return out

    @staticmethod
    def _stderr(p: subprocess.Popen) -> str:
        p.kill()
        return p.communicate()[1][-4000:]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def _replies(host: Host, endpoint: str) -> int:
    """Batches ``endpoint`` served (its STATS, asked from ``host``)."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); from srvtools import RawClient; "
             "c = RawClient(sys.argv[2]); print(c.stats()['replies']); c.close()")
    out = subprocess.run(host.exec_args([sys.executable, "-c", probe, os.path.dirname(__file__),
                                         endpoint]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-4000:]
    return int(out.stdout)


def _check_exactly_once(results: list[dict], total: int) -> None:
    counts = [len(r["batches"]) for r in results]
    assert counts == [results[0]["len"]] * len(results), counts  # equal batches per rank
    ids = sorted(i for r in results for batch in r["batches"] for i in batch)
    assert ids == list(range(total)), "not every sample exactly once"


@dataclass(frozen=True)
class Cluster:
    """A loader server on each of ``servers`` (at ``endpoints``), and hosts for ``trainers``."""

    net: Network
    servers: tuple[Host, ...]
    endpoints: tuple[str, ...]
    trainers: tuple[Host, ...]
    total: int


@pytest.fixture(scope="module")
def cluster(demo_data, tmp_path_factory) -> Iterator[Cluster]:
    """3 server hosts and 2 trainer hosts on one bridge (shared by this module's tests: each
    leaves the servers as it found them)."""
    _skip_without_namespaces()
    demo = demo_data("arrow")
    code = tmp_path_factory.mktemp("transform")
    (code / "slow_transform.py").write_text(SLOW)
    with network(3 + RANKS) as net:
        servers = net.hosts[:3]
        with servers_on(servers, [str(p) for p in demo.paths], PORT,
                        ["--transform", "slow_transform:slow"], repo_env(str(code))) as endpoints:
            yield Cluster(net, servers, tuple(endpoints), net.hosts[3:], demo.total)


@pytest.mark.timeout(120)
def test_static_list_with_a_server_link_cut_mid_epoch(cluster) -> None:
    env = {**os.environ, "DATAFLOW_SERVERS": ",".join(cluster.endpoints)}
    run = _Trainers(cluster.trainers, "4=", env=env)
    try:
        run.wait_paused()
        cluster.net.cut(cluster.servers[2])
        run.go()
        results = run.results()
    finally:
        run.close()
        cluster.net.mend(cluster.servers[2])
    _check_exactly_once(results, cluster.total)
    for r in results:
        assert r["stats"]["rerequested"] >= 1 and r["stats"]["recovered"] >= 1, r["stats"]


@pytest.mark.timeout(120)
def test_dns_name_with_servers_joining_and_leaving_mid_epoch(cluster) -> None:
    net, servers = cluster.net, cluster.servers
    net.set_names({NAME: servers[:2]})
    before = _replies(cluster.trainers[0], cluster.endpoints[2])
    run = _Trainers(cluster.trainers, "4=joined,12=left", [f"dns+tcp://{NAME}:{PORT}"])
    try:
        run.wait_paused()
        net.set_names({NAME: servers})  # a third server joins
        run.go()
        run.wait_paused()
        net.set_names({NAME: servers[1:]})  # the first leaves
        run.go()
        results = run.results()
    finally:
        run.close()
    _check_exactly_once(results, cluster.total)
    assert _replies(cluster.trainers[0], cluster.endpoints[2]) > before  # the joined one served
    for r in results:
        stats = r["stats"]
        # The third server joined mid-epoch; the second of the first two may also have joined
        # after the loader started with the first (a loaded machine), which `joined` counts.
        assert 1 <= stats["joined"] <= 2 and stats["left"] == 1, stats
        assert stats["servers_lost"] == 0, stats
