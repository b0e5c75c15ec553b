"""Plan-aware eviction through real servers (``--cache-plan-window``): what a REQUEST announces
in its ``ahead`` reaches the reader that evicts, a bad announcement is refused naming the field
and the server goes on, and jobs of different seeds, batch sizes and world sizes sharing a
cache smaller than the decoded set still see every sample once an epoch with the values an
uncached server gives.

Shards and the ``Stages`` module are those of :mod:`test_sample_cache`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from srvtools import RawClient, run_ranks, wait_for
from test_sample_cache import SAMPLES, _module, _shards

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.server.samplecache import sample_bytes

TWO = 2 * sample_bytes((("x", np.zeros((1,), np.int64), None),
                        ("pixels", np.zeros((1, 2048), np.uint8), None))) + 100
"""A reader's cache of two samples (not three)."""


def _session(raw_client: Callable[[str], RawClient],
             endpoint: str) -> tuple[RawClient, wire.Index]:
    client = raw_client(endpoint)
    index = client.call(wire.Hello(4, "plan test", batch_size=4))
    assert isinstance(index, wire.Index)
    return client, index


def _read(client: RawClient, req_id: int, row: int, ahead: list[list[int]]) -> None:
    reply = client.call(wire.Request(req_id, [[0, row, row + 1]], ahead=ahead))
    assert isinstance(reply, wire.BatchMsg) and reply.size == 1, reply


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", [0, 8])
def test_the_reader_keeps_what_the_session_announced_instead_of_the_least_recent(
        servers, raw_client, tmp_path, window: int) -> None:
    """A cache of two samples reads A, B, C, then A again, each request announcing A next:
    plan-aware eviction drops B for C and A hits; LRU drops A."""
    flags = ["--transform", "stagemod:STAGES", "--cache-memory", str(TWO)]
    server = servers(_shards(tmp_path), workers=1, cwd=_module(tmp_path / "v1", 3, "1"),
                     extra_args=[*flags, "--cache-plan-window", str(window)] if window
                     else flags)
    client, index = _session(raw_client, server.endpoint)
    assert index.ahead == window
    announce = [[0, 0, 1]] if window else []
    for req_id, row in enumerate((0, 1, 2)):
        _read(client, req_id, row, announce)
    wait_for(lambda: client.stats()["cache_misses"] == 3, 30, "three misses counted")
    _read(client, 3, 0, [])
    assert client.stats()["cache_announced"] == (3 if window else 0)
    expect = (1, 3, 1) if window else (0, 4, 2)  # hits, misses, evictions
    wait_for(lambda: (client.stats()["cache_hits"], client.stats()["cache_misses"],
                      client.stats()["cache_evictions"]) == expect, 30,
             f"(hits, misses, evictions) {expect}")


@pytest.mark.timeout(60)
def test_a_bad_announcement_is_refused_naming_it_and_the_server_goes_on(servers, raw_client,
                                                                        tmp_path) -> None:
    shards = _shards(tmp_path)
    flags = ["--transform", "stagemod:STAGES", "--cache-memory", "1M"]
    server = servers(shards, workers=1, cwd=_module(tmp_path / "v1", 3, "1"),
                     extra_args=[*flags, "--cache-plan-window", "4"])
    client, _ = _session(raw_client, server.endpoint)
    cases = [([[0, 0, 5]], "exceeds the server's --cache-plan-window 4"),
             ([[0, 0, 1]] * 5, "5 ranges exceeds"),
             ([[7, 0, 1]], "`ahead` range 0: shard 7 not in [0, 3)"),
             ([[0, 3, 3]], "`ahead` range 0: [3, 3) is empty or outside shard"),
             ([[1, 15, 17]], "outside shard")]
    for req_id, (ahead, message) in enumerate(cases):
        reply = client.call(wire.Request(req_id, [[0, 0, 1]], ahead=ahead))
        assert isinstance(reply, wire.ErrorMsg) and reply.req_id == req_id, reply
        assert message in reply.message, reply.message
    # frames that do not match the header: a protocol error, not a dead server
    frames = wire.encode(wire.Request(9, [[0, 0, 1]], ahead=[[0, 1, 2]]))
    client.send_raw([bytes(f) for f in frames[:-1]] + [bytes(frames[-1])[:-8]])
    reply = client.recv()
    assert isinstance(reply, wire.ErrorMsg) and reply.kind is wire.ErrorKind.PROTOCOL
    _read(client, 10, 0, [[0, 1, 3], [2, 0, 2]])  # repeats and several shards are fine
    uninterested = servers(shards, workers=1, cwd=_module(tmp_path / "v2", 3, "1"),
                           extra_args=flags)
    client, _ = _session(raw_client, uninterested.endpoint)
    reply = client.call(wire.Request(0, [[0, 0, 1]], ahead=[[0, 1, 2]]))
    assert isinstance(reply, wire.ErrorMsg) and "--cache-plan-window 0" in reply.message


