"""A reader worker's reply to one task: skipped-sample accounting and the reply-size cap."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow import wire
from dataflow.batch import Batch
from dataflow.readers import ShardReader
from dataflow.server.tasks import ReaderCache, WorkerSpec, serve_task


class LossyReader(ShardReader):
    """``n`` samples ``x == index``; every sample in ``damaged`` is left out and counted
    (``lie``: counted twice, breaking the reader contract)."""

    def __init__(self, n: int, damaged: set[int], lie: bool = False) -> None:
        super().__init__(f"/data/root/shard-{n}", "skip")
        self._n, self._damaged, self._lie = n, damaged, lie
        self.schema = ()

    def __len__(self) -> int:
        return self._n

    def _read(self, start: int, stop: int) -> Batch:
        rows = [i for i in range(start, stop) if i not in self._damaged]
        self.skipped += (stop - start - len(rows)) * (2 if self._lie else 1)
        return {"x": np.asarray(rows, dtype=np.int64)}

    def close(self) -> None:
        self.closed = True


class FakeCache(ReaderCache):
    def __init__(self, readers: dict[int, ShardReader]) -> None:
        self.readers = readers

    def get(self, shard: int) -> ShardReader:
        return self.readers[shard]


def _spec(max_reply_bytes: int = 1 << 30) -> WorkerSpec:
    return WorkerSpec("ipc://@x", 8, ("/data/root/a", "/data/root/b"), None, None, "skip", 1,
                      20, max_reply_bytes, "/data/root/", 16)


def _ranges(*rows: tuple[int, int, int]) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


def test_batch_counts_the_samples_the_readers_skipped_during_the_task() -> None:
    readers = {0: LossyReader(10, {1, 2}), 1: LossyReader(10, {5})}
    readers[0].skipped = 7  # skips of earlier tasks do not count
    reply = serve_task(FakeCache(readers), None, _spec(), 3,
                       _ranges((0, 0, 4), (1, 4, 8), (0, 8, 10)))
    msg = wire.decode(reply.frames)
    assert isinstance(msg, wire.BatchMsg) and msg.req_id == 3
    assert (msg.size, msg.skipped) == (7, 3)
    assert msg.data[0].tolist() == [0, 3, 4, 6, 7, 8, 9]
    assert reply.skips == ((0, 2), (1, 1)) and not reply.too_large and reply.samples == 7


def test_a_count_that_does_not_add_up_is_an_internal_error_reply() -> None:
    reply = serve_task(FakeCache({0: LossyReader(10, {1}, lie=True)}), None, _spec(), 4,
                       _ranges((0, 0, 5)))
    msg = wire.decode(reply.frames)
    assert isinstance(msg, wire.ErrorMsg) and msg.kind is wire.ErrorKind.READ_FAILED
    assert msg.message.startswith("InternalError:") and "request of 5" in msg.message


def test_a_batch_over_max_reply_bytes_is_refused() -> None:
    reply = serve_task(FakeCache({0: LossyReader(100, set())}), None, _spec(100), 5,
                       _ranges((0, 0, 100)))
    msg = wire.decode(reply.frames)
    assert isinstance(msg, wire.ErrorMsg) and msg.message.startswith("ReplyTooLarge:")
    assert "800 bytes" in msg.message and reply.too_large


def test_error_messages_name_shards_relative_to_the_root() -> None:
    reply = serve_task(FakeCache({0: LossyReader(10, set())}), None, _spec(), 6,
                       _ranges((0, 5, 20)))
    msg = wire.decode(reply.frames)
    assert isinstance(msg, wire.ErrorMsg) and "shard-10" in msg.message
    assert "/data/root" not in msg.message


@pytest.mark.parametrize("damaged", [set(), {0, 1, 2}])
def test_all_or_nothing_skipped(damaged: set[int]) -> None:
    reply = serve_task(FakeCache({0: LossyReader(3, damaged)}), None, _spec(), 7,
                       _ranges((0, 0, 3)))
    msg = wire.decode(reply.frames)
    assert isinstance(msg, wire.BatchMsg) and msg.size + msg.skipped == 3
