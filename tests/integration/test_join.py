"""Start-up with a fleet: a loader starts as soon as one server admits it, and the others join
in the background (busy, not up yet, slow to answer), sample-exact (``shuffle=False``: every
sample once, in plan order)."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time

import pytest
import zmq
from srvtools import RawClient, repo_env, scrape, server_stat, wait_for

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import DatasetMismatchError, ServerUnavailable

SLOW = '''
def slow(batch):
    __import__("time").sleep(0.05)
    return batch
'''
LOGGER = "dataflow.client"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(servers, demo, tmp_path, **kw):
    """A server taking 0.05 s more per batch (the loader cannot finish an epoch before a
    server joining later takes some of it)."""
    (tmp_path / "slow_join.py").write_text(SLOW)
    return servers([str(p) for p in demo.paths], env=repo_env(str(tmp_path)),
                   extra_args=["--transform", "slow_join:slow", *kw.pop("extra_args", [])],
                   **kw)


def _loader(endpoints, **kw) -> DataLoader:
    kw = {"batch_size": 4, "rank": 0, "world_size": 1, "shuffle": False, "prefetch": 2,
          "timeout": 30, **kw}
    return DataLoader(endpoints, **kw)


@pytest.mark.timeout(120)
def test_a_busy_server_does_not_block_the_start_and_joins_once_free(
        demo_data, servers, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    demo = demo_data("arrow")
    a, b = _server(servers, demo, tmp_path), _server(servers, demo, tmp_path)
    busy = _server(servers, demo, tmp_path, extra_args=["--max-sessions", "1"])
    holder = RawClient(busy.endpoint)
    assert isinstance(holder.call(wire.Hello(1, "holds the only session")), wire.Index)
    with _loader([a.endpoint, b.endpoint, busy.endpoint]) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        # refused twice at least (asked again in the background), logged once
        wait_for(lambda: holder.stats()["sessions_refused"] >= 2, 30, "a second busy answer")
        assert len(dl.server_readers) <= 2  # the busy one cannot have joined
        holder.send(wire.Bye())
        wait_for(lambda: len(dl.server_readers) == 3, 30, "the freed server to join")
        ids += [i for batch in it for i in batch["id"].tolist()]
        stats = dl.stats()
    holder.close()
    assert ids == list(range(demo.total))
    assert stats["joined"] >= 1 and stats["servers_lost"] == 0, stats
    assert server_stat(busy.endpoint, "replies") > 0
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len([m for m in said if m.startswith(f"{busy.endpoint}: busy (")]) == 1, said
    assert any(re.match(rf"{re.escape(busy.endpoint)}: joined .*after the loader started", m)
               for m in said), said


@pytest.mark.timeout(120)
def test_a_server_started_after_the_loader_joins_it(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    a = _server(servers, demo, tmp_path)
    late = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there yet
    with _loader([late, a.endpoint]) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        assert dl.server_readers == (1,)
        started = _server(servers, demo, tmp_path, bind=late)
        wait_for(lambda: len(dl.server_readers) == 2, 30, "the late server to join")
        ids += [i for batch in it for i in batch["id"].tolist()]
        stats = dl.stats()
    assert ids == list(range(demo.total))
    assert stats["joined"] == 1, stats
    assert server_stat(started.endpoint, "replies") > 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("peer", ["silent router", "tcp listener"])
def test_a_server_that_never_answers_does_not_break_the_start(demo_data, servers, tmp_path,
                                                              peer: str) -> None:
    """The healthy server probes a silent session after --client-ttl (1 s): its HEARTBEAT
    must not break anything while another listed server (bound, but never answering) is
    waited for."""
    demo = demo_data("arrow")
    healthy = servers([str(p) for p in demo.paths], extra_args=["--client-ttl", "1"])
    if peer == "silent router":
        silent = zmq.Context.instance().socket(zmq.ROUTER)
        silent.setsockopt(zmq.LINGER, 0)
        endpoint = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
    else:
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    try:
        start = time.monotonic()
        with _loader([endpoint, healthy.endpoint], timeout=60) as dl:
            assert time.monotonic() - start < 60  # it did not wait for the silent one
            time.sleep(2.5)  # longer than the healthy server's --client-ttl
            ids = [i for batch in dl for i in batch["id"].tolist()]
            time.sleep(2.5)
            again = [i for batch in dl for i in batch["id"].tolist()]
    finally:
        silent.close()
    assert ids == again == list(range(demo.total))


@pytest.mark.timeout(60)
def test_no_server_admitting_names_every_endpoint_and_its_state(demo_data, servers,
                                                                 tmp_path) -> None:
    demo = demo_data("arrow")
    busy = servers([str(p) for p in demo.paths], extra_args=["--max-sessions", "1"])
    holder = RawClient(busy.endpoint)
    assert isinstance(holder.call(wire.Hello(1, "holds the only session")), wire.Index)
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    quiet = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
    nobody = f"tcp://127.0.0.1:{_free_port()}"
    try:
        with pytest.raises(ServerUnavailable) as info:
            _loader([busy.endpoint, quiet, nobody], timeout=5)
    finally:
        silent.close()
        holder.close()
    text = str(info.value)
    assert info.value.endpoint == f"{busy.endpoint}, {quiet}, {nobody}"
    assert "no server admitted this client within 5" in text
    for endpoint, state in ((busy.endpoint, r"(down|joining) \(.*busy: ServerBusy: "),
                            (quiet, r"(down|joining) \(HELLO sent, no answer yet"),
                            (nobody, r"down \(not connected\)")):
        assert re.search(rf"; {re.escape(endpoint)}: {state}", text), (endpoint, text)


@pytest.mark.timeout(90)
def test_a_server_of_another_dataset_stays_out(demo_data, servers, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    demo = demo_data("arrow")
    a = _server(servers, demo, tmp_path)
    other = f"tcp://127.0.0.1:{_free_port()}"
    with _loader([a.endpoint, other]) as dl:
        it = iter(dl)
        ids = [i for _ in range(3) for i in next(it)["id"].tolist()]
        wrong = servers([str(p) for p in demo.paths[:-1]], bind=other)
        wait_for(lambda: any("stays out" in r.getMessage() for r in caplog.records), 30,
                 "the other dataset's server to be refused")
        ids += [i for batch in it for i in batch["id"].tolist()]
        assert dl.server_readers == (1,)
    assert ids == list(range(demo.total))
    (line,) = [r for r in caplog.records if "stays out" in r.getMessage()]
    assert line.levelno == logging.ERROR and wrong.endpoint in line.getMessage()
    assert wrong.ready["fingerprint"] in line.getMessage()


@pytest.mark.timeout(60)
def test_servers_answering_with_two_datasets_at_the_start_fail_the_constructor(
        demo_data, servers) -> None:
    """Each rank starts with the first server to admit it: with two datasets answering, ranks
    could start on different ones. Both INDEXes are in (every reader stopped, so neither join
    can finish) when one server's readers go on: the constructor fails, naming both."""
    demo = demo_data("arrow")
    one = servers([str(p) for p in demo.paths], extra_args=["--metrics-port", "0"])
    other = servers([str(p) for p in demo.paths[:-1]], extra_args=["--metrics-port", "0"])
    readers = {h.endpoint: h.ready["worker_pids"] for h in (one, other)}
    for pids in readers.values():
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            _loader([one.endpoint, other.endpoint], timeout=20).close()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=start)
    try:
        thread.start()
        for h in (one, other):  # (a STATS probe would wait for the stopped readers)
            port = h.ready["metrics_port"]
            wait_for(lambda port=port: scrape(port).get(("dataflow_sessions", ()), 0) >= 1,
                     20, f"{h.endpoint} to answer the HELLO")
        time.sleep(0.5)  # its INDEX on the way to the loader
        for pid in readers[one.endpoint]:
            os.kill(pid, signal.SIGCONT)
        thread.join(30)
    finally:
        for pids in readers.values():
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    assert not thread.is_alive()
    (error,) = outcome
    assert isinstance(error, DatasetMismatchError), error
    assert one.endpoint in str(error) and other.endpoint in str(error)
    assert one.ready["fingerprint"] in str(error) and other.ready["fingerprint"] in str(error)
