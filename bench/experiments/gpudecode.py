"""Where a batch's GPU decode goes: torchvision's ``decode_jpeg`` alone, the crops, the whole
decode stage of the DataLoader; wall and CPU time of one thread per batch (needs CUDA and a
torchvision whose ``decode_jpeg`` takes a ``device``).

On the JPEG shards of :mod:`.jpeg` (written once under ``--out``), one thread, the clock
stopped after a ``torch.cuda.synchronize``:

* ``decode_jpeg(list, device="cuda")`` alone, ``--images-per-call`` images a call, its inputs
  separate pageable tensors, views of one pageable buffer, views of one pinned buffer;
* the decode plus the crops of a batch of ``--batch-size``: one sample at a time
  (:func:`~dataflow.client.augment.place_torch`) or in one gather
  (:func:`~dataflow.client.augment.place_all`);
* the whole :class:`~dataflow.client.decode.BatchDecoder` stage on a pinned batch as a
  DataLoader hands it over (decode, crops, copies, events).

CPU time equal to wall time means the calling thread is busy throughout (the decode is
CPU-bound there, not waiting on the GPU).

Usage: python -m dataflow.bench.experiments.gpudecode [--batch-size 64] [--batches 60]
    [--images-per-call 16 64 256] [--out bench-out]
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import time
from collections.abc import Callable

import numpy as np
import torch

from dataflow.bench.experiments.jpeg import CROP, write_shards
from dataflow.client.augment import box, draws, place_all, place_torch
from dataflow.client.decode import BatchDecoder, Decode, ImageDecode
from dataflow.client.imaging import load_nvjpeg
from dataflow.wire import BatchTag


def _jpegs(paths: list[str]) -> list[bytes]:
    out = []
    for path in paths:
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".jpg"):
                    f = tf.extractfile(m)
                    assert f is not None  # a regular member
                    out.append(f.read())
    return out


def _timed(name: str, fn: Callable[[int], object], calls: int, images: int) -> None:
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls
    cpu = (time.process_time() - cpu0) / calls
    print(f"| {name} | {images} | {wall * 1e3:.2f} | {cpu * 1e3:.2f} | "
          f"{images / wall:,.0f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.gpudecode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=64, help="default: %(default)s")
    p.add_argument("--batches", type=int, default=60,
                   help="timed calls per row (default: %(default)s)")
    p.add_argument("--images-per-call", type=int, nargs="+", default=[16, 64, 256],
                   help="images per decode_jpeg call, the decode alone (default: %(default)s)")
    p.add_argument("--out", default="bench-out",
                   help="directory for the JPEG shards, reused (default: %(default)s)")
    args = p.parse_args(argv)
    found = load_nvjpeg()
    if not torch.cuda.is_available() or isinstance(found, str):
        sys.exit("gpudecode needs CUDA and a torchvision that decodes on it: "
                 + (found if isinstance(found, str) else "no CUDA device"))
    decode_jpeg, rgb = found
    dev = torch.device("cuda")
    datas = _jpegs(write_shards(os.path.join(args.out, "jpeg-2x500"), 2, 500))
    bs = args.batch_size
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.gpudecode {command}".rstrip())
    print(f"{torch.cuda.get_device_name()}, {len(datas)} JPEGs of "
          f"{np.mean([len(d) for d in datas]) / 1e3:.1f} KB, one thread\n")
    print("| what | images a call | wall ms a call | CPU ms a call | images/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n in args.images_per_call:
        calls = [[torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas[i:i + n]]
                 for i in range(0, len(datas) - n + 1, n)]

        def alone(i: int, calls: list[list[torch.Tensor]] = calls) -> object:
            return decode_jpeg(calls[i % len(calls)], mode=rgb, device=dev)

        _timed("decode_jpeg, separate pageable tensors", alone, args.batches, n)

    batches = [datas[i:i + bs] for i in range(0, len(datas) - bs + 1, bs)]

    def flat(batch: list[bytes], pin: bool) -> tuple[torch.Tensor, np.ndarray]:
        values = torch.from_numpy(np.frombuffer(b"".join(batch), dtype=np.uint8).copy())
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in batch])]).astype(np.int64)
        return (values.pin_memory() if pin else values), offsets

    def views(values: torch.Tensor, offsets: np.ndarray) -> list[torch.Tensor]:
        return list(values.split(np.diff(offsets).tolist()))

    pageable = [flat(b, False) for b in batches]
    pinned = [flat(b, True) for b in batches]
    n = len(batches)
    _timed("decode_jpeg, views of one pageable buffer",
           lambda i: decode_jpeg(views(*pageable[i % n]), mode=rgb, device=dev), args.batches, bs)
    _timed("decode_jpeg, views of one pinned buffer",
           lambda i: decode_jpeg(views(*pinned[i % n]), mode=rgb, device=dev), args.batches, bs)

    def crops(i: int, gather: bool) -> torch.Tensor:
        images = decode_jpeg(views(*pinned[i % n]), mode=rgb, device=dev)
        u = draws(0, 0, i, "jpg", len(images))
        boxes = [box(u[j], int(im.shape[-2]), int(im.shape[-1]), (CROP, CROP), "random", True)
                 for j, im in enumerate(images)]
        if gather:
            return place_all(torch.stack(list(images)), boxes, (CROP, CROP))
        out = torch.empty((len(images), 3, CROP, CROP), dtype=torch.uint8, device=dev)
        for j, im in enumerate(images):
            place_torch(out[j], im, boxes[j])
        return out

    _timed("decode + crops one sample at a time", lambda i: crops(i, False), args.batches, bs)
    _timed("decode + crops in one gather", lambda i: crops(i, True), args.batches, bs)
    stage = BatchDecoder(Decode({"jpg": ImageDecode(size=CROP, crop="random", output="image")}),
                         "cuda", ["jpeg"])
    rows = np.array([[0, 0, bs]], dtype=np.int64)
    ids = torch.arange(bs).pin_memory()

    def whole(i: int) -> dict[str, torch.Tensor]:
        values, offsets = pinned[i % n]
        batch = {"jpg": values, "jpg.offsets": torch.from_numpy(offsets), "id": ids}
        return stage(batch, rows, BatchTag(0, 0, i))

    try:
        _timed("the DataLoader's decode stage (BatchDecoder), a pinned batch", whole,
               args.batches, bs)
    finally:
        stage.close()


if __name__ == "__main__":
    main()
