"""JPEG decode + random crop in the loader server's reader processes, reproducibly.

The transform (what the server runs), in two stages, the decoded images cached::

    dataflow-server --data 'shards/train-{000000..000003}.tar' --transform jpeg_crop:STAGES \
        --cache-memory 1G

started in this directory (the server looks for the transform's module in the directory it
starts in, or in ``--transform-path DIR``). :func:`decode` turns each JPEG into its RGB pixels
(deterministic: the server caches them, so a JPEG is decoded once for every epoch and every job
on the server); :func:`crop` cuts a ``CROP x CROP`` square at a random place drawn from
``ctx.rng()`` on every batch: the same crop for the same (DataLoader seed, epoch, global batch
index) on any server, with any ``--workers``, cached or not. ``jpeg_crop:decode_crop`` is the
same work as one stage (never cached), with the same crops.

The whole round trip (needs Pillow, and torch for the DataLoader)::

    python examples/jpeg_crop.py --out /tmp/jpeg-demo

writes ``--samples`` random JPEGs with Pillow into WebDataset shards (``webdataset.ShardWriter``),
starts a server on them with this transform, reads one epoch with the DataLoader and prints
one JSON line: samples read, the image batch shape and dtype, and a checksum of the pixels.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

from dataflow.transform import Batch, Ragged, Stages, TransformContext

CROP = 32
"""Side of the square crop, in pixels."""


def decode(batch: Batch) -> Batch:
    """Decode the ``jpg`` field of each sample alone (the cacheable stage).

    Args:
        batch: ``jpg`` is a :class:`~dataflow.transform.Ragged` of JPEG files (bytes); other
            fields pass through.

    Returns:
        The batch with ``jpg`` replaced by ``rgb``, a ``Ragged`` (kind ``list``) of each
        image's uint8 pixels in ``(height, width, 3)`` order, and ``rgb_shape``, int64
        ``(n, 2)``: each image's height and width.
    """
    from PIL import Image  # the transform's own dependency, imported where it runs

    jpgs = batch.pop("jpg")
    if not isinstance(jpgs, Ragged):
        raise TypeError(f"field 'jpg' must hold JPEG files (bytes). Found: {type(jpgs).__name__}")
    pixels, shapes = [], np.empty((len(jpgs), 2), dtype=np.int64)
    for i in range(len(jpgs)):
        with Image.open(io.BytesIO(jpgs.values[jpgs.offsets[i]:jpgs.offsets[i + 1]])) as img:
            rgb = np.asarray(img.convert("RGB"))
        shapes[i] = rgb.shape[:2]
        pixels.append(rgb.reshape(-1))
    offsets = np.zeros(len(jpgs) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pixels], out=offsets[1:])
    values = np.concatenate(pixels) if pixels else np.zeros(0, np.uint8)
    batch["rgb"] = Ragged(values, offsets, "list")
    batch["rgb_shape"] = shapes
    return batch


def crop(batch: Batch, ctx: TransformContext) -> Batch:
    """Crop each decoded image at random to ``CROP x CROP`` (the random stage).

    Args:
        batch: as :func:`decode` returns it, each image at least ``CROP`` pixels wide and high.
        ctx: the batch's context; its generator places the crops.

    Returns:
        The batch with ``rgb`` and ``rgb_shape`` replaced by ``image``: uint8
        ``(n, CROP, CROP, 3)`` RGB.
    """
    rgb, shapes = batch.pop("rgb"), batch.pop("rgb_shape")
    if not isinstance(rgb, Ragged) or isinstance(shapes, Ragged):
        raise TypeError("fields 'rgb' and 'rgb_shape' must be as jpeg_crop.decode returns them")
    rng = ctx.rng()
    out = np.empty((len(rgb), CROP, CROP, 3), dtype=np.uint8)
    for i in range(len(rgb)):
        h, w = (int(v) for v in shapes[i])
        image = rgb.values[rgb.offsets[i]:rgb.offsets[i + 1]].reshape(h, w, 3)
        x, y = int(rng.integers(0, w - CROP + 1)), int(rng.integers(0, h - CROP + 1))
        out[i] = image[y:y + CROP, x:x + CROP]
    batch["image"] = out
    return batch


STAGES = Stages(decode, crop, version="1")
"""The two stages, for ``--transform jpeg_crop:STAGES`` (with ``--cache-memory``)."""


def decode_crop(batch: Batch, ctx: TransformContext) -> Batch:
    """:func:`decode` then :func:`crop` as one stage (never cached): the same crops."""
    return crop(decode(batch), ctx)


def write_shards(out: Path, samples: int, per_shard: int, seed: int = 0) -> list[str]:
    """Write ``samples`` random JPEGs (``cls`` = sample number) into WebDataset shards.

    Returns:
        The shard paths.
    """
    import webdataset as wds
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(samples):
            h, w = (int(v) for v in rng.integers(CROP, 2 * CROP, 2))
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            jpg = io.BytesIO()
            Image.fromarray(pixels).save(jpg, format="JPEG", quality=90)
            sink.write({"__key__": f"{i:06d}", "jpg": jpg.getvalue(), "cls": i})
    return sorted(str(p) for p in out.glob("train-*.tar"))


def build_parser() -> argparse.ArgumentParser:
    """The example's command line (the docs test parses the commands the docs give with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the shards")
    p.add_argument("--samples", type=int, default=64, help="JPEGs to write (default: 64)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per batch (default: 8)")
    p.add_argument("--workers", type=int, default=2, help="server reader processes (default: 2)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Write shards, serve them with :data:`STAGES` (cached), read one epoch, print a summary."""
    args = build_parser().parse_args(argv)

    from dataflow.client import DataLoader
    from dataflow.server import launch

    shards = write_shards(args.out, args.samples, per_shard=max(1, args.samples // 4))
    here = os.path.dirname(os.path.abspath(__file__))
    with launch(shards, workers=args.workers, cwd=here,
                extra_args=["--transform", "jpeg_crop:STAGES", "--cache-memory", "256M"]
                ) as server, \
            DataLoader(server.endpoint, batch_size=args.batch_size, rank=0, world_size=1,
                       seed=0) as loader:
        seen, shape, dtype, checksum = [], None, None, 0
        for batch in loader:
            seen.extend(batch["cls"].tolist())
            shape, dtype = list(batch["image"].shape), str(batch["image"].dtype)
            checksum = (checksum * 31 + int(batch["image"].sum())) % 2**61
    print(json.dumps({"samples": len(seen), "distinct": len(set(seen)), "last_shape": shape,
                      "dtype": dtype, "checksum": checksum}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
