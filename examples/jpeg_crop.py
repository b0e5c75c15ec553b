"""JPEG decode + random crop in the loader server's reader processes, reproducibly.

The transform (what the server runs)::

    dataflow-server --data 'shards/train-{000000..000003}.tar' --transform jpeg_crop:decode_crop

started in this directory (the server looks for the transform's module in the directory it
starts in, or in ``--transform-path DIR``). Every batch arrives with its JPEGs decoded and
cropped to ``CROP x CROP`` pixels at a random place drawn from ``ctx.rng()``: the same crop for
the same (DataLoader seed, epoch, global batch index) on any server, with any ``--workers``.

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

from dataflow.transform import Batch, Ragged, TransformContext

CROP = 32
"""Side of the square crop, in pixels."""


def decode_crop(batch: Batch, ctx: TransformContext) -> Batch:
    """Decode the ``jpg`` field and crop each image at random to ``CROP x CROP``.

    Args:
        batch: ``jpg`` is a :class:`~dataflow.transform.Ragged` of JPEG files (bytes), each at
            least ``CROP`` pixels wide and high; other fields pass through.
        ctx: the batch's context; its generator places the crops.

    Returns:
        The batch with ``jpg`` replaced by ``image``: uint8 ``(n, CROP, CROP, 3)`` RGB.
    """
    from PIL import Image  # the transform's own dependency, imported where it runs

    jpgs = batch.pop("jpg")
    if not isinstance(jpgs, Ragged):
        raise TypeError(f"field 'jpg' must hold JPEG files (bytes). Found: {type(jpgs).__name__}")
    rng = ctx.rng()
    out = np.empty((len(jpgs), CROP, CROP, 3), dtype=np.uint8)
    for i in range(len(jpgs)):
        with Image.open(io.BytesIO(jpgs.values[jpgs.offsets[i]:jpgs.offsets[i + 1]])) as img:
            rgb = img.convert("RGB")
        w, h = rgb.size
        x, y = int(rng.integers(0, w - CROP + 1)), int(rng.integers(0, h - CROP + 1))
        out[i] = np.asarray(rgb.crop((x, y, x + CROP, y + CROP)))
    batch["image"] = out
    return batch


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


def main(argv: list[str] | None = None) -> int:
    """Write shards, serve them with :func:`decode_crop`, read one epoch, print a summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the shards")
    p.add_argument("--samples", type=int, default=64, help="JPEGs to write (default: 64)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per batch (default: 8)")
    p.add_argument("--workers", type=int, default=2, help="server reader processes (default: 2)")
    args = p.parse_args(argv)

    from dataflow.client import DataLoader
    from dataflow.server import launch

    shards = write_shards(args.out, args.samples, per_shard=max(1, args.samples // 4))
    here = os.path.dirname(os.path.abspath(__file__))
    with launch(shards, workers=args.workers, cwd=here,
                extra_args=["--transform", "jpeg_crop:decode_crop"]) as server, \
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