JOBS = ((1, 4, 2), (2, 6, 1), (5, 3, 3))
"""(seed, batch size, world size) of the jobs sharing a cache."""


def _job(endpoint: str, seed: int, batch: int, world: int,
         epoch: int) -> tuple[dict[int, np.ndarray], list[int]]:
    """One epoch of a job: each sample's pixels (each sample at most once over its ranks) and
    the batches each rank read."""

    def rank(r: int) -> tuple[dict[int, np.ndarray], int]:
        out: dict[int, np.ndarray] = {}
        batches = 0
        with DataLoader(endpoint, batch_size=batch, rank=r, world_size=world, seed=seed,
                        timeout=60) as dl:
            dl.set_epoch(epoch)
            for b in dl:
                batches += 1
                for x, row in zip(b["x"].tolist(), b["pixels"].numpy(), strict=True):
                    assert x not in out, (seed, r, x)
                    out[x] = row.copy()
        return out, batches

    ranks = run_ranks(world, rank, timeout=90)
    merged: dict[int, np.ndarray] = {}
    for got, _ in ranks:
        assert not merged.keys() & got.keys(), (seed, world)  # no rank pads: 48 divides
        merged.update(got)
    return merged, [n for _, n in ranks]


@pytest.mark.timeout(150)
def test_jobs_sharing_a_small_plan_aware_cache_see_every_sample_once_with_uncached_values(
        servers, raw_client, tmp_path) -> None:
    shards = _shards(tmp_path)
    cwd = _module(tmp_path / "v1", 3, "1")
    memory = 12 * TWO  # two readers of 6 samples each; the decoded set is 48
    cached = servers(shards, workers=2, cwd=cwd,
                     extra_args=["--transform", "stagemod:STAGES", "--cache-memory", str(memory),
                                 "--cache-plan-window", "16"])
    plain = servers(shards, workers=1, cwd=cwd, extra_args=["--transform", "stagemod:STAGES"])
    for epoch in range(2):
        results = run_ranks(len(JOBS), lambda j, e=epoch: _job(cached.endpoint, *JOBS[j], e),
                            timeout=120)
        for (seed, batch, world), (got, batches) in zip(JOBS, results, strict=True):
            assert sorted(got) == list(range(SAMPLES))
            assert len(set(batches)) == 1, batches
            want, _ = _job(plain.endpoint, seed, batch, world, epoch)
            assert all(np.array_equal(got[x], want[x]) for x in range(SAMPLES)), (seed, epoch)
    stats = raw_client(cached.endpoint).stats()
    assert stats["cache_hits"] > 0 and stats["cache_evictions"] > 0
    assert stats["cache_bytes"] <= memory
    assert stats["cache_announced"] > 0
    assert raw_client(plain.endpoint).stats()["cache_announced"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bye", [True, False])
def test_a_freed_session_s_window_is_forgotten_by_the_readers(servers, raw_client, tmp_path,
                                                             bye: bool) -> None:
    """Session 1 announces A and leaves (BYE); session 2 then reads B, C, B in a cache of two:
    with session 1's window gone C evicts A (least recent) and B hits; while session 1 stays,
    A is kept for it and B misses."""
    server = servers(_shards(tmp_path), workers=1, cwd=_module(tmp_path / "v1", 3, "1"),
                     extra_args=["--transform", "stagemod:STAGES", "--cache-memory", str(TWO),
                                 "--cache-plan-window", "8"])
    first, _ = _session(raw_client, server.endpoint)
    _read(first, 0, 0, [[0, 0, 1]])
    second, _ = _session(raw_client, server.endpoint)
    if bye:
        first.send(wire.Bye())
        wait_for(lambda: second.stats()["clients"] == 1, 30, "session 1 freed")
    for req_id, row in enumerate((1, 2, 1)):
        _read(second, req_id, row, [])
    wait_for(lambda: second.stats()["cache_misses"] + second.stats()["cache_hits"] == 4, 30,
             "four lookups counted")
    assert second.stats()["cache_hits"] == (1 if bye else 0)
