"""A real decode workload: JPEG tar shards, and the decode + random crop both sides run.

The server side runs :func:`decode_crop` as its per-batch transform
(``--transform dataflow.bench.experiments.jpeg:decode_crop``), or the same work in two stages,
:data:`STAGES` (:func:`decode`, cacheable, then :func:`crop`, seeded by the batch's context:
:mod:`.cache`); the torch side runs
:func:`crop_sample` on each sample in its webdataset pipeline, then stacks the batch in the
worker. Both decode with
Pillow (the same calls, the same crop), so the comparison is of the loaders, not the decoders.

Images are ``SIDE`` x ``SIDE`` by default (about 25 KB as JPEG, 0.3 ms to decode here); shards of
another size (``write_shards(size=...)``, e.g. ImageNet's most common 500x375) are decoded as
ImageNet training pipelines do: resized to ``SIDE`` on the shorter side (bilinear) and
center-cropped to ``SIDE`` x ``SIDE``, before the random ``CROP`` crop. The decoded pixels are
``SIDE`` x ``SIDE`` x 3 whatever the size, so the cache's entries are the same.
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


def _image(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A photo-like RGB image of ``size`` (width, height): smooth gradients plus grain (about
    25 KB as JPEG at 256x256, 70 KB at 500x375)."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / max(size)
    phase = rng.uniform(0, 2 * np.pi, 3)
    base = np.stack([np.sin(3 * x + 2 * y + p) for p in phase], axis=-1) * 90 + 128
    grain = rng.normal(0, 12, (height, width, 3))
    return np.clip(base + grain, 0, 255).astype(np.uint8)


def parse_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (e.g. ``500x375``) as ``(width, height)``, each at least ``SIDE``.

    Raises:
        ValueError: anything else (argparse reports it as the option's error).
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"an image size is WIDTHxHEIGHT, e.g. 500x375. Found: {text!r}")
    width, height = int(parts[0]), int(parts[1])
    if min(width, height) < SIDE:
        raise ValueError(f"an image size must be at least {SIDE} on each side. Found: {text!r}")
    return width, height


def write_shards(out: str, shards: int, per_shard: int,
                 size: tuple[int, int] = (SIDE, SIDE)) -> list[str]:
    """Tar shards of ``jpg`` + ``id`` members written by webdataset's TarWriter (PAX headers,
    as real datasets have), images of ``size`` (width, height); reused when present (``out``
    must hold one size only).

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
                Image.fromarray(_image(rng, size)).save(buf, format="JPEG", quality=QUALITY)
                sid = s * per_shard + i
                w.write({"__key__": f"{sid:09d}", "jpg": buf.getvalue(),
                         "id": str(sid).encode("ascii")})
        os.replace(tmp, path)
    return paths


def _pixels(data: bytes) -> Image.Image:
    """The JPEG ``data`` decoded to RGB, ``SIDE`` x ``SIDE`` (resized on the shorter side and
    center-cropped when it is another size)."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    if (w, h) == (SIDE, SIDE):
        return rgb
    scale = SIDE / min(w, h)
    w, h = max(SIDE, round(w * scale)), max(SIDE, round(h * scale))
    left, top = (w - SIDE) // 2, (h - SIDE) // 2
    return rgb.resize((w, h), Image.Resampling.BILINEAR).crop(
        (left, top, left + SIDE, top + SIDE))


def _crop(data: bytes | str | np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if not isinstance(data, bytes):
        raise TypeError(f"a JPEG must be bytes. Found: {type(data).__name__}")
    rgb = _pixels(data)
    x, y = int(rng.integers(0, SIDE - CROP + 1)), int(rng.integers(0, SIDE - CROP + 1))
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
    """Cacheable stage: ``jpg`` bytes -> ``pixels`` uint8 (n, SIDE, SIDE, 3) (resized and
    center-cropped when another size, see the module); ``id`` passes through."""
    jpg = batch["jpg"]
    if not isinstance(jpg, Ragged):
        raise TypeError(f"field 'jpg' must be bytes. Found: {type(jpg).__name__}")
    out = np.empty((len(jpg), SIDE, SIDE, 3), dtype=np.uint8)
    for i in range(len(jpg)):
        out[i] = np.asarray(_pixels(jpg.values[jpg.offsets[i]:jpg.offsets[i + 1]].tobytes()))
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
