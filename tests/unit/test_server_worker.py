"""A reader worker's reply to one task: skipped-sample accounting, the reply-size cap, and a
bug told apart from bad data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dataflow import wire
from dataflow.batch import Batch, Ragged
from dataflow.errors import ProtocolError, ShardReadError
from dataflow.readers import ShardReader
from dataflow.server.samplecache import SampleCache
from dataflow.server.tasks import (
    APART_BYTES,
    APART_PARTS,
    SIZED_SESSIONS,
    ReaderCache,
    ReplySizes,
    SkipMeter,
    WorkerSpec,
    serve_task,
)
from dataflow.server.transform import Transform
from dataflow.transform import TransformContext, batch_seed
from dataflow.wire.internal import Sent, Task


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
        self.book = None

    def get(self, shard: int) -> ShardReader:
        return self.readers[shard]

    def get_many(self, shards: list[int]) -> list[ShardReader]:
        return [self.readers[shard] for shard in shards]


def _spec(max_reply_bytes: int = 1 << 30) -> WorkerSpec:
    return WorkerSpec("ipc://@x", 8, ("/data/root/a", "/data/root/b"), None, None, "skip", 1,
                      20, max_reply_bytes, "/data/root/", 16)


def _serve(readers: dict[int, ShardReader], req_id: int, *rows: tuple[int, int, int],
           spec: WorkerSpec | None = None) -> tuple[wire.Message, Sent]:
    """The decoded reply to request ``req_id`` of ``rows``, and its SENT notice."""
    frames, sent = serve_task(FakeCache(readers), None, spec or _spec(),
                              Task(b"tok", req_id, np.array(rows, dtype=np.int64)))
    assert sent.nbytes == sum(memoryview(f).nbytes for f in frames)
    assert (sent.token, sent.req_id) == (b"tok", req_id)
    return wire.decode(frames), sent


def test_batch_counts_the_samples_the_readers_skipped_during_the_task() -> None:
    readers = {0: LossyReader(10, {1, 2}), 1: LossyReader(10, {5})}
    readers[0].skipped = 7  # skips of earlier tasks do not count
    msg, sent = _serve(readers, 3, (0, 0, 4), (1, 4, 8), (0, 8, 10))
    assert isinstance(msg, wire.BatchMsg) and msg.req_id == 3
    assert (msg.size, msg.skipped) == (7, 3)
    assert msg.data[0].tolist() == [0, 3, 4, 6, 7, 8, 9]
    assert sent.skips == ((0, 2), (1, 1)) and not sent.too_large and sent.samples == 7
    # which: positions 1, 2 (shard 0, samples 1, 2) and 5 (shard 1, sample 5) of the 10 asked
    assert msg.left_out == (1, 3, 5, 6)
    assert readers[0].skipped == 7 + 4 and readers[1].skipped == 2  # read again to know which


def test_which_samples_were_left_out_is_said_only_when_known() -> None:
    """A reader whose damage reads otherwise when read again (or none was skipped): the
    BATCH counts its skipped samples but does not say which."""

    class Flaky(LossyReader):
        def _read(self, start: int, stop: int) -> Batch:
            batch = super()._read(start, stop)
            self._damaged = {i + 1 for i in self._damaged}
            return batch

    msg, sent = _serve({0: Flaky(10, {1})}, 3, (0, 0, 5))
    assert isinstance(msg, wire.BatchMsg) and (msg.size, msg.skipped, msg.left_out) == (4, 1, ())
    assert sent.skips == ((0, 1),)
    msg, _ = _serve({0: LossyReader(10, set())}, 3, (0, 0, 5))
    assert isinstance(msg, wire.BatchMsg) and (msg.skipped, msg.left_out) == (0, ())


def test_a_count_that_does_not_add_up_is_an_internal_error_reply(caplog) -> None:
    msg, sent = _serve({0: LossyReader(10, {1}, lie=True)}, 4, (0, 0, 5))
    assert isinstance(msg, wire.ErrorMsg) and msg.kind is wire.ErrorKind.INTERNAL
    assert msg.message.startswith("InternalError:") and "request of 5" in msg.message
    assert sent.samples == 0 and not sent.too_large
    assert any(r.exc_info and "bug" in r.getMessage() for r in caplog.records)


class BrokenCache(FakeCache):
    """Opening any shard raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__({})
        self._error = error

    def get(self, shard: int) -> ShardReader:
        raise self._error


