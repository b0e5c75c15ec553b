"""Deterministic demo datasets in every supported format.

Every sample has the same four fields in every format:

* ``id``: int64, unique, ``0 .. total - 1`` in shard order;
* ``label``: int64, ``id % 10``;
* ``image``: uint8 of shape ``image_shape`` (default ``(3, 64, 64)``), element ``k`` of the
  flattened image is ``(id + k) % 256``;
* ``text``: str, ``f"sample {id} "`` repeated 1-8 times (seeded).

Formats: Arrow IPC (``image`` as ``fixed_shape_tensor``; file or stream), Parquet (``image``
as ``fixed_size_list<uint8>`` with its shape in the field metadata ``dataflow.shape``;
~128-row row groups), WebDataset tar via ``webdataset.TarWriter`` (members ``KEY.id``,
``KEY.label``, ``KEY.image.npy``, ``KEY.text``).
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from dataflow.errors import ConfigError

FORMATS = ("arrow", "tar", "parquet")
ARROW_KINDS = ("file", "stream")
EXTENSIONS = {"arrow": "arrow", "tar": "tar", "parquet": "parquet"}
ROWS_PER_CHUNK = 128
TAR_MTIME = 1_700_000_000.25
"""Fixed member mtime: reproducible tars; fractional, so TarWriter writes its usual PAX
header per member, as in real WebDataset shards."""


@dataclass(frozen=True)
class DemoSpec:
    """What :func:`make_demo` writes.

    Attributes:
        fmt: ``"arrow"``, ``"tar"`` or ``"parquet"``.
        shards: number of shard files.
        samples_per_shard: mean samples per shard.
        uneven: draw each shard's size between ~0.25x and ~1.75x of ``samples_per_shard``.
        seed: seeds shard sizes and text lengths.
        image_shape: per-sample image shape.
        arrow_kind: ``"file"`` or ``"stream"`` (Arrow only).
    """

    fmt: str = "arrow"
    shards: int = 8
    samples_per_shard: int = 512
    uneven: bool = True
    seed: int = 0
    image_shape: tuple[int, ...] = (3, 64, 64)
    arrow_kind: str = "file"

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ConfigError(f"`fmt` must be one of {FORMATS}. Found: {self.fmt!r}")
        if self.shards < 1:
            raise ConfigError(f"`shards` must be at least 1. Found: {self.shards}")
        if self.samples_per_shard < 1:
            raise ConfigError(
                f"`samples_per_shard` must be at least 1. Found: {self.samples_per_shard}"
            )
        if not self.image_shape or min(self.image_shape) < 1:
            raise ConfigError(
                f"`image_shape` must be positive dimensions. Found: {self.image_shape}"
            )
        if self.arrow_kind not in ARROW_KINDS:
            raise ConfigError(
                f"`arrow_kind` must be one of {ARROW_KINDS}. Found: {self.arrow_kind!r}"
            )


@dataclass(frozen=True)
class DemoResult:
    """Shards written by :func:`make_demo`, in order, with their sample counts."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sizes)


def shard_sizes(spec: DemoSpec) -> list[int]:
    """Samples per shard: all ``samples_per_shard``, or seeded draws in [0.25x, 1.75x]."""
    m = spec.samples_per_shard
    if not spec.uneven:
        return [m] * spec.shards
    lo = max(1, math.ceil(0.25 * m))
    hi = max(lo, math.floor(1.75 * m))
    rng = np.random.default_rng(spec.seed)
    return [int(x) for x in rng.integers(lo, hi + 1, size=spec.shards)]


def demo_samples(spec: DemoSpec, shard: int, first_id: int, n: int) -> dict[str, np.ndarray]:
    """The samples of one shard as arrays.

    Returns:
        ``id`` and ``label`` int64 ``(n,)``, ``image`` uint8 ``(n, *image_shape)``, ``text``
        object array of ``n`` str.
    """
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    size = math.prod(spec.image_shape)
    ramp = (np.arange(size) % 256).astype(np.uint8)
    images = ((ids % 256).astype(np.uint8)[:, None] + ramp[None, :]).reshape(
        (n, *spec.image_shape)
    )
    reps = np.random.default_rng([spec.seed, shard]).integers(1, 9, size=n)
    texts = np.array([f"sample {i} " * r for i, r in zip(ids.tolist(), reps.tolist(), strict=True)],
                     dtype=object)
    return {"id": ids, "label": ids % 10, "image": images, "text": texts}


