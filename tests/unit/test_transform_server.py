"""Loading a transform (sys.path, then the start directory) and running it in a reader's task."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataflow import wire
from dataflow.batch import Ragged
from dataflow.errors import ConfigError, TransformError
from dataflow.server.tasks import ReaderCache, WorkerSpec, serve_task
from dataflow.server.transform import Transform, apply_transform, load_transform
from dataflow.transform import TransformContext, batch_seed
from dataflow.wire.internal import Task

MODULE = '''
import numpy as np

def with_ctx(batch, ctx):
    batch["r"] = np.full(len(batch["x"]), ctx.rng().integers(0, 2**62), dtype=np.int64)
    batch["g"] = np.full(len(batch["x"]), ctx.batch_index, dtype=np.int64)
    return batch

def plain(batch):
    batch["x"] = batch["x"] * 2
    return batch

def broken(batch, ctx):
    raise KeyError("no such field")

def shrinks(batch):
    return {"x": batch["x"][:1]}

def scalar(batch):
    return {"x": np.int64(3)}

NOT_CALLABLE = 3
'''


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory holding ``xform_mod.py``; the module is forgotten afterwards."""
    (tmp_path / "xform_mod.py").write_text(MODULE)
    yield tmp_path
    sys.modules.pop("xform_mod", None)


def test_a_module_not_on_sys_path_is_found_in_the_directory_only(module_dir: Path) -> None:
    assert str(module_dir) not in sys.path
    with pytest.raises(ConfigError, match="no module 'xform_mod' on sys.path$"):
        load_transform("xform_mod:plain")
    t = load_transform("xform_mod:plain", str(module_dir))
    assert not t.with_context and t.spec == "xform_mod:plain"
    assert str(module_dir) not in sys.path
    assert load_transform("xform_mod:with_ctx", str(module_dir)).with_context


def test_the_directory_never_shadows_an_importable_module(tmp_path: Path) -> None:
    # An impostor `json.py` (and a `dataflow/` package) in the start directory are ignored.
    (tmp_path / "json.py").write_text("def dumps(x):\n    return 'impostor'\n")
    (tmp_path / "dataflow").mkdir()
    (tmp_path / "dataflow" / "__init__.py").write_text("raise RuntimeError('impostor')\n")
    assert load_transform("json:dumps", str(tmp_path)).func([1]) == "[1]"
    assert load_transform("dataflow.transform:batch_seed", str(tmp_path)).func(0, 0, 0) >= 0


def test_a_package_in_the_directory_imports_its_submodule(tmp_path: Path) -> None:
    pkg = tmp_path / "xform_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("SCALE = 3\n")
    (pkg / "ops.py").write_text("from .helpers import SCALE\n\ndef f(batch):\n"
                                "    return {'x': batch['x'] * SCALE}\n")
    try:
        t = load_transform("xform_pkg.ops:f", str(tmp_path))
        assert t.func({"x": np.arange(2)})["x"].tolist() == [0, 3]
    finally:
        for name in ("xform_pkg", "xform_pkg.ops", "xform_pkg.helpers"):
            sys.modules.pop(name, None)


def test_load_errors_name_the_spec(module_dir: Path) -> None:
    (module_dir / "bad_mod.py").write_text("raise ValueError('boom at import')\n")
    try:
        with pytest.raises(ConfigError, match="'bad_mod:f': cannot import 'bad_mod': "
                                              "ValueError: boom at import"):
            load_transform("bad_mod:f", str(module_dir))
        assert "bad_mod" not in sys.modules
    finally:
        sys.modules.pop("bad_mod", None)
    with pytest.raises(ConfigError, match="has no callable 'NOT_CALLABLE'"):
        load_transform("xform_mod:NOT_CALLABLE", str(module_dir))
    with pytest.raises(ConfigError, match=f"no module 'nowhere' on sys.path or in {module_dir}"):
        load_transform("nowhere:f", str(module_dir))


