"""Issue 20, items 2 and 3: what a weighted mixture and lineage cost.

Plan: seconds to plan one rank's pass of a mixture (:func:`dataflow.mixture.mixture_batches`,
three sources at 70/20/10) and of one dataset of as many samples
(:func:`dataflow.plan.rank_batches`), and to plan the weights' period at its largest.

Trainer: the trainer process's CPU (``getrusage``: all its threads) and wall time per batch
over whole epochs, in alternating rounds, of one loader server per source (Arrow demo shards
for ``web``, tar for ``books``, ``--workers 1`` each): a DataLoader on ``web``, the same with
``lineage=True``, and MixtureLoaders of ``web`` 70% + ``books`` 30% with ``combine="concat"``
(one batch, copied together on the trainer), with lineage, and ``combine="sources"`` (a dict
of the parts, no copy). Every loader reads as many batches per epoch.

Usage: python -m dataflow.bench.experiments.mixture [--samples 1280000] [--rounds 5]
[--batch-size 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from dataflow.bench.experiments.trainer_cpu import measure
from dataflow.client import DataLoader, MixtureLoader, Source
from dataflow.demo import DemoSpec, make_demo
from dataflow.mixture import MAX_PERIOD, Weights, mixture_batches
from dataflow.plan import rank_batches
from dataflow.server import launch


def plan_seconds(samples: int, world: int, batch_size: int) -> dict[str, float]:
    """Seconds to plan rank 0's pass of a mixture and of one dataset of ``samples``."""
    shards = 1000
    sizes = [[samples * share // 100 // shards] * shards for share in (70, 20, 10)]
    weights = Weights.of([0.7, 0.2, 0.1])
    t0 = time.perf_counter()
    mixture_batches(sizes, weights, samples_per_epoch=samples, world_size=world, rank=0,
                    epoch=1, seed=0, batch_size=batch_size)
    t1 = time.perf_counter()
    rank_batches([s for source in sizes for s in source], world_size=world, rank=0, epoch=1,
                 seed=0, batch_size=batch_size)
    t2 = time.perf_counter()
    Weights((MAX_PERIOD - 3, 1, 2))
    t3 = time.perf_counter()
    return {"mixture": t1 - t0, "one dataset": t2 - t1, "weights period": t3 - t2}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.mixture",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1_280_000,
                   help="samples of the planned epoch (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=8, help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds of one epoch per loader (default: %(default)s)")
    p.add_argument("--web-samples", type=int, default=8000, help="default: %(default)s")
    args = p.parse_args(argv)

    for name, seconds in plan_seconds(args.samples, args.world_size, args.batch_size).items():
        print(f"plan, {name}: {seconds:.3f} s ({args.samples} samples, world "
              f"{args.world_size}, rank 0)")
    with tempfile.TemporaryDirectory() as tmp:
        web = make_demo(f"{tmp}/web", DemoSpec(fmt="arrow", shards=8,
                                               samples_per_shard=args.web_samples // 8,
                                               uneven=False), progress=None)
        books = make_demo(f"{tmp}/books", DemoSpec(fmt="tar", shards=4,
                                                   samples_per_shard=args.web_samples // 16,
                                                   uneven=False), progress=None)
        with launch(list(web.paths), workers=1) as a, launch(list(books.paths), workers=1) as b:
            kw: dict[str, Any] = {"batch_size": args.batch_size, "rank": 0, "world_size": 1,
                                  "timeout": 60, "drop_last": True}
            mix = [Source(a.endpoint, 0.7, name="web"), Source(b.endpoint, 0.3, name="books")]
            per = web.total
            loaders: dict[str, DataLoader | MixtureLoader] = {
                "DataLoader (web)": DataLoader(a.endpoint, **kw),
                "DataLoader (web), lineage": DataLoader(a.endpoint, lineage=True, **kw),
                "MixtureLoader concat": MixtureLoader(mix, samples_per_epoch=per, **kw),
                "MixtureLoader concat, lineage": MixtureLoader(mix, samples_per_epoch=per,
                                                               lineage=True, **kw),
                "MixtureLoader sources": MixtureLoader(mix, samples_per_epoch=per,
                                                       combine="sources", **kw),
            }
            try:
                for loader in loaders.values():
                    for _ in loader:  # warm-up epoch
                        pass
                cpu: dict[str, list[float]] = {k: [] for k in loaders}
                wall: dict[str, list[float]] = {k: [] for k in loaders}
                for _ in range(args.rounds):
                    for name, loader in loaders.items():
                        c, w, n, _ = measure([loader])
                        cpu[name].append(1000 * c / n)
                        wall[name].append(1000 * w / n)
            finally:
                for loader in loaders.values():
                    loader.close()
    print(f"trainer per batch of {args.batch_size} (3x64x64 uint8 images, ids, labels, text), "
          f"median of {args.rounds} alternating epochs:")
    for name in loaders:
        print(f"  {name:32s} CPU {statistics.median(cpu[name]):6.2f} ms  wall "
              f"{statistics.median(wall[name]):6.2f} ms  (CPU range "
              f"{min(cpu[name]):.2f}-{max(cpu[name]):.2f})")


if __name__ == "__main__":
    main()
