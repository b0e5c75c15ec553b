"""Caps on what one peer can make a server hold, and what a server tells or logs of itself."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from srvtools import (
    RawClient,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    wait_for,
    zmtp_connect,
    zmtp_frame,
)

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import RemoteError
from dataflow.index import DatasetIndex

RSS_BOUND = 100 * 1024 * 1024


def _epoch_ids(endpoint: str, batch_size: int = 16) -> list[int]:
    with DataLoader(endpoint, batch_size=batch_size, rank=0, world_size=1, timeout=20) as dl:
        return sorted(torch.cat([b["id"] for b in dl]).tolist())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", ["frontend", "reader"])
def test_a_multipart_message_never_finished_is_cut_and_memory_stays_bounded(
        target, demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    if target == "frontend":
        endpoint, pid, frame = server.endpoint, server.pid, 1 << 20
    else:
        endpoint, frame = server.ready["data_endpoints"][0], 60_000
        pid = server.ready["worker_pids"][0]
    before = rss_bytes(pid)
    reset_peak_rss(pid)
    attacker = zmtp_connect(endpoint)
    chunk = zmtp_frame(b"\0" * frame, more=True)
    sent, deadline = 0, time.monotonic() + 30
    with pytest.raises(OSError):  # the server cuts the connection: EPIPE or ECONNRESET
        while time.monotonic() < deadline and sent < 4 << 30:
            attacker.sendall(chunk)
            sent += len(chunk)
    attacker.close()
    growth = peak_rss_bytes(pid) - before
    print(f"{target}: cut after {sent / 2**20:.1f} MiB sent; peak RSS growth "
          f"{growth / 2**20:.1f} MiB")
    assert growth < RSS_BOUND, f"RSS grew by {growth} bytes"
    assert _epoch_ids(server.endpoint) == list(range(demo.total))
    if target == "frontend":
        assert raw_client(server.endpoint).stats()["connections_cut"] == 1


@pytest.mark.timeout(60)
def test_request_without_session_is_refused_from_its_header(demo_data, servers,
                                                            raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    stranger = raw_client(server.endpoint)
    ranges = np.tile(np.array([[0, 0, demo.sizes[0]]], dtype=np.int64), (300_000, 1))
    reply = stranger.call(wire.Request(9, ranges))
    assert isinstance(reply, wire.ErrorMsg) and reply.req_id == 9
    assert reply.kind is wire.ErrorKind.UNKNOWN_CLIENT and "HELLO" in reply.message
    stats = raw_client(server.endpoint).stats()
    assert stats["refused"] == 1 and stats["malformed"] == 0 and stats["requests"] == 0


@pytest.mark.timeout(60)
def test_requests_over_the_session_sample_cap_are_refused_before_any_read(
        demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--max-request-samples", "100"])
    declared = raw_client(server.endpoint)
    assert isinstance(declared.call(wire.Hello(2, "b8", batch_size=8)), wire.Index)
    assert isinstance(declared.call(wire.Request(1, ((0, 0, 8),))), wire.BatchMsg)
    refused = declared.call(wire.Request(2, ((0, 0, 5), (1, 0, 4))))
    assert isinstance(refused, wire.ErrorMsg) and refused.req_id == 2
    assert "9 samples exceeds this session's 8" in refused.message
    old = raw_client(server.endpoint)  # a client that predates `batch_size`
    assert isinstance(old.call(wire.Hello(2, "old")), wire.Index)
    # The attack: one 88 KB REQUEST repeating a whole-shard range.
    whole = np.tile(np.array([[0, 0, demo.sizes[0]]], dtype=np.int64), (3_666, 1))
    refused = old.call(wire.Request(3, whole))
    assert isinstance(refused, wire.ErrorMsg) and "exceeds this session's 100" in refused.message
    too_big = old.call(wire.Hello(2, "greedy", batch_size=101))
    assert isinstance(too_big, wire.ErrorMsg) and "--max-request-samples 100" in too_big.message
    stats = old.stats()
    assert stats["refused"] == 3 and stats["requests"] == 1 and stats["worker_restarts"] == 0
    with pytest.raises(RemoteError, match=r"`batch_size` 101 exceeds .*--max-request-samples 100"):
        DataLoader(server.endpoint, batch_size=101, rank=0, world_size=1, timeout=20)
    with DataLoader(server.endpoint, batch_size=100, rank=0, world_size=1, timeout=20) as dl:
        ids = torch.cat([b["id"] for b in dl])
    assert sorted(ids.tolist()) == list(range(demo.total))
    assert old.stats()["refused"] == 4


@pytest.mark.timeout(60)
def test_hello_beyond_max_sessions_is_refused_with_server_busy(demo_data, servers,
                                                               raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=["--max-sessions", "2"])
    first, second, third = (raw_client(server.endpoint) for _ in range(3))
    for c in (first, second):
        assert isinstance(c.call(wire.Hello(1)), wire.Index)
    busy = third.call(wire.Hello(1))
    assert isinstance(busy, wire.ErrorMsg) and busy.kind is wire.ErrorKind.SERVER_BUSY
    assert busy.req_id == -1 and "--max-sessions" in busy.message
    assert isinstance(first.call(wire.Hello(1)), wire.Index)  # its own session: not refused
    second.send(wire.Bye())
    wait_for(lambda: first.stats()["clients"] == 1, 10, "the BYE")
    assert isinstance(third.call(wire.Hello(1)), wire.Index)
    assert first.stats()["sessions_refused"] == 1


@pytest.mark.timeout(60)
def test_idle_session_is_freed_and_told_while_a_live_client_keeps_its_own(
        demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths],
                     extra_args=["--client-ttl", "0.5", "--session-idle-timeout", "1.5"])
    idle = raw_client(server.endpoint)
    assert isinstance(idle.call(wire.Hello(1, "idle")), wire.Index)
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, shuffle=False,
                    timeout=20) as dl:
        ids = []
        for i, batch in enumerate(dl):
            ids += batch["id"].tolist()
            if i == 1:
                told = idle.recv(timeout=10)
                while isinstance(told, wire.Heartbeat):  # probes of its silent connection
                    told = idle.recv(timeout=10)
                time.sleep(1.0)  # the loader's own silence, beyond the idle timeout
    assert ids == list(range(demo.total))
    assert isinstance(told, wire.ErrorMsg) and told.kind is wire.ErrorKind.UNKNOWN_CLIENT
    assert told.req_id == -1 and "--session-idle-timeout" in told.message
    stats = raw_client(server.endpoint).stats()
    assert stats["sessions_idle_expired"] == 1 and stats["clients"] == 1


@pytest.mark.timeout(60)
def test_bye_and_hello_on_one_connection_never_exceed_twice_the_credits(
        demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    probe = raw_client(server.endpoint)
    probe.stats()
    greedy = raw_client(server.endpoint)
    assert isinstance(greedy.call(wire.Hello(1, "round 0")), wire.Index)
    # A reply first: the reader's ATTACHED reached the frontend (it may go out after the
    # HEARTBEAT answer; a reader stopped between the two leaves nothing dispatched).
    greedy.send(wire.Request(100, ((0, 0, 4),)))
    assert isinstance(greedy.recv(), wire.BatchMsg)
    reader = server.ready["worker_pids"][0]
    os.kill(reader, signal.SIGSTOP)
    try:
        for round_ in range(4):
            if round_:
                assert isinstance(greedy.call(wire.Hello(1, f"round {round_}")), wire.Index)
            greedy.send(wire.Request(2 * round_, ((0, 0, 4),)))
            greedy.send(wire.Request(2 * round_ + 1, ((0, 0, 4),)))
            if round_ == 0:  # both at the stopped reader (it holds --worker-queue 2 tasks)
                wait_for(lambda: probe.stats()["in_flight"] == 2, 10, "two tasks dispatched")
            else:
                refusals = [greedy.recv(), greedy.recv()]
                assert all(isinstance(r, wire.ErrorMsg) and "credit" in r.message
                           for r in refusals)
            greedy.send(wire.Bye())
        stats = probe.stats()
        assert stats["requests"] == 3 and stats["refused"] == 6
        assert stats["draining_sessions"] == 1
    finally:
        os.kill(reader, signal.SIGCONT)
    wait_for(lambda: probe.stats()["draining_sessions"] == 0, 10, "the old requests to settle")


@pytest.mark.timeout(60)
def test_stats_only_for_sessions_and_index_without_server_paths(demo_data, servers,
                                                                raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    stranger = raw_client(server.endpoint)
    refused = stranger.call(wire.Stats())
    assert isinstance(refused, wire.ErrorMsg) and refused.kind is wire.ErrorKind.UNKNOWN_CLIENT
    index = stranger.call(wire.Hello(1))
    assert isinstance(index, wire.Index)
    shards = DatasetIndex.from_json(index.index_json)
    assert list(shards.shards) == [os.path.basename(p) for p in demo.paths]
    assert os.path.dirname(demo.paths[0]) not in index.index_json
    assert shards.fingerprint == server.ready["fingerprint"]
    stats = stranger.stats()
    assert not any("pid" in k for k in stats) and str(server.pid) not in json.dumps(stats)


@pytest.mark.timeout(60)
def test_peer_text_is_escaped_and_malformed_messages_are_logged_at_a_bounded_rate(
        demo_data, servers, raw_client) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    evil = raw_client(server.endpoint)
    assert isinstance(evil.call(wire.Hello(1, "rank 0\nERROR server[1] forged line")),
                      wire.Index)
    for i in range(100):
        evil.send_raw([b"\n-- garbage %d\n" % i])
    probe = raw_client(server.endpoint)
    wait_for(lambda: probe.stats()["malformed"] == 100, 10, "100 malformed messages")
    log = server.stderr_tail(200_000)
    assert "'rank 0\\nERROR server[1] forged line'" in log
    assert not any(line.startswith(("ERROR server[1]", "-- garbage")) for line in log.splitlines())
    assert log.count("malformed message from") == 20
    assert probe.stats()["log_lines_suppressed"] == 80


@pytest.mark.timeout(60)
def test_a_reconnecting_client_with_the_same_routing_id_takes_its_session_over(
        demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    first, second = RawClient(server.endpoint, b"stable-id"), None
    try:
        assert isinstance(first.call(wire.Hello(1, "blip")), wire.Index)
        second = RawClient(server.endpoint, b"stable-id")  # the old connection is still up
        reply = second.call(wire.Stats())
        assert isinstance(reply, wire.StatsReply) and reply.counters["clients"] == 1
        assert not first.sock.poll(200)
    finally:
        first.close()
        if second is not None:
            second.close()



@pytest.mark.timeout(60)
def test_skipped_samples_are_counted_in_the_batch_and_in_stats(tmp_path, servers,
                                                               raw_client) -> None:
    path = str(tmp_path / "p.parquet")
    table = pa.table({"x": np.arange(60, dtype=np.int64)})
    pq.write_table(table, path, row_group_size=10, compression="none", use_dictionary=False,
                   write_page_checksum=True)
    col = pq.ParquetFile(path).metadata.row_group(2).column(0)  # samples 20..29
    with open(path, "r+b") as f:
        f.seek(col.data_page_offset + col.total_compressed_size - 8)
        f.write(b"\x63")
    server = servers([path], extra_args=["--on-error", "skip"])
    client = raw_client(server.endpoint)
    assert isinstance(client.call(wire.Hello(1, "skip", batch_size=16)), wire.Index)
    reply = client.call(wire.Request(1, ((0, 15, 25), (0, 28, 31))))
    assert isinstance(reply, wire.BatchMsg), reply
    assert (reply.size, reply.skipped) == (6, 7)
    assert wire.message_to_batch(reply)["x"].tolist() == [15, 16, 17, 18, 19, 30]
    stats = client.stats()
    assert stats["skipped_samples"] == 7 and stats["skipped_per_shard"] == [0, 7]
