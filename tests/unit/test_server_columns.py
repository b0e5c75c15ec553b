"""A session's column subset in a reader's task: kept after the transform, from real shards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataflow import wire
from dataflow.batch import Batch, Ragged
from dataflow.index.scan import build_index
from dataflow.server.tasks import ReaderCache, WorkerSpec, serve_task
from dataflow.server.transform import Transform, load_transform
from dataflow.wire.internal import Task

N = 12
MODULE = '''
import numpy as np

def count_fields(batch):
    batch["count"] = np.full(len(batch["id"]), len(batch), dtype=np.int64)
    return batch

def drops_text(batch):
    del batch["text"]
    return batch
'''
ALL = ["id", "text", "meta.source", "meta.source.valid", "meta.score", "meta.score.valid",
       "tags", "count", "count.valid"]


def _shard(path: Path, first: int) -> str:
    ids = range(first, first + N)
    table = pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": pa.array([f"t{i}" for i in ids]),
        "meta": pa.array([None if i % 4 == 0 else {"source": f"s{i}", "score": i / 2}
                          for i in ids],
                         pa.struct([("source", pa.string()), ("score", pa.float64())])),
        "tags": pa.array([list(range(i % 3)) for i in ids], pa.list_(pa.int64())),
        "count": pa.array([None if i % 3 == 0 else i for i in ids], pa.int64()),
    })
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return str(path)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[WorkerSpec, ReaderCache]]:
    """A worker's spec and readers over two Arrow shards (ids 0-11 and 100-111), with
    ``xcols_mod`` (the transforms above) in ``tmp_path``."""
    (tmp_path / "xcols_mod.py").write_text(MODULE)
    shards = (_shard(tmp_path / "a.arrow", 0), _shard(tmp_path / "b.arrow", 100))
    index = build_index(list(shards))
    assert [f.name for f in index.schema] == ALL
    spec = WorkerSpec("ipc://@x", 8, shards, None, None, "raise", 1, 20, 1 << 30,
                      str(tmp_path) + "/", 16, read=index.read, transform_path=str(tmp_path))
    readers = ReaderCache(spec)
    try:
        yield spec, readers
    finally:
        readers.close()
        sys.modules.pop("xcols_mod", None)


ROWS = np.array([[0, 2, 6], [1, 0, 3]], dtype=np.int64)
IDS = [2, 3, 4, 5, 100, 101, 102]


def _serve(served: tuple[WorkerSpec, ReaderCache], columns: tuple[str, ...] | None,
           transform: Transform | None = None) -> wire.Message:
    spec, readers = served
    frames, _ = serve_task(readers, transform, spec,
                           Task(b"tok", 9, ROWS, wire.BatchTag(0, 1, 4), columns))
    return wire.decode(frames)


def _batch(msg: wire.Message) -> Batch:
    assert isinstance(msg, wire.BatchMsg), msg
    return wire.message_to_batch(msg)


@pytest.mark.parametrize("columns, kept", [
    (None, ALL),
    (("id",), ["id"]),
    (("id", "meta"), ["id", "meta.source", "meta.source.valid", "meta.score",
                      "meta.score.valid"]),
    (("meta.score", "id"), ["id", "meta.score", "meta.score.valid"]),
    (("text", "tags"), ["text", "tags"]),
    (("count",), ["count", "count.valid"]),
    (("count.valid",), ["count.valid"]),
    (tuple(ALL), ALL),
], ids=lambda v: ",".join(v) if isinstance(v, tuple) else None)
def test_the_reply_keeps_the_asked_fields_with_their_offsets_and_masks(
        served, columns: tuple[str, ...] | None, kept: list[str]) -> None:
    msg = _serve(served, columns)
    batch = _batch(msg)
    assert list(batch) == kept
    assert msg.size == len(IDS)
    if "id" in batch:
        assert batch["id"].tolist() == IDS
    if "meta.score" in batch:
        valid = [i % 4 != 0 for i in IDS]
        assert batch["meta.score.valid"].tolist() == valid
        score = batch["meta.score"]
        mask = np.array(valid)
        assert np.isnan(score[~mask]).all()  # a null float is NaN
        assert score[mask].tolist() == [i / 2 for i in IDS if i % 4]
    if "text" in batch:
        text = batch["text"]
        assert isinstance(text, Ragged)
        assert [text[k] for k in range(len(IDS))] == [f"t{i}" for i in IDS]
        names = [a.name for a in msg.arrays]
        assert "text.offsets" in names and names.index("text.offsets") == names.index("text") + 1


def test_the_transform_sees_every_served_field_and_the_subset_is_kept_after_it(served) -> None:
    spec, _ = served
    transform = load_transform("xcols_mod:count_fields", spec.transform_path)
    batch = _batch(_serve(served, ("id", "count"), transform))
    assert list(batch) == ["id", "count", "count.valid"]
    assert batch["count"].tolist() == [len(ALL)] * len(IDS)


def test_a_field_the_transform_removed_is_a_read_error_naming_it_and_the_transform(
        served) -> None:
    spec, _ = served
    transform = load_transform("xcols_mod:drops_text", spec.transform_path)
    assert list(_batch(_serve(served, ("id", "tags"), transform))) == ["id", "tags"]
    msg = _serve(served, ("id", "text"), transform)
    assert isinstance(msg, wire.ErrorMsg) and msg.req_id == 9
    assert msg.kind is wire.ErrorKind.READ_FAILED
    assert msg.message.startswith("TransformError: transform 'xcols_mod:drops_text' on batch 4 "
                                  "of epoch 1 (a.arrow[2:6], b.arrow[0:3]): removed field(s) "
                                  "['text'] that the client asked for")