def _arrow_table(s: dict[str, np.ndarray]) -> pa.Table:
    return pa.table({
        "id": s["id"],
        "label": s["label"],
        "image": pa.FixedShapeTensorArray.from_numpy_ndarray(s["image"]),
        "text": pa.array(s["text"].tolist(), pa.string()),
    })


def _write_arrow(path: str, s: dict[str, np.ndarray], kind: str) -> None:
    table = _arrow_table(s)
    opener = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with pa.OSFile(path, "wb") as f, opener(f, table.schema) as w:
        w.write_table(table, max_chunksize=ROWS_PER_CHUNK)


def _write_parquet(path: str, s: dict[str, np.ndarray]) -> None:
    images = s["image"]
    size = math.prod(images.shape[1:])
    meta = {b"dataflow.shape": json.dumps(list(images.shape[1:])).encode("ascii")}
    schema = pa.schema([
        pa.field("id", pa.int64()),
        pa.field("label", pa.int64()),
        pa.field("image", pa.list_(pa.uint8(), size), metadata=meta),
        pa.field("text", pa.string()),
    ])
    image_col = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), size)
    table = pa.table([s["id"], s["label"], image_col, pa.array(s["text"].tolist(), pa.string())],
                     schema=schema)
    pq.write_table(table, path, row_group_size=ROWS_PER_CHUNK)


def _npy_bytes(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a, allow_pickle=False)
    return f.getvalue()


def _write_tar(path: str, s: dict[str, np.ndarray]) -> None:
    import webdataset

    with webdataset.TarWriter(path, mtime=TAR_MTIME) as w:
        for id_, label, image, text in zip(
            s["id"].tolist(), s["label"].tolist(), s["image"], s["text"], strict=True
        ):
            w.write({
                "__key__": f"{id_:09d}",
                "id": str(id_).encode("ascii"),
                "label": str(label).encode("ascii"),
                "image.npy": _npy_bytes(image),
                "text": text.encode("utf-8"),
            })


def make_demo(out: str, spec: DemoSpec, *, progress: TextIO | None = sys.stderr) -> DemoResult:
    """Write a demo dataset into directory ``out`` (created if missing).

    Shards are named ``train-000000.<ext>`` and so on. The same ``spec`` always writes the
    same samples.

    Args:
        out: output directory.
        spec: what to write.
        progress: stream for a progress bar (tqdm, shown only when the stream is a
            terminal), or ``None`` for silence.
    """
    os.makedirs(out, exist_ok=True)
    sizes = shard_sizes(spec)
    bar = tqdm(total=len(sizes), desc=f"writing {spec.fmt} shards", unit="shard", file=progress,
               disable=True if progress is None else None)
    paths = []
    first = 0
    for shard, n in enumerate(sizes):
        path = os.path.join(out, f"train-{shard:06d}.{EXTENSIONS[spec.fmt]}")
        s = demo_samples(spec, shard, first, n)
        if spec.fmt == "arrow":
            _write_arrow(path, s, spec.arrow_kind)
        elif spec.fmt == "parquet":
            _write_parquet(path, s)
        else:
            _write_tar(path, s)
        paths.append(path)
        first += n
        bar.update()
    bar.close()
    return DemoResult(tuple(paths), tuple(sizes))


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,64,64"`` -> ``(3, 64, 64)``.

    Raises:
        ConfigError: not a comma-separated list of positive ints.
    """
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError as e:
        raise ConfigError(f"`image_shape` must look like 3,64,64. Found: {text!r}") from e
    return shape


def describe(result: DemoResult) -> str:
    """One line summarising a written dataset."""
    sizes: Sequence[int] = result.sizes
    return (f"wrote {len(sizes)} shard(s), {result.total} samples "
            f"(per shard: min {min(sizes)}, max {max(sizes)})")