@pytest.mark.parametrize("error, kind", [
    (ShardReadError("/data/root/a", "damaged header"), wire.ErrorKind.READ_FAILED),
    (OSError(5, "Input/output error"), wire.ErrorKind.READ_FAILED),
    (KeyError("x"), wire.ErrorKind.INTERNAL),
    (TypeError("unsupported operand"), wire.ErrorKind.INTERNAL),
])
def test_bad_data_is_a_read_failure_and_anything_else_a_bug_logged_with_its_traceback(
        caplog, error: Exception, kind: wire.ErrorKind) -> None:
    frames, _ = serve_task(BrokenCache(error), None, _spec(),
                           Task(b"tok", 8, np.array([[0, 0, 2]], dtype=np.int64)))
    msg = wire.decode(frames)
    assert isinstance(msg, wire.ErrorMsg) and (msg.req_id, msg.kind) == (8, kind)
    assert msg.message.startswith(f"{type(error).__name__}: ")
    assert "/data/root" not in msg.message
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == (kind is wire.ErrorKind.INTERNAL)


def test_a_batch_over_max_reply_bytes_is_refused() -> None:
    msg, sent = _serve({0: LossyReader(100, set())}, 5, (0, 0, 100), spec=_spec(100))
    assert isinstance(msg, wire.ErrorMsg) and msg.message.startswith("ReplyTooLarge:")
    assert msg.kind is wire.ErrorKind.READ_FAILED
    assert "800 bytes" in msg.message and sent.too_large


def test_error_messages_name_shards_relative_to_the_root() -> None:
    msg, _ = _serve({0: LossyReader(10, set())}, 6, (0, 5, 20))
    assert isinstance(msg, wire.ErrorMsg) and "shard-10" in msg.message
    assert "/data/root" not in msg.message


@pytest.mark.parametrize("damaged", [set(), {0, 1, 2}])
def test_all_or_nothing_skipped(damaged: set[int]) -> None:
    msg, _ = _serve({0: LossyReader(3, damaged)}, 7, (0, 0, 3))
    assert isinstance(msg, wire.BatchMsg) and msg.size + msg.skipped == 3
    assert msg.left_out == ((0, 3) if damaged else ())


def _tagged(batch: Batch, ctx: TransformContext) -> Batch:
    """Each sample gets its batch's global index and seed (as a transform's draws would)."""
    n = len(batch["x"])
    return {**batch, "batch": np.full(n, ctx.batch_index, np.int64),
            "seed": np.full(n, ctx.seed % 2**62, np.int64)}


def test_a_task_of_several_batches_reads_and_transforms_each_alone() -> None:
    """Each batch of ``parts`` is transformed with its own tag (as if requested alone), its
    skipped samples counted on its own, and the reply is one BATCH of them in order."""
    readers = {0: LossyReader(20, {1, 9}), 1: LossyReader(20, set())}
    tags = [wire.BatchTag(3, 1, 0), wire.BatchTag(3, 1, 4), wire.BatchTag(3, 2, 0)]
    rows = np.array([[0, 0, 4], [1, 0, 2], [0, 8, 10], [0, 10, 12]], dtype=np.int64)
    task = Task(b"tok", 5, rows, parts=(wire.Part(2, tags[0]), wire.Part(1, tags[1]),
                                        wire.Part(1, tags[2])))
    transform = Transform("m:_tagged", _tagged, with_context=True)
    frames, sent = serve_task(FakeCache(readers), transform, _spec(), task)
    msg = wire.decode(frames)
    assert isinstance(msg, wire.BatchMsg) and msg.parts == (5, 1, 2) and msg.skipped == 2
    got = wire.message_to_batches(msg)
    assert [b["x"].tolist() for b in got] == [[0, 2, 3, 0, 1], [8], [10, 11]]
    assert [set(b["batch"].tolist()) for b in got] == [{0}, {4}, {0}]
    assert [set(b["seed"].tolist()) for b in got] == [{batch_seed(*t) % 2**62} for t in tags]
    assert sent.samples == 8 and sent.skips == ((0, 2),)
    assert msg.left_out == (1, 2, 7, 8)  # sample 1 of shard 0 (position 1), 9 (position 7)


