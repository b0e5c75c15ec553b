"""Readers at work at once: a server of many readers whose every batch takes a while
(:func:`dataflow.bench.experiments.slow.sleep`, 20 ms a batch and no CPU, standing in for a
decode on cores of its own or an object store's wait), read by a DataLoader with its
defaults.

Two arms, interleaved ``--repeats`` times, each a fresh server of ``--workers`` readers:

- ``--max-credits 4``: the server grants 4 credits, so the loader keeps 4 requests at it (what
  a loader of the default ``prefetch`` did before it kept a request at each reader);
- the server's defaults: the loader keeps ``prefetch`` requests, or one per reader.

Every sample is counted once per epoch in both. The rate is whole epochs of the demo data
(Arrow, 3x8x8 images, 2,048 samples) against the readers' ceiling, ``workers / SLEEP_S``
batches a second (a transform runs on each batch of a request alone). The batches the loader
had read ahead when the clock started (at most its depth, 96 here) count too: over 20 epochs
of 128 batches, at most 4% of the rate. The sleep costs no CPU, so the comparison holds on a
machine of fewer cores than readers.

Usage: python -m dataflow.bench.experiments.concurrency [--workers 12] [--batch-size 16]
    [--epochs 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter

from dataflow.bench.experiments.slow import SLEEP_S
from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.server import launch

TRANSFORM = "dataflow.bench.experiments.slow:sleep"
ARMS: tuple[tuple[str, list[str]], ...] = (
    ("4 credits (--max-credits 4)", ["--max-credits", "4"]),
    ("defaults", []),
)


def run(paths: list[str], total: int, workers: int, batch: int, epochs: int,
        extra: list[str]) -> float:
    """Batches/s over ``epochs`` whole epochs, after one untimed."""
    with launch(paths, workers=workers, extra_args=["--transform", TRANSFORM, *extra]) as srv, \
            DataLoader(srv.endpoint, batch_size=batch, rank=0, world_size=1, timeout=60) as dl:
        for _ in dl:
            pass
        n, start = 0, time.perf_counter()
        for _ in range(epochs):
            ids: Counter[int] = Counter()
            for b in dl:
                ids.update(b["id"].tolist())
                n += 1
            if ids != Counter(range(total)):
                raise RuntimeError("an epoch did not hold every sample once")
        return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.concurrency",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=12, help="reader processes (default: 12)")
    p.add_argument("--batch-size", type=int, default=16, help="default: 16")
    p.add_argument("--epochs", type=int, default=20, help="timed epochs a run (default: 20)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default: 3)")
    args = p.parse_args(argv)
    got: dict[str, list[float]] = {name: [] for name, _ in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp:
        spec = DemoSpec(shards=8, samples_per_shard=256, uneven=False, image_shape=(3, 8, 8))
        demo = make_demo(tmp, spec, progress=None)
        for _ in range(args.repeats):
            for name, extra in ARMS:
                got[name].append(run(list(demo.paths), demo.total, args.workers,
                                     args.batch_size, args.epochs, extra))
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.concurrency {command}".rstrip())
    print(f"one server of {args.workers} readers, {SLEEP_S * 1e3:.0f} ms a batch (sleep), "
          f"{demo.total} samples in batches of {args.batch_size}; median [range] of "
          f"{args.repeats} interleaved runs; readers' ceiling "
          f"{args.workers / SLEEP_S:.0f} batches/s")
    print()
    print("| server | batches/s | of the ceiling |")
    print("| --- | --- | ---: |")
    for name, _ in ARMS:
        rates = got[name]
        med = statistics.median(rates)
        print(f"| {name} | {med:.0f} [{min(rates):.0f}-{max(rates):.0f}] | "
              f"{med * SLEEP_S / args.workers:.2f} |")


if __name__ == "__main__":
    main()
