"""Shuffle quality and cost: the plan's modes beside a full shuffle and webdataset's.

Run: ``python -m dataflow.bench.experiments.shuffle [--plan-samples 10000000] [--read-shards 8]
[--read-samples-per-shard 2000] [--repeats 3]``.

Quality, on class-sorted labels (100 classes x 400 samples in 20 shards of 5 classes each,
batch 256, epochs 0 and 1, full batches only), for:

* ``torch RandomSampler``: a full uniform shuffle (``BatchSampler(RandomSampler)``, a seeded
  ``torch.Generator`` per epoch).
* ``webdataset``: its real pipeline over 20 tar shards written with ``webdataset.TarWriter``
  (members ``KEY.cls``): ``WebDataset(urls, shardshuffle=100, detshuffle=True, seed=e)``
  then ``.shuffle(1000, seed=e)`` for epoch ``e``; each ``cls`` member holds the sample id
  (its class is ``id // 400``).
* ``dataflow block (64, 8)``: the old default, ``shuffle="block"``.
* ``dataflow sample``: the new default, ``shuffle="sample"`` (window 1<<18 covers the dataset).

Columns: mean distinct classes per batch (of 100); the share of pairs of samples sharing a
batch in epoch 0 that share one again in epoch 1 (ideal: 256/40000 = 0.64%); the mean over
classes of the Kolmogorov-Smirnov distance between the class's normalised positions in the
epoch and the uniform distribution (a full shuffle gives ~0.04 with 400 samples per class,
storage order 0.99).

Cost, for the dataflow modes: seconds to compute one rank's batches (``rank_batches``) of a
``--plan-samples`` dataset in 1000 equal shards for world sizes 1 and 8 (best of
``--repeats``), and samples/s of reading one epoch of rank 0 of 1 from a demo tar dataset
(``make_demo``, 3x64x64 images; indexes built and page cache warmed first), gathering each
batch two ways: ``open_shard(path).read(start, stop)`` per range, or one
``read_many(starts, stops)`` per shard of the batch (its ranges are sorted by shard), the
pieces joined with ``dataflow.batch.concat``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import BatchSampler, RandomSampler

from dataflow.batch import concat
from dataflow.bench.experiments.mixing import distinct_classes, kept_pairs, ks_to_uniform
from dataflow.demo import DemoSpec, make_demo
from dataflow.plan import rank_batches
from dataflow.readers import open_shard

CLASSES, PER_CLASS, SHARDS, BATCH = 100, 400, 20, 256
TOTAL = CLASSES * PER_CLASS
LABELS = np.arange(TOTAL) // PER_CLASS  # sample id -> class; shard s holds 5 classes
MODES = {"dataflow block (64, 8)": "block", "dataflow sample (default)": "sample"}


def torch_epochs(epochs: int) -> list[list[np.ndarray]]:
    """Sample ids per batch of a full shuffle, one list per epoch."""
    out = []
    for epoch in range(epochs):
        gen = torch.Generator().manual_seed(epoch)
        sampler = BatchSampler(RandomSampler(range(TOTAL), generator=gen), BATCH, True)
        out.append([np.asarray(b) for b in sampler])
    return out


def webdataset_epochs(epochs: int, tmp: str) -> list[list[np.ndarray]]:
    """Sample ids per batch of webdataset's shard shuffle + ``shuffle(1000)``."""
    urls = []
    per_shard = TOTAL // SHARDS
    for s in range(SHARDS):
        urls.append(os.path.join(tmp, f"cls-{s:04d}.tar"))
        with wds.TarWriter(urls[-1]) as sink:
            for i in range(s * per_shard, (s + 1) * per_shard):
                sink.write({"__key__": f"{i:08d}", "cls": str(i).encode()})
    out = []
    for epoch in range(epochs):
        dataset = wds.WebDataset(urls, shardshuffle=100, detshuffle=True, seed=epoch,
                                 empty_check=False).shuffle(1000, seed=epoch).to_tuple("cls")
        ids = np.array([int(cls) for (cls,) in dataset])
        if sorted(ids.tolist()) != list(range(TOTAL)):
            raise RuntimeError("webdataset did not yield every sample exactly once")
        out.append(list(ids[: TOTAL // BATCH * BATCH].reshape(-1, BATCH)))
    return out


def plan_epochs(shuffle: str, epochs: int) -> list[list[np.ndarray]]:
    """Sample ids per batch of the dataflow plan (one rank) in mode ``shuffle``."""
    per_shard = TOTAL // SHARDS
    out = []
    for epoch in range(epochs):
        batches = rank_batches([per_shard] * SHARDS, world_size=1, rank=0, epoch=epoch, seed=0,
                               batch_size=BATCH, drop_last=True, shuffle=shuffle)
        out.append([np.concatenate([np.arange(r.shard * per_shard + r.start,
                                              r.shard * per_shard + r.stop) for r in batch])
                    for batch in batches])
    return out


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def plan_seconds(shuffle: str, samples: int, world_size: int, repeats: int) -> float:
    sizes = [samples // 1000] * 1000
    return best_of(repeats, lambda: rank_batches(sizes, world_size=world_size, rank=0, epoch=0,
                                                 seed=0, batch_size=BATCH, shuffle=shuffle))


def read_rates(shuffle: str, tmp: str, shards: int, per_shard: int,
               repeats: int) -> tuple[float, float]:
    """Samples/s of reading one epoch of rank 0 of 1 from a demo tar dataset, two ways.

    Returns:
        (one ``read`` per range, one ``read_many`` per shard of each batch), each joined into
        the batch with ``concat``.
    """
    out = os.path.join(tmp, "demo-tar")
    if not os.path.isdir(out):
        make_demo(out, DemoSpec(fmt="tar", shards=shards, samples_per_shard=per_shard,
                                uneven=False), progress=None)
    paths = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    readers = [open_shard(p) for p in paths]
    try:
        sizes = [len(r) for r in readers]
        batches = rank_batches(sizes, world_size=1, rank=0, epoch=0, seed=0, batch_size=BATCH,
                               shuffle=shuffle)
        for r in readers:
            r.read(0, len(r))

        def by_range() -> None:
            for batch in batches:
                concat([readers[r.shard].read(r.start, r.stop) for r in batch])

        def by_shard() -> None:
            for i in range(len(batches)):
                rows = batches.table[batches.bounds[i] : batches.bounds[i + 1]]
                cuts = np.flatnonzero(np.diff(rows[:, 0])) + 1
                concat([readers[int(g[0, 0])].read_many(g[:, 1], g[:, 2])
                        for g in np.split(rows, cuts)])

        total = sum(sizes)
        return total / best_of(repeats, by_range), total / best_of(repeats, by_shard)
    finally:
        for r in readers:
            r.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.shuffle",
                                description=__doc__.split("\n")[0])
    parser.add_argument("--plan-samples", type=int, default=10_000_000)
    parser.add_argument("--read-shards", type=int, default=8)
    parser.add_argument("--read-samples-per-shard", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        epochs = {"torch RandomSampler (full shuffle)": torch_epochs(2),
                  "webdataset shardshuffle + shuffle(1000)": webdataset_epochs(2, tmp)}
        epochs.update({name: plan_epochs(mode, 2) for name, mode in MODES.items()})
        rows = []
        for name, (first, second) in epochs.items():
            row = [name, f"{distinct_classes(first, LABELS):.1f}",
                   f"{100 * kept_pairs(first, second, TOTAL):.2f}",
                   f"{ks_to_uniform(first, LABELS):.3f}"]
            if name in MODES:
                mode = MODES[name]
                row += [f"{plan_seconds(mode, args.plan_samples, w, args.repeats):.2f}"
                        for w in (1, 8)]
                rates = read_rates(mode, tmp, args.read_shards, args.read_samples_per_shard,
                                   args.repeats)
                row += [f"{rate:,.0f}" for rate in rates]
            else:
                row += ["-"] * 4
            rows.append(row)
    millions = f"{args.plan_samples / 1e6:g}M"
    read = f"{args.read_shards}x{args.read_samples_per_shard}"
    header = ["method", "distinct classes / batch", "co-batched pairs kept %",
              "KS to uniform", f"plan {millions} W=1 s", f"plan {millions} W=8 s",
              f"tar {read} samples/s, read per range",
              f"tar {read} samples/s, read_many per shard"]
    command = " ".join(["python -m dataflow.bench.experiments.shuffle",
                        *(sys.argv[1:] if argv is None else argv)])
    print(f"`{command}`")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