@pytest.mark.parametrize("damaged", [set(), {1, 9}])
def test_without_a_transform_the_batches_of_a_task_are_read_as_one(damaged: set[int]) -> None:
    """One read cut by the batches' sizes when nothing was left out; when samples were, each
    batch is read again alone (counted once) to know which of them lost which."""
    readers = {0: LossyReader(20, damaged), 1: LossyReader(20, set())}
    rows = np.array([[0, 0, 4], [1, 0, 2], [0, 8, 10], [0, 10, 12]], dtype=np.int64)
    tags = [wire.BatchTag(3, 1, b) for b in (0, 4, 8)]
    task = Task(b"tok", 5, rows, parts=tuple(wire.Part(r, t) for r, t in zip((2, 1, 1), tags,
                                                                              strict=True)))
    frames, sent = serve_task(FakeCache(readers), None, _spec(), task)
    msg = wire.decode(frames)
    assert isinstance(msg, wire.BatchMsg)
    want = [[i for i in [0, 1, 2, 3] if i not in damaged] + [0, 1],
            [i for i in [8, 9] if i not in damaged], [10, 11]]
    assert [b["x"].tolist() for b in wire.message_to_batches(msg)] == want
    assert msg.parts == tuple(map(len, want)) and msg.skipped == len(damaged)
    assert sent.skips == (((0, 2),) if damaged else ()) and sent.samples == msg.size
    assert msg.left_out == ((1, 2, 7, 8) if damaged else ())


def test_a_batch_read_as_one_is_cut_with_each_batch_s_own_offsets() -> None:
    batch = {"id": np.arange(5), "t": Ragged(np.frombuffer(b"abcdefg", np.uint8).copy(),
                                            np.array([0, 1, 3, 3, 6, 7]), "bytes")}
    msg = wire.decode(wire.encode(wire.parts_to_message(2, batch, [2, 0, 3])))
    got = wire.message_to_batches(msg)
    assert [b["id"].tolist() for b in got] == [[0, 1], [], [2, 3, 4]]
    assert [bytes(b["t"].values) for b in got] == [b"abc", b"", b"defg"]
    assert [b["t"].offsets.tolist() for b in got] == [[0, 1, 3], [0], [0, 0, 3, 4]]
    with pytest.raises(ProtocolError, match="adding up to its 5 samples"):
        wire.parts_to_message(2, batch, [2, 2])


def test_a_reader_keeps_at_most_max_open_shards_open_least_recently_used_closed_first(
        tmp_path) -> None:
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"{i}.arrow"))
        table = pa.table({"x": np.arange(4)})
        with pa.OSFile(paths[-1], "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    spec = WorkerSpec("ipc://@x", 8, tuple(paths), None, None, "raise", 1, 20, 1 << 30,
                      str(tmp_path) + "/", 16, max_open_shards=2)
    readers = ReaderCache(spec)
    got = {shard: readers.get(shard) for shard in (0, 1, 0, 2, 0, 3)}
    assert [got[i].closed for i in range(4)] == [False, True, True, False]
    assert readers.get(1) is not got[1] and got[0].closed  # opened again; 0 least recent
    readers.close()
    assert all(r.closed for r in got.values())


@pytest.mark.parametrize("capacity", [2, 16], ids=["lru", "all-open"])
def test_a_reader_cache_gets_many_readers_as_it_gets_each(tmp_path, capacity: int) -> None:
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"{i}.arrow"))
        table = pa.table({"x": np.arange(4) + 10 * i})
        with pa.OSFile(paths[-1], "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    spec = WorkerSpec("ipc://@x", 8, tuple(paths), None, None, "raise", 1, 20, 1 << 30,
                      str(tmp_path) + "/", 16, max_open_shards=capacity)
    readers = ReaderCache(spec)
    first = readers.get(1)
    got = readers.get_many([3, 1, 0])
    assert got[1] is first
    # With room for two, 3 was closed as 0 was opened (1 was got more recently), as by get.
    assert [r.closed for r in got] == ([True, False, False] if capacity == 2 else [False] * 3)
    assert [r.read(0, 1)["x"].tolist() for r in got if not r.closed] == (
        [[10], [0]] if capacity == 2 else [[30], [10], [0]])
    readers.close()


