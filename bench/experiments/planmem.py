"""What one rank's plan of an epoch costs a trainer: its peak memory and its time.

For each dataset size (``--sizes``, ``SAMPLESxSHARDS``: shards of equal size but for the
remainder), world size (``--world-sizes``) and shuffle mode (``--shuffles``), the last rank's
plan of epoch 1 (:func:`dataflow.plan.rank_batches`, batches of ``--batch-size``): the peak of
the memory it allocates, traced by ``tracemalloc`` (numpy reports its allocations to it), beside
what its result holds (``Batches.table`` and ``bounds``), and the median wall time of
``--repeats`` untraced plans.

Usage: python -m dataflow.bench.experiments.planmem [--sizes 1280000x1024 4194304x4096]
    [--world-sizes 1 8] [--shuffles sample none] [--batch-size 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np

from dataflow.plan import Batches, rank_batches

MB = 1e6


def shard_sizes(spec: str) -> np.ndarray:
    """``SAMPLESxSHARDS`` as shard sizes: equal, the first ``SAMPLES % SHARDS`` one larger."""
    samples, shards = (int(x) for x in spec.lower().split("x"))
    sizes = np.full(shards, samples // shards, dtype=np.int64)
    sizes[: samples % shards] += 1
    return sizes


def plan(sizes: np.ndarray, world_size: int, shuffle: str, batch_size: int) -> Batches:
    return rank_batches(sizes, world_size=world_size, rank=world_size - 1, epoch=1, seed=0,
                        batch_size=batch_size, shuffle=shuffle)


def peak_bytes(sizes: np.ndarray, world_size: int, shuffle: str,
               batch_size: int) -> tuple[int, int]:
    """(peak bytes allocated while planning, bytes of the result)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        batches = plan(sizes, world_size, shuffle, batch_size)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, batches.table.nbytes + batches.bounds.nbytes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.planmem",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["1280000x1024", "4194304x4096"],
                   help="SAMPLESxSHARDS each (default: %(default)s)")
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 8],
                   help="default: %(default)s")
    p.add_argument("--shuffles", nargs="+", default=["sample", "none"],
                   choices=["sample", "block", "none"], help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--repeats", type=int, default=3,
                   help="untraced plans timed per row (default: %(default)s)")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    if tracemalloc.is_tracing():
        p.error("tracemalloc is already tracing (PYTHONTRACEMALLOC?): peaks would be wrong")
    print("| samples | shards | world size | shuffle | peak MB | result MB | seconds (median) |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for spec in args.sizes:
        sizes = shard_sizes(spec)
        for world_size in args.world_sizes:
            for shuffle in args.shuffles:
                peak, result = peak_bytes(sizes, world_size, shuffle, args.batch_size)
                seconds = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    plan(sizes, world_size, shuffle, args.batch_size)
                    seconds.append(time.perf_counter() - t0)
                print(f"| {int(sizes.sum()):,} | {len(sizes):,} | {world_size} | {shuffle} | "
                      f"{peak / MB:.1f} | {result / MB:.1f} | "
                      f"{statistics.median(seconds):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
