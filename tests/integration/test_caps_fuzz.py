"""A seeded, structure-aware fuzzer against both server sockets.

Every message kind is encoded, then mutated (header fields dropped, added or retyped, kinds and
versions changed, frames added, dropped, resized or filled with garbage, headers replaced by
garbage or nested JSON). The expected outcome of each message is computed with the wire module
itself, so the server's counters are checked exactly; afterwards the server is alive, its
memory bounded, and a real DataLoader gets an exact epoch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
import zmq
from srvtools import pid_alive, rss_bytes, wait_for

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import ProtocolError
from dataflow.index import DatasetIndex
from dataflow.subset import unmatched

SEED = 20_261_123
SYNC_EVERY = 40  # messages between checks that the router read them (bounds unread bytes)
ROUTER_MESSAGES = 1_400
DATA_MESSAGES = 600
MAX_REQUEST_SAMPLES = 512
RSS_BOUND = 100 * 1024 * 1024
MAX_FRAME = 48 * 1024  # below a reader's 64 KiB frame limit (a larger frame cuts the peer)

VALUES: list[Callable[[np.random.Generator], object]] = [
    lambda r: None, lambda r: True, lambda r: -1, lambda r: 2**70, lambda r: 0.5,
    lambda r: int(r.integers(-10, 1 << 20)), lambda r: "x" * int(r.integers(0, 600)),
    lambda r: [], lambda r: {}, lambda r: [[0, 0, 1]] * 3, lambda r: ["a", "uint8", [1]],
    lambda r: {"k": [1, 2]},
]


def _seeds() -> list[list[bytes]]:
    msgs: list[wire.Message] = [
        wire.Hello(4, "fuzz"), wire.Hello(2, "fz", batch_size=16), wire.Request(1, ((0, 0, 4),)),
        wire.Hello(2, "fc", columns=("id", "text")), wire.Hello(1, "fu", columns=("id", "nope")),
        wire.Request(2, ((0, 0, 2), (1, 0, 3))), wire.Heartbeat(), wire.Bye(), wire.Stats(),
        wire.Index(1, 1, "{}", "tok", ("tcp://127.0.0.1:1",)),
        wire.batch_to_message(3, {"x": np.arange(4), "t": np.zeros((4, 2), np.uint8)}),
        wire.ErrorMsg(1, wire.ErrorKind.READ_FAILED, "x"), wire.StatsReply({"a": 1}),
    ]
    return [[bytes(f) for f in wire.encode(m)] for m in msgs]


def _mutate_header(rng: np.random.Generator, raw: bytes) -> bytes:
    header = json.loads(raw)
    if not isinstance(header, dict) or not header:
        raise ValueError("not a JSON object")
    keys = list(header)
    op = int(rng.integers(0, 6))
    if op == 0:
        del header[keys[int(rng.integers(0, len(keys)))]]
    elif op == 1:
        header[keys[int(rng.integers(0, len(keys)))]] = VALUES[int(rng.integers(len(VALUES)))](rng)
    elif op == 2:
        header[("extra", "batch_size", "columns")[int(rng.integers(0, 3))]] = VALUES[
            int(rng.integers(len(VALUES)))](rng)
    elif op == 3:
        header["kind"] = int(rng.integers(-1, 12))
    elif op == 4:
        header["version"] = int(rng.integers(0, 3))
    else:
        header["magic"] = "dataflow"[: int(rng.integers(0, 9))]
    return json.dumps(header).encode()


def _mutate(rng: np.random.Generator, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 7))
        if op <= 1:
            try:
                frames[0] = _mutate_header(rng, frames[0])
            except (ValueError, RecursionError):
                frames[0] = rng.bytes(int(rng.integers(0, 64)))
        elif op == 2 and len(frames) > 1:
            del frames[int(rng.integers(1, len(frames)))]
        elif op == 2 or op == 3:
            frames += [rng.bytes(int(rng.integers(0, 256))) for _ in range(int(rng.integers(1, 6)))]
        elif op == 4 and len(frames) > 1:
            i = int(rng.integers(1, len(frames)))
            n = int(rng.integers(0, MAX_FRAME))
            frames[i] = rng.bytes(n) if rng.random() < 0.5 else (frames[i] * 2)[:n]
        elif op == 5:
            raw = bytearray(frames[0])
            for _ in range(int(rng.integers(1, 4))):
                if raw:
                    raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
            frames[0] = bytes(raw)
        else:
            frames[0] = [rng.bytes(int(rng.integers(0, 200))), frames[0][: len(frames[0]) // 2],
                         b"[" * 40_000, b'{"magic": "dataflow", "version": 1, "kind": 1e999}',
                         b""][int(rng.integers(0, 5))]
    return frames


def _messages(rng: np.random.Generator, n: int) -> list[list[bytes]]:
    seeds = _seeds()
    out = []
    for _ in range(n):
        frames = seeds[int(rng.integers(len(seeds)))]
        out.append(frames if rng.random() < 0.1 else _mutate(rng, frames))
    return out


def _router_outcome(frames: list[bytes], session: bool,
                    fields: list[str]) -> tuple[bool, bool]:
    """(counted malformed, has a session after) for one message to the client router of a
    server serving ``fields``, as the server decides it."""
    if len(frames) > 3:
        return True, session
    try:
        head = wire.decode_header(frames[0])
        if isinstance(head, wire.Request) and not session:
            return False, session
        msg = wire.decode(frames)
    except ProtocolError:
        return True, session
    if isinstance(msg, wire.Index | wire.BatchMsg | wire.ErrorMsg | wire.StatsReply):
        return True, session
    if isinstance(msg, wire.Hello):
        return False, session or ((msg.batch_size or 0) <= MAX_REQUEST_SAMPLES
                                  and not unmatched(msg.columns or (), fields))
    return False, session and not isinstance(msg, wire.Bye)


def _data_outcome(frames: list[bytes]) -> bool:
    """Whether a reader answers this message on its data socket with an ERROR."""
    try:
        return len(frames) != 1 or not isinstance(wire.decode(frames), wire.Heartbeat)
    except ProtocolError:
        return True


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
    for who, messages in enumerate((_messages(rng, ROUTER_MESSAGES // 2),
                                    _messages(rng, ROUTER_MESSAGES // 2))):
        sock = _socket(server.endpoint, b"fuzzer-%d" % who)
        session = False
        try:
            for i, frames in enumerate(messages):
                sock.send_multipart(frames)
                malformed, session = _router_outcome(frames, session, fields)
                expected_malformed += malformed
                _discard_replies(sock)
                if i % SYNC_EVERY == SYNC_EVERY - 1 or i == len(messages) - 1:
                    wait_for(lambda n=expected_malformed: probe.stats()["malformed"] == n, 10.0,
                              f"{expected_malformed} malformed messages counted")
        finally:
            sock.close()

    data_errors = 0
    messages = _messages(rng, DATA_MESSAGES)
    sock = _socket(server.ready["data_endpoints"][0], b"data-fuzzer")
    try:
        for frames in messages:  # in lockstep: a reader answers every message
            sock.send_multipart(frames)
            assert sock.poll(5000), f"no answer to {frames[0][:60]!r}"
            error = isinstance(wire.decode(sock.recv_multipart()), wire.ErrorMsg)
            assert error == _data_outcome(frames), frames[0][:60]
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
