"""Failover: an epoch survives servers killed, stopped, restarted and cut off, sample-exact.

Every test reads a whole epoch with ``shuffle=False``, so "exact" is ``ids == range(total)``:
every sample once, in plan order. The servers run a transform that sleeps per batch; where a
test needs the victim to hold requests when it dies (a server that answered everything would
leave nothing to re-request), the victim is the slower one: the bottleneck always holds its
credits' worth of requests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from netns import server_in, unavailable, veth_pair
from srvtools import repo_env, server_stat, write_damaged_parquet

from dataflow.client import DataLoader
from dataflow.errors import RequestTimeout, ServerUnavailable

SLOW = '''
import os, time

def slow(batch):
    time.sleep(float(os.environ["SLOW_S"]))
    return batch
'''
BEFORE_FAULT = 5  # batches taken before the fault


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slow_server(servers, demo, tmp_path, delay: float = 0.05, **kw):
    """A server taking ``delay`` seconds more per batch."""
    (tmp_path / "slow_transform.py").write_text(SLOW)
    return servers([str(p) for p in demo.paths], env={**repo_env(str(tmp_path)),
                                                      "SLOW_S": str(delay)},
                   extra_args=["--transform", "slow_transform:slow"], **kw)


def _loader(endpoints, **kw) -> DataLoader:
    kw = {"batch_size": 4, "rank": 0, "world_size": 1, "shuffle": False, "prefetch": 2,
          "timeout": 20, **kw}
    return DataLoader(endpoints, **kw)


@pytest.mark.timeout(90)
def test_killed_server_loses_nothing(demo_data, servers, tmp_path, record_property) -> None:
    demo = demo_data("arrow")
    a = _slow_server(servers, demo, tmp_path, delay=0.02)
    b = _slow_server(servers, demo, tmp_path, delay=0.3)
    with _loader([a.endpoint, b.endpoint]) as dl:
        it = iter(dl)
        ids = [i for _ in range(BEFORE_FAULT) for i in next(it)["id"].tolist()]
        os.kill(b.pid, signal.SIGKILL)
        killed = time.monotonic()
        recovered_s = None
        for batch in it:
            ids += batch["id"].tolist()
            if recovered_s is None and dl.stats()["recovered"]:
                recovered_s = time.monotonic() - killed
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["rerequested"] >= 1 and stats["recovered"] >= 1, stats
    assert recovered_s is not None and recovered_s < 5
    record_property("kill_to_first_rerequested_batch_s", round(recovered_s, 3))
    print(f"\nkill -> first re-requested batch received: {recovered_s:.3f} s; {stats}")


@pytest.mark.timeout(120)
def test_restarted_server_joins_again_and_serves(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    bind = f"tcp://127.0.0.1:{_free_port()}"
    a = _slow_server(servers, demo, tmp_path, bind=bind)
    b = _slow_server(servers, demo, tmp_path)
    with _loader([bind, b.endpoint]) as dl:
        it = iter(dl)
        ids = [i for _ in range(BEFORE_FAULT) for i in next(it)["id"].tolist()]
        os.kill(a.pid, signal.SIGKILL)
        a.close(grace=5)
        again = _slow_server(servers, demo, tmp_path, bind=bind)
        deadline = time.monotonic() + 30
        while dl.stats()["rejoined"] == 0:  # the consumer waits; the I/O thread rejoins
            assert time.monotonic() < deadline, dl.stats()
            time.sleep(0.05)
        for batch in it:
            ids += batch["id"].tolist()
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["servers_lost"] == 1 and stats["rejoined"] == 1, stats
    assert server_stat(again.endpoint, "replies") > 0


@pytest.mark.timeout(90)
def test_stopped_server_loses_nothing(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    a, b = _slow_server(servers, demo, tmp_path), _slow_server(servers, demo, tmp_path)
    with _loader([a.endpoint, b.endpoint]) as dl:
        it = iter(dl)
        ids = [i for _ in range(BEFORE_FAULT) for i in next(it)["id"].tolist()]
        os.kill(a.pid, signal.SIGTERM)
        for batch in it:
            ids += batch["id"].tolist()
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["servers_lost"] == 1, stats  # ServerStopping: lost at once, no grace


@pytest.mark.timeout(60)
def test_all_servers_dead_gives_server_unavailable_within_timeout(demo_data, servers,
                                                                  tmp_path) -> None:
    demo = demo_data("arrow")
    a, b = _slow_server(servers, demo, tmp_path), _slow_server(servers, demo, tmp_path)
    with _loader([a.endpoint, b.endpoint], timeout=2, grace=30) as dl:
        it = iter(dl)
        next(it)
        os.kill(a.pid, signal.SIGKILL)
        os.kill(b.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ServerUnavailable) as info:
            for _ in it:
                pass
        waited = time.monotonic() - start
    assert a.endpoint in str(info.value) and b.endpoint in str(info.value)
    assert "no server usable for" in str(info.value)
    assert 2 <= waited < 6


_TRAINER = textwrap.dedent("""
    import json, sys, time
    from dataflow.client import DataLoader

    with DataLoader(sys.argv[1], batch_size=4, rank=0, world_size=1, shuffle=False,
                    prefetch=2, timeout=30, grace=float(sys.argv[2])) as dl:
        ids, gaps, last = [], [], time.monotonic()
        for i, batch in enumerate(dl):
            ids += batch["id"].tolist()
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            print("batch", i, flush=True)
            time.sleep(0.02)
        print("done", json.dumps({"ids": ids, "max_gap": max(gaps), **dl.stats()}), flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cut_s", [1.5, 5.0])
def test_network_cut_shorter_than_grace_loses_nothing(demo_data, tmp_path, cut_s: float,
                                                      record_property) -> None:
    """A cut shorter than the ZMTP heartbeat timeout (1.5 s: the TCP connections survive) and
    a longer one (5 s: they are dropped and made again, the session kept)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    demo = demo_data("arrow")
    with veth_pair() as pair, server_in(pair, [str(p) for p in demo.paths], 5555) as endpoint:
        trainer = subprocess.Popen(
            pair.exec_args(pair.client, [sys.executable, "-c", _TRAINER, endpoint, "10"]),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert trainer.stdout is not None
            for line in trainer.stdout:  # bounded by the test's timeout
                if line.startswith(f"batch {BEFORE_FAULT}"):
                    break
            pair.cut()
            time.sleep(cut_s)
            pair.mend()
            out, err = trainer.communicate(timeout=60)
        finally:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 0, err[-4000:]
    result = json.loads(out.split("done ", 1)[1])
    assert result["ids"] == list(range(demo.total))
    assert result["servers_lost"] == 0, result
    record_property("max_batch_gap_s", round(result["max_gap"], 3))
    print(f"\ncut {cut_s} s: longest wait for a batch {result['max_gap']:.2f} s; "
          f"{ {k: v for k, v in result.items() if k != 'ids'} }")


@pytest.mark.timeout(60)
def test_skipped_samples_are_counted(servers, tmp_path) -> None:
    """``--on-error skip``: a damaged row group (10 rows) is left out; batches are short and
    ``size + skipped`` adds up to each request."""
    path = str(tmp_path / "p.parquet")
    write_damaged_parquet(path)
    server = servers([path], extra_args=["--on-error", "skip"])
    with _loader(server.endpoint, batch_size=8) as dl:
        xs = [x for batch in dl for x in batch["x"].tolist()]
        stats = dl.stats()
    assert xs == [i for i in range(60) if not 20 <= i < 30]
    assert stats["skipped"] == 10


STUCK = '''
import os, time

def stuck(batch, ctx):
    if ctx.epoch == 0 and int(os.environ["STUCK_FROM"]) <= ctx.batch_index < int(
            os.environ["STUCK_UNTIL"]):
        time.sleep(float(os.environ["STUCK_S"]))
    return batch
'''


def _stuck_server(servers, demo, tmp_path, stuck_from: int, stuck_s: float = 6.0,
                  stuck_until: int = 10**6, workers: int = 1):
    """A server whose transform sleeps ``stuck_s`` on batches ``stuck_from`` to
    ``stuck_until`` of epoch 0 (never, for a ``stuck_from`` past the epoch)."""
    (tmp_path / "stuck_transform.py").write_text(STUCK)
    return servers([str(p) for p in demo.paths], workers=workers,
                   env={**repo_env(str(tmp_path)), "STUCK_FROM": str(stuck_from),
                        "STUCK_UNTIL": str(stuck_until), "STUCK_S": str(stuck_s)},
                   extra_args=["--transform", "stuck_transform:stuck"])


@pytest.mark.timeout(90)
def test_a_request_past_request_timeout_is_asked_of_another_server(demo_data, servers,
                                                                   tmp_path) -> None:
    demo = demo_data("arrow")
    stuck = _stuck_server(servers, demo, tmp_path, stuck_from=2, stuck_s=15.0)
    fine = _stuck_server(servers, demo, tmp_path, stuck_from=10**6)
    # the stuck server is server 0: it wins ties, so it is asked for some batch >= 2
    with _loader([stuck.endpoint, fine.endpoint], request_timeout=5) as dl:
        ids = [i for batch in dl for i in batch["id"].tolist()]
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["late"] >= 1 and stats["rerequested"] >= 1, stats
    assert stats["servers_lost"] == 0, stats  # a late request is no sign of a dead server


@pytest.mark.timeout(90)
def test_a_request_no_other_server_can_take_fails_naming_server_batch_and_transform(
        demo_data, servers, tmp_path) -> None:
    """The issue's case: a transform stuck on one batch, and ``timeout`` (which the request
    timeout defaults to) far shorter: the loop gets an error where it reaches the batch."""
    demo = demo_data("arrow")
    server = _stuck_server(servers, demo, tmp_path, stuck_from=3, stuck_s=30.0)
    with _loader(server.endpoint, timeout=5, batches_per_request=1) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        with pytest.raises(RequestTimeout) as info:
            next(it)
        stats = dl.stats()
    assert ids == list(range(12))
    text = str(info.value)
    assert text.startswith(f"{server.endpoint}: no reply within request_timeout 5 s to batch 3 "
                           "of epoch 0"), text
    assert "transform stuck_transform:stuck" in text and "no other server" in text, text
    assert (info.value.epoch, info.value.batch, info.value.endpoint) == (0, 3, server.endpoint)
    assert isinstance(info.value, ServerUnavailable)
    assert stats["late"] >= 1 and stats["servers_lost"] == 0, stats


@pytest.mark.timeout(90)
def test_a_late_request_of_several_batches_is_asked_again_batch_by_batch(
        demo_data, servers, tmp_path) -> None:
    """Batches 0-3 travel in one request, held up by batch 3 alone: past the request timeout
    each is asked again alone (of the same server: the only one), so 0-2 arrive and the
    error lands on batch 3 alone."""
    demo = demo_data("arrow")
    server = _stuck_server(servers, demo, tmp_path, stuck_from=3, stuck_until=4, stuck_s=30.0,
                           workers=2)
    with _loader(server.endpoint, timeout=5, batches_per_request=4) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        with pytest.raises(RequestTimeout) as info:
            next(it)
        stats = dl.stats()
    assert ids == list(range(12))
    assert (info.value.epoch, info.value.batch) == (0, 3), info.value
    assert str(info.value).endswith("asked for again, alone, with no reply either"), info.value
    assert stats["late"] == 4 and stats["servers_lost"] == 0, stats
