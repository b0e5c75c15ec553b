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
from dataflow.server.samplecache import SampleCache
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

from dataflow.transform import Stages

DECODED = []

def dec(batch):
    DECODED.extend(batch["x"].tolist())
    return {"x": batch["x"], "sq": batch["x"] ** 2}

def aug(batch, ctx):
    batch["r"] = ctx.rng().integers(0, 2**62, len(batch["x"]))
    return batch

def padded(batch):
    n = len(batch["x"])
    return {"x": batch["x"], "pad": np.zeros((n, n), np.uint8)}

STAGES = Stages(dec, aug)
DECODE_ONLY = Stages(dec, version="7")
PADDED = Stages(padded)
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
    with pytest.raises(ConfigError, match="has no callable or Stages 'NOT_CALLABLE'"):
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


def test_a_stages_transform_loads_its_two_stages_and_the_decode_identity(
        module_dir: Path) -> None:
    t = load_transform("xform_mod:STAGES", str(module_dir))
    assert t.decode is not None and t.with_context and t.identity == "xform_mod:dec@1"
    only = load_transform("xform_mod:DECODE_ONLY", str(module_dir))
    assert only.func is None and only.identity == "xform_mod:dec@7"
    plain = load_transform("xform_mod:plain", str(module_dir))
    assert plain.decode is None and plain.identity == ""


def _serve(spec: WorkerSpec, t: Transform, tasks: list[tuple[np.ndarray, wire.BatchTag]],
           cache: SampleCache | None) -> list[tuple[dict, object]]:
    readers = ReaderCache(spec)
    out = []
    try:
        for i, (rows, tag) in enumerate(tasks):
            frames, sent = serve_task(readers, t, spec, Task(b"tok", i, rows, tag), None, cache)
            msg = wire.decode(frames)
            assert isinstance(msg, wire.BatchMsg), msg
            out.append((wire.message_to_batch(msg), sent))
    finally:
        readers.close()
    return out


def test_the_cache_serves_what_the_uncached_stages_serve_decoding_each_sample_once(
        module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:STAGES")
    t = load_transform("xform_mod:STAGES", spec.transform_path)
    decoded = sys.modules["xform_mod"].DECODED
    tasks = [(np.array([[0, 2, 4], [1, 0, 1]]), wire.BatchTag(4, 0, 6)),
             (np.array([[1, 0, 2], [0, 3, 6]]), wire.BatchTag(9, 1, 2)),
             (np.array([[0, 2, 6], [1, 0, 2]]), wire.BatchTag(4, 2, 0))]
    plain = _serve(spec, t, tasks, None)
    assert len(decoded) == 3 + 5 + 6
    decoded.clear()
    cached = _serve(spec, t, tasks, SampleCache(1 << 20))
    assert decoded == [2, 3, 100, 101, 4, 5]  # only the misses, once each
    for (a, _), (b, _) in zip(plain, cached, strict=True):
        assert list(a) == list(b) == ["x", "sq", "r"]
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [(s.cache_hits, s.cache_misses) for _, s in cached] == [(0, 3), (2, 3), (6, 0)]
    assert cached[-1][1].cache_bytes > 0 and cached[-1][1].cache_evictions == 0
    assert cached[0][0]["x"].tolist() == [2, 3, 100]


def test_a_small_cache_stays_in_its_bound_and_still_serves_every_sample(
        module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:DECODE_ONLY")
    t = load_transform("xform_mod:DECODE_ONLY", spec.transform_path)
    cache = SampleCache(1200)
    rows = np.array([[0, 0, 10], [1, 0, 10]])
    for batch, sent in _serve(spec, t, [(rows, wire.BatchTag(0, e, 0)) for e in range(3)],
                              cache):
        assert batch["x"].tolist() == [*range(10), *range(100, 110)]
        assert batch["sq"].tolist() == [x * x for x in batch["x"].tolist()]
        assert 0 < sent.cache_bytes <= 1200 and sent.cache_evictions > 0


def test_a_decode_that_depends_on_its_batch_fails_the_request_naming_it(
        module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:PADDED")
    t = load_transform("xform_mod:PADDED", spec.transform_path)
    readers = ReaderCache(spec)
    cache = SampleCache(1 << 20)
    try:
        serve_task(readers, t, spec, Task(b"tok", 0, np.array([[0, 0, 1]])), None, cache)
        frames, _ = serve_task(readers, t, spec, Task(b"tok", 1, np.array([[0, 0, 3]])), None,
                               cache)
    finally:
        readers.close()
    msg = wire.decode(frames)
    assert isinstance(msg, wire.ErrorMsg) and msg.kind is wire.ErrorKind.READ_FAILED
    assert msg.message.startswith("TransformError: transform 'xform_mod:PADDED' (decode) on "
                                  "batch 0 of epoch 0 (a.arrow[0:3]): the decode stage gave "
                                  "samples of different")


def test_a_one_stage_transform_is_never_cached(module_dir: Path) -> None:
    spec = _spec(module_dir, "xform_mod:plain")
    t = load_transform("xform_mod:plain", spec.transform_path)
    cache = SampleCache(1 << 20)
    rows = np.array([[0, 0, 3]])
    served = _serve(spec, t, [(rows, wire.BatchTag(0, 0, 0))] * 2, cache)
    assert [b["x"].tolist() for b, _ in served] == [[0, 2, 4]] * 2
    assert len(cache) == 0 and cache.counts().misses == 0
    assert all(s.cache_hits == s.cache_misses == s.cache_bytes == 0 for _, s in served)
