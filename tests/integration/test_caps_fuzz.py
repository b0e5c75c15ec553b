"""A seeded, structure-aware fuzzer against both server sockets (short: the long one is
``python -m dataflow.bench fuzz``).

The messages and the oracle are :mod:`dataflow.bench.fuzz.gen`'s: every message kind encoded,
then mutated; the expected outcome of each message is computed with the wire module itself, so
the server's counters are checked exactly; afterwards the server is alive, its memory bounded,
and a real DataLoader gets an exact epoch.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq
from srvtools import pid_alive, rss_bytes, wait_for

from dataflow import wire
from dataflow.bench.fuzz.gen import data_outcome, messages, router_outcome
from dataflow.client import DataLoader
from dataflow.index import DatasetIndex

SEED = 20_261_123
SYNC_EVERY = 40  # messages between checks that the router read them (bounds unread bytes)
ROUTER_MESSAGES = 1_400
DATA_MESSAGES = 600
MAX_REQUEST_SAMPLES = 512
RSS_BOUND = 100 * 1024 * 1024

def _socket(endpoint: str, routing_id: bytes) -> zmq.Socket:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(endpoint)
    return sock


def _discard_replies(sock: zmq.Socket) -> None:
    while sock.poll(0):
        sock.recv_multipart()


@pytest.mark.timeout(120)
def test_fuzzed_messages_leave_the_server_serving_with_exact_counters(demo_data, servers,
                                                                      raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2,
                     extra_args=["--max-request-samples", str(MAX_REQUEST_SAMPLES)])
    pids = [server.pid, *server.ready["worker_pids"]]
    before = {pid: rss_bytes(pid) for pid in pids}
    rng = np.random.default_rng(SEED)
    start = time.monotonic()

    probe = raw_client(server.endpoint)
    index = probe.call(wire.Hello(1, "probe"))
    assert isinstance(index, wire.Index)
    fields = [f.name for f in DatasetIndex.from_json(index.index_json).schema]
    expected_malformed = 0
    for who, batch in enumerate((messages(rng, ROUTER_MESSAGES // 2),
                                 messages(rng, ROUTER_MESSAGES // 2))):
        sock = _socket(server.endpoint, b"fuzzer-%d" % who)
        session = False
        try:
            for i, frames in enumerate(batch):
                sock.send_multipart(frames)
                malformed, session = router_outcome(frames, session, fields,
                                                    MAX_REQUEST_SAMPLES)
                expected_malformed += malformed
                _discard_replies(sock)
                if i % SYNC_EVERY == SYNC_EVERY - 1 or i == len(batch) - 1:
                    wait_for(lambda n=expected_malformed: probe.stats()["malformed"] == n, 10.0,
                              f"{expected_malformed} malformed messages counted")
        finally:
            sock.close()

    data_errors = 0
    data_messages = messages(rng, DATA_MESSAGES)
    sock = _socket(server.ready["data_endpoints"][0], b"data-fuzzer")
    try:
        for frames in data_messages:  # in lockstep: a reader answers every message
            sock.send_multipart(frames)
            assert sock.poll(5000), f"no answer to {frames[0][:60]!r}"
            error = isinstance(wire.decode(sock.recv_multipart()), wire.ErrorMsg)
            assert error == data_outcome(frames), frames[0][:60]
            data_errors += error
    finally:
        sock.close()
    elapsed = time.monotonic() - start
    print(f"{ROUTER_MESSAGES + DATA_MESSAGES} fuzzed messages in {elapsed:.1f} s; "
          f"{expected_malformed} malformed at the router, {data_errors} at a reader")
    assert all(pid_alive(pid) for pid in pids)
    stats = probe.stats()
    assert stats["malformed"] == expected_malformed > ROUTER_MESSAGES // 2
    assert stats["worker_restarts"] == 0
    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=20) as dl:
        ids = torch.cat([b["id"] for b in dl])
    assert sorted(ids.tolist()) == list(range(demo.total))
    growth = {pid: rss_bytes(pid) - before[pid] for pid in pids}
    print("RSS growth (MiB):", {pid: round(g / 2**20, 1) for pid, g in growth.items()})
    assert max(growth.values()) < RSS_BOUND, growth