def test_readers_got_for_a_gather_across_shards_count_from_their_get() -> None:
    """A gather across shards changes nothing a reader counts, so the readers it gets are not
    noted; a read of one of them counts from when the task got it to read (``get``), as the
    shard-by-shard read does after a gather left the batch to it."""
    readers = {0: LossyReader(10, {1}), 1: LossyReader(10, {0}), 2: LossyReader(10, set())}
    readers[0].skipped = 5  # skips of earlier tasks do not count
    meter = SkipMeter(FakeCache(readers))
    assert meter.get_many([2, 0, 1]) == [readers[2], readers[0], readers[1]]
    assert meter.skips() == {}
    meter.get(0).read(0, 4)
    meter.get(1).read(0, 2)
    assert meter.skips() == {0: 1, 1: 1}
    assert meter.get_many([0, 2]) == [readers[0], readers[2]]
    meter.get(0).read(0, 2)
    assert meter.skips() == {0: 2, 1: 1}


class ReopeningCache(ReaderCache):
    """Gives the readers of ``given`` in turn, as a reader cache whose LRU closed a shard's
    reader and opened it again."""

    def __init__(self, given: list[tuple[int, ShardReader]]) -> None:
        self.given = iter(given)

    def get(self, shard: int) -> ShardReader:
        want, reader = next(self.given)
        assert want == shard
        return reader


def test_a_task_counts_the_skips_of_every_reader_it_got_of_a_shard() -> None:
    """Shard 0's reader opened again within a task: the skips of both count, each from when
    the task got it; reads made to learn which samples were left out do not."""
    first, again, other = LossyReader(10, {1}), LossyReader(10, {1, 2}), LossyReader(10, {0})
    first.skipped, again.skipped = 7, 3
    meter = SkipMeter(ReopeningCache([(0, first), (1, other), (0, first), (0, again),
                                      (0, again), (1, other)]))
    meter.get(0).read(0, 4)
    meter.get(1).read(0, 2)
    meter.get(0).read(0, 2)
    assert meter.skips() == {0: 2, 1: 1}
    meter.get(0).read(0, 4)
    with meter.uncounted():
        meter.get(0).read(1, 2)
    assert meter.skips() == {0: 4, 1: 1}
    meter.get(1).read(5, 6)
    assert meter.skips() == {0: 4, 1: 1} and (first.skipped, again.skipped) == (9, 6)


def test_a_cached_batch_whose_misses_had_damaged_samples_is_served_again_uncached() -> None:
    decoded: list[list[int]] = []

    def decode(batch: Batch) -> Batch:
        decoded.append(batch["x"].tolist())
        return {"x": batch["x"], "sq": batch["x"] ** 2}

    stages = Transform("m:STAGES", None, False, decode, "m:decode@1")
    readers = FakeCache({0: LossyReader(10, {1})})
    cache = SampleCache(1 << 20)

    def serve(req_id: int, start: int, stop: int) -> tuple[wire.Message, Sent]:
        frames, sent = serve_task(readers, stages, _spec(), Task(
            b"tok", req_id, np.array([[0, start, stop]], dtype=np.int64)), None, cache)
        return wire.decode(frames), sent

    served = [serve(1, 2, 4), serve(2, 0, 4)]
    # The second task's misses (0, and 1: damaged) lost a sample: the batch decoded whole.
    assert decoded == [[2, 3], [0, 2, 3]]
    (first, _), (msg, sent) = served
    assert isinstance(first, wire.BatchMsg) and isinstance(msg, wire.BatchMsg)
    assert (msg.size, msg.skipped) == (3, 1) and sent.skips == ((0, 1),)
    assert msg.data[0].tolist() == [0, 2, 3] and msg.data[1].tolist() == [0, 4, 9]
    assert (sent.cache_hits, sent.cache_misses) == (2, 2)


class CountingReader(LossyReader):
    """A :class:`LossyReader` that remembers each range it was asked to read."""

    def __init__(self, n: int) -> None:
        super().__init__(n, set())
        self.reads: list[tuple[int, int]] = []

    def _read(self, start: int, stop: int) -> Batch:
        self.reads.append((start, stop))
        return super()._read(start, stop)


def _run_task(reader: CountingReader, stops: list[int],
              sizes: ReplySizes | None = None) -> wire.BatchMsg:
    """The BATCH answering one task of consecutive batches of shard 0 ending at ``stops``."""
    starts = [0, *stops[:-1]]
    rows = np.array([[0, a, b] for a, b in zip(starts, stops, strict=True)], dtype=np.int64)
    parts = tuple(wire.Part(1, wire.BatchTag(3, 1, a)) for a in starts)
    frames, _ = serve_task(FakeCache({0: reader}), None, _spec(), Task(b"tok", 5, rows,
                                                                        parts=parts),
                           sizes=sizes)
    msg = wire.decode(frames)
    assert isinstance(msg, wire.BatchMsg)
    assert [b["x"].tolist() for b in wire.message_to_batches(msg)] == [
        list(range(a, b)) for a, b in zip(starts, stops, strict=True)]
    return msg