CTX = TransformContext(11, 2, 9, (("a.tar", 0, 3),))


@pytest.mark.parametrize("name, match", [
    ("broken", r"transform 'xform_mod:broken' on batch 9 of epoch 2 \(a.tar\[0:3\]\): KeyError"),
    ("shrinks", r"field 'x' has 1 sample\(s\) for a batch of 3"),
    ("scalar", r"field 'x' must be a numpy array of shape \(n, ...\) or a Ragged. Found: int64"),
])
def test_apply_errors_name_the_transform_and_the_batch(module_dir: Path, name: str,
                                                       match: str) -> None:
    t = load_transform(f"xform_mod:{name}", str(module_dir))
    with pytest.raises(TransformError, match=match):
        apply_transform(t, {"x": np.arange(3)}, CTX)


def test_apply_refuses_what_is_not_a_batch() -> None:
    ragged = Ragged(np.zeros(0, np.uint8), np.zeros(4, np.int64), "bytes")
    for out, match in ((None, "must return a dict batch. Found: NoneType"),
                       ({}, "returned a batch with no fields")):
        with pytest.raises(TransformError, match=match):
            apply_transform(Transform("m:f", lambda b, o=out: o, False), {"x": ragged}, CTX)
    ok = apply_transform(Transform("m:f", lambda b: {"y": ragged}, False), {"x": ragged}, CTX)
    assert set(ok) == {"y"}


def _arrow_shard(path: Path, n: int, first: int) -> str:
    table = pa.table({"x": pa.array(range(first, first + n), pa.int64())})
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return str(path)


def _spec(tmp_path: Path, transform: str) -> WorkerSpec:
    shards = (_arrow_shard(tmp_path / "a.arrow", 10, 0),
              _arrow_shard(tmp_path / "b.arrow", 10, 100))
    return WorkerSpec("ipc://@x", 8, shards, None, transform, "raise", 1, 20, 1 << 30,
                      str(tmp_path) + "/", 16, transform_path=str(tmp_path))


def test_serve_task_gives_the_transform_the_tag_derived_context(module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:with_ctx")
    t = load_transform("xform_mod:with_ctx", spec.transform_path)
    readers = ReaderCache(spec)
    rows = np.array([[0, 2, 4], [1, 0, 1]], dtype=np.int64)
    try:
        replies = [wire.decode(serve_task(readers, t, spec, Task(b"tok", 1, rows, tag))[0])
                   for tag in (wire.BatchTag(4, 1, 6), wire.BatchTag(4, 1, 6),
                               wire.BatchTag(4, 1, 7))]
    finally:
        readers.close()
    batches = [wire.message_to_batch(m) for m in replies if isinstance(m, wire.BatchMsg)]
    assert len(batches) == 3
    expected = np.random.default_rng(batch_seed(4, 1, 6)).integers(0, 2**62)
    assert batches[0]["x"].tolist() == [2, 3, 100]
    assert batches[0]["r"].tolist() == [expected] * 3 == batches[1]["r"].tolist()
    assert batches[0]["g"].tolist() == [6] * 3 and batches[2]["g"].tolist() == [7] * 3
    assert batches[2]["r"][0] != expected


def test_serve_task_answers_a_transform_error_with_an_error_naming_the_batch(
        module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:broken")
    t = load_transform("xform_mod:broken", spec.transform_path)
    readers = ReaderCache(spec)
    try:
        frames, _ = serve_task(readers, t, spec, Task(b"tok", 5, np.array([[1, 3, 5]]),
                                                       wire.BatchTag(0, 3, 12)))
    finally:
        readers.close()
    msg = wire.decode(frames)
    assert isinstance(msg, wire.ErrorMsg) and msg.req_id == 5
    assert msg.kind is wire.ErrorKind.READ_FAILED
    assert msg.message == ("TransformError: transform 'xform_mod:broken' on batch 12 of epoch 3 "
                           "(b.arrow[3:5]): KeyError: 'no such field'")
