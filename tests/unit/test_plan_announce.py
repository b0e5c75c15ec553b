"""What a REQUEST announces (its ``ahead``): the client's window of its plan, the wire, the
frontend's check of it, and the flag that allows it."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow import wire
from dataflow.client.slots import announced
from dataflow.errors import ConfigError, ProtocolError
from dataflow.server.admission import ahead_problem
from dataflow.server.config import ServerConfig
from dataflow.server.samplecache import rows_of
from dataflow.wire.internal import Forget, Task, decode_internal, encode_internal

SIZES = np.array([10, 4], dtype=np.int64)
SHARDS = ["a.arrow", "b.arrow"]


@pytest.mark.parametrize("limit", range(0, 12))
def test_the_window_is_the_first_samples_of_the_batches_read_next(limit: int) -> None:
    batches = [np.array([[0, 0, 3], [1, 1, 3]]), np.array([[0, 5, 9]]), np.array([[1, 0, 1]])]
    got = announced(iter(batches), limit)
    every = list(rows_of(np.concatenate(batches)))
    assert list(rows_of(got)) == every[:limit]
    assert got.dtype == np.int64 and got.shape[1] == 3
    assert (got[:, 2] > got[:, 1]).all()


def test_the_window_reads_no_batch_past_its_limit() -> None:
    def batches():
        yield np.array([[0, 0, 4]])
        raise AssertionError("read past the limit")

    assert announced(batches(), 4).tolist() == [[0, 0, 4]]


def test_ahead_travels_after_the_ranges_and_only_when_there_is_one() -> None:
    msg = wire.Request(5, [[0, 1, 2]], wire.BatchTag(1, 2, 3), ahead=[[1, 0, 4], [0, 0, 10]])
    frames = wire.encode(msg)
    assert len(frames) == 3 and wire.decode(frames) == msg
    plain = wire.Request(5, [[0, 1, 2]])
    assert len(wire.encode(plain)) == 2 and b"ahead" not in bytes(wire.encode(plain)[0])
    assert wire.decode(wire.encode(plain)).ahead.shape == (0, 3)
    task = Task(b"tok", 5, msg.ranges, ahead=msg.ahead)
    assert np.array_equal(decode_internal(encode_internal(task)).ahead, msg.ahead)
    assert decode_internal(encode_internal(Forget(b"tok"))) == Forget(b"tok")
    index = wire.Index(2, 1, "{}", ahead=4096)
    assert wire.decode(wire.encode(index)).ahead == 4096


def test_an_ahead_frame_that_does_not_match_its_header_is_refused() -> None:
    frames = [bytes(f) for f in wire.encode(wire.Request(5, [[0, 1, 2]], ahead=[[0, 0, 1]]))]
    with pytest.raises(ProtocolError, match="REQUEST"):
        wire.decode(frames[:2])
    with pytest.raises(ProtocolError, match="REQUEST"):
        wire.decode([*frames[:2], frames[2][:-1]])
    bad = frames[0].replace(b'"ahead":1', b'"ahead":-1')
    with pytest.raises(ProtocolError, match="`ahead`"):
        wire.decode([bad, *frames[1:]])


@pytest.mark.parametrize("ahead,window,message", [
    ([[0, 0, 5]], 4, "`ahead` of 5 samples exceeds the server's --cache-plan-window 4"),
    ([[0, 0, 1]] * 3, 2, "`ahead` of 3 ranges exceeds"),
    ([[2, 0, 1]], 8, "`ahead` range 0: shard 2 not in [0, 2)"),
    ([[1, 3, 5]], 8, "`ahead` range 0: [3, 5) is empty or outside shard b.arrow of 4"),
    ([[0, 2, 2]], 8, "is empty"),
    ([[0, 0, 1]], 0, "--cache-plan-window 0"),
])
def test_a_bad_announcement_is_named(ahead: list[list[int]], window: int, message: str) -> None:
    problem = ahead_problem(np.array(ahead, dtype=np.int64), SIZES, SHARDS, window)
    assert problem is not None and message in problem


def test_repeats_and_no_announcement_are_fine() -> None:
    repeat = np.array([[0, 0, 3], [0, 1, 4], [1, 0, 4]], dtype=np.int64)
    assert ahead_problem(repeat, SIZES, SHARDS, 10) is None
    assert ahead_problem(np.empty((0, 3), np.int64), SIZES, SHARDS, 0) is None


def test_the_window_needs_a_cache() -> None:
    with pytest.raises(ConfigError, match="`cache_plan_window` needs `cache_memory`"):
        ServerConfig(("x",), cache_plan_window=8)
    with pytest.raises(ConfigError, match="cache_plan_window"):
        ServerConfig(("x",), cache_memory=1 << 20, cache_plan_window=-1)
    assert ServerConfig(("x",), cache_memory=1 << 20, cache_plan_window=8).cache_plan_window == 8