def _sized(nbytes: int, samples: int, token: bytes = b"tok") -> ReplySizes:
    """A reader's reply sizes whose last reply to ``token`` was ``samples`` samples in
    ``nbytes`` bytes."""
    sizes = ReplySizes()
    sizes.note(token, nbytes, samples)
    return sizes


def test_the_batches_of_a_task_of_many_that_continue_one_another_are_one_read() -> None:
    """A run of more than APART_PARTS consecutive small batches is read as one range (a slice
    of a map where one record batch holds it), not range by range or gathered, and cut back
    into its batches."""
    reader = CountingReader(20)
    stops = [2, 4, 6, 8, 10, 11][: APART_PARTS + 1]
    msg = _run_task(reader, stops, _sized(8, 1))
    assert reader.reads == [(0, stops[-1])] and not msg.apart


def test_the_batches_of_a_task_of_a_few_are_each_read_and_sent_apart() -> None:
    """At most APART_PARTS batches: each read alone (no copy joins them, wherever their rows
    lie) and sent apart, in frames of their own."""
    reader = CountingReader(20)
    stops = [4, 8, 10, 13][:APART_PARTS]
    msg = _run_task(reader, stops, _sized(8, 1))
    assert reader.reads == list(zip([0, *stops[:-1]], stops, strict=True)) and msg.apart


@pytest.mark.parametrize("sizes", [None, _sized(8, 1, b"other"), _sized(APART_BYTES, 12)])
def test_many_batches_of_unknown_size_or_apart_bytes_together_are_each_read_apart(
        sizes: ReplySizes | None) -> None:
    """More than APART_PARTS batches are read alone and sent apart when their session's last
    reply says that their samples (12) would take APART_BYTES or more, or the reader has not
    replied to their session yet."""
    stops = list(range(2, 14, 2))
    reader = CountingReader(20)
    msg = _run_task(reader, stops, sizes)
    assert msg.apart and reader.reads == list(zip([0, *stops[:-1]], stops, strict=True))


def test_each_reply_notes_its_size_for_the_next_task_of_its_session() -> None:
    sizes = ReplySizes()
    stops = list(range(2, 14, 2))
    assert _run_task(CountingReader(20), stops[:2], sizes).size == 4
    assert sizes.apart(b"other", APART_PARTS + 1, 10)
    assert not sizes.apart(b"tok", APART_PARTS + 1, 10)  # 8 bytes a sample (int64)
    assert not _run_task(CountingReader(20), stops, sizes).apart


def test_reply_sizes_send_apart_a_few_batches_many_bytes_or_batches_of_unknown_size() -> None:
    sizes = _sized(APART_BYTES, 100)
    assert sizes.apart(b"tok", 1, 10**9) and sizes.apart(b"tok", APART_PARTS, 1)
    assert not sizes.apart(b"tok", APART_PARTS + 1, 99) and not sizes.apart(b"tok", 64, 99)
    assert sizes.apart(b"tok", APART_PARTS + 1, 100) and sizes.apart(b"tok", 64, 10**6)
    assert sizes.apart(b"new", APART_PARTS + 1, 1)  # no reply to it yet
    sizes.note(b"tok", 300, 0)  # a reply with no samples says nothing
    assert not sizes.apart(b"tok", APART_PARTS + 1, 99)
    sizes.note(b"tok", 4 * APART_BYTES, 4)
    assert sizes.apart(b"tok", APART_PARTS + 1, 1)


def test_reply_sizes_keep_the_latest_sessions() -> None:
    sizes = ReplySizes()
    for i in range(SIZED_SESSIONS + 1):
        sizes.note(b"s%d" % i, 8, 1)
    assert sizes.apart(b"s0", APART_PARTS + 1, 1)  # forgotten: unknown
    assert not sizes.apart(b"s1", APART_PARTS + 1, 1)
    assert not sizes.apart(b"s%d" % SIZED_SESSIONS, APART_PARTS + 1, 1)
