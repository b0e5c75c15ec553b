"""A real decode workload: JPEG tar shards, and the decode + random crop both sides run.

The server side runs :func:`decode_crop` as its per-batch transform
(``--transform dataflow.bench.experiments.jpeg:decode_crop``), or the same work in two stages,
:data:`STAGES` (:func:`decode`, cacheable, then :func:`crop`, seeded by the batch's context:
:mod:`.cache`); the torch side runs
:func:`crop_sample` on each sample in its webdataset pipeline, then stacks the batch in the
worker. Both decode with
Pillow (the same calls, the same crop), so the comparison is of the loaders, not the decoders.
This module imports no torch: reader processes import it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

from dataflow.batch import Batch, Ragged
from dataflow.transform import Stages, TransformContext

SIDE = 256
CROP = 224
QUALITY = 90


def _image(rng: np.random.Generator) -> np.ndarray:
    """A photo-like RGB image: smooth gradients plus grain (about 20 KB as JPEG)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    phase = rng.uniform(0, 2 * np.pi, 3)
    base = np.stack([np.sin(3 * x + 2 * y + p) for p in phase], axis=-1) * 90 + 128
    grain = rng.normal(0, 12, (SIDE, SIDE, 3))
    return np.clip(base + grain, 0, 255).astype(np.uint8)


def write_shards(out: str, shards: int, per_shard: int) -> list[str]:
    """Tar shards of ``jpg`` + ``id`` members written by webdataset's TarWriter (PAX headers,
    as real datasets have); reused when present.

    Returns:
        The shard paths.
    """
    import webdataset

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        path = os.path.join(out, f"jpeg-{s:04d}.tar")
        paths.append(path)
        if os.path.exists(path):
            continue
        tmp = path + ".part"
        with webdataset.TarWriter(tmp) as w:
            for i in range(per_shard):
                buf = io.BytesIO()
                Image.fromarray(_image(rng)).save(buf, format="JPEG", quality=QUALITY)
                sid = s * per_shard + i
                w.write({"__key__": f"{sid:09d}", "jpg": buf.getvalue(),
                         "id": str(sid).encode("ascii")})
        os.replace(tmp, path)
    return paths


def _crop(data: bytes | str | np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if not isinstance(data, bytes):
        raise TypeError(f"a JPEG must be bytes. Found: {type(data).__name__}")
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    x, y = int(rng.integers(0, w - CROP + 1)), int(rng.integers(0, h - CROP + 1))
    return np.asarray(rgb.crop((x, y, x + CROP, y + CROP)))


def decode_crop(batch: Batch) -> Batch:
    """Server transform: ``jpg`` bytes -> ``image`` uint8 (batch, 224, 224, 3), random crops;
    ``id`` passes through."""
    jpg = batch["jpg"]
    if not isinstance(jpg, Ragged):
        raise TypeError(f"field 'jpg' must be bytes. Found: {type(jpg).__name__}")
    rng = np.random.default_rng()
    images = np.stack([_crop(jpg[i], rng) for i in range(len(jpg))])
    return {"image": images, "id": batch["id"]}


def decode(batch: Batch) -> Batch:
    """Cacheable stage: ``jpg`` bytes -> ``pixels`` uint8 (n, SIDE, SIDE, 3); ``id`` passes
    through."""
    jpg = batch["jpg"]
    if not isinstance(jpg, Ragged):
        raise TypeError(f"field 'jpg' must be bytes. Found: {type(jpg).__name__}")
    out = np.empty((len(jpg), SIDE, SIDE, 3), dtype=np.uint8)
    for i in range(len(jpg)):
        with Image.open(io.BytesIO(jpg.values[jpg.offsets[i]:jpg.offsets[i + 1]].tobytes())
                        ) as im:
            out[i] = np.asarray(im.convert("RGB"))
    return {"pixels": out, "id": batch["id"]}


def crop(batch: Batch, ctx: TransformContext) -> Batch:
    """Random stage: ``pixels`` -> ``image`` uint8 (n, CROP, CROP, 3), crops drawn from
    ``ctx.rng()``."""
    pixels = batch["pixels"]
    if isinstance(pixels, Ragged):
        raise TypeError("field 'pixels' must be as decode returns it")
    rng = ctx.rng()
    at = rng.integers(0, SIDE - CROP + 1, (len(pixels), 2))
    images = np.stack([p[y:y + CROP, x:x + CROP] for p, (y, x) in zip(pixels, at, strict=True)])
    return {"image": images, "id": batch["id"]}


STAGES = Stages(decode, crop)
"""``--transform dataflow.bench.experiments.jpeg:STAGES`` (with ``--cache-memory``)."""


def crop_sample(sample: Mapping[str, object]) -> dict[str, object]:
    """The same decode for one webdataset sample (``jpg`` and ``id`` raw bytes)."""
    jpg, sid = sample["jpg"], sample["id"]
    if not isinstance(jpg, bytes) or not isinstance(sid, bytes):
        raise TypeError(f"sample {sample.get('__key__')!r}: 'jpg' and 'id' must be raw bytes")
    return {"image": _crop(jpg, np.random.default_rng()), "id": int(sid)}


def stack_samples(samples: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Collate decoded samples in the worker: one uint8 array and one int64 array."""
    return {"image": np.stack([s["image"] for s in samples]),
            "id": np.array([s["id"] for s in samples], dtype=np.int64)}
