"""What one rank's plan of an epoch costs a trainer: its peak memory and its time.

For each dataset size (``--sizes``, ``SAMPLESxSHARDS``: shards of equal size but for the
remainder), world size (``--world-sizes``) and shuffle mode (``--shuffles``), the last rank's
plan of epoch 1 (:func:`dataflow.plan.rank_batches`, batches of ``--batch-size``): the peak of
the memory it allocates, traced by ``tracemalloc`` (numpy reports its allocations to it), beside
what its result holds (``Batches.table`` and ``bounds``), and the median wall time of
``--repeats`` untraced plans.

With ``--mixture`` (``SAMPLESxSHARDS:WEIGHT`` a source), the same for the last rank's plan of
epoch 1 of a weighted mixture of those sources (:func:`dataflow.mixture.mixture_batches`,
``--mixture-epoch`` slots an epoch, the sources' sum by default), its result all its arrays.

Usage: python -m dataflow.bench.experiments.planmem [--sizes 1280000x1024 4194304x4096]
    [--world-sizes 1 8] [--shuffles sample none] [--batch-size 256] [--repeats 3]
    [--mixture 4000000x4000:0.7 1000000x1000:0.2 100000x100:0.1 [--mixture-epoch N]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from dataflow.mixture import MixtureBatches, Weights, mixture_batches
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


def mixture_plan(sources: list[np.ndarray], weights: Weights, samples_per_epoch: int,
                 world_size: int, shuffle: str, batch_size: int) -> MixtureBatches:
    return mixture_batches(sources, weights, samples_per_epoch=samples_per_epoch,
                           world_size=world_size, rank=world_size - 1, epoch=1, seed=0,
                           batch_size=batch_size, shuffle=shuffle)


def result_bytes(result: Batches | MixtureBatches) -> int:
    """Bytes of every array a plan holds."""
    if isinstance(result, Batches):
        return result.table.nbytes + result.bounds.nbytes
    held = result.counts.nbytes + sum(c.nbytes for d in result.copies for c in d.values())
    return held + sum(p.table.nbytes + p.bounds.nbytes + i.nbytes + r.nbytes
                      for p, i, r in zip(result.parts, result.index, result.runs, strict=True))


def measure(make: Callable[[], Batches | MixtureBatches],
            repeats: int) -> tuple[int, int, float]:
    """(peak bytes allocated while planning, bytes of the result, median seconds of
    ``repeats`` untraced plans)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = make()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        make()
        seconds.append(time.perf_counter() - t0)
    return peak, result_bytes(result), statistics.median(seconds)


def mixture_source(spec: str) -> tuple[np.ndarray, float]:
    """``SAMPLESxSHARDS:WEIGHT`` as (shard sizes, weight)."""
    sizes, _, weight = spec.partition(":")
    return shard_sizes(sizes), float(weight or 1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.planmem",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="*", default=["1280000x1024", "4194304x4096"],
                   help="SAMPLESxSHARDS each; none to plan the mixture alone "
                        "(default: %(default)s)")
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 8],
                   help="default: %(default)s")
    p.add_argument("--shuffles", nargs="+", default=["sample", "none"],
                   choices=["sample", "block", "none"], help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--repeats", type=int, default=3,
                   help="untraced plans timed per row (default: %(default)s)")
    p.add_argument("--mixture", nargs="+", default=[], metavar="SAMPLESxSHARDS:WEIGHT",
                   help="also plan a mixture of these sources, e.g. 4000000x4000:0.7 "
                        "1000000x1000:0.2 100000x100:0.1 (default: no mixture)")
    p.add_argument("--mixture-epoch", type=int, default=0,
                   help="slots per mixture epoch; 0: the sources' samples summed "
                        "(default: %(default)s)")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    if tracemalloc.is_tracing():
        p.error("tracemalloc is already tracing (PYTHONTRACEMALLOC?): peaks would be wrong")
    if args.sizes:
        print("| samples | shards | world size | shuffle | peak MB | result MB | "
              "seconds (median) |")
        print("| ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for spec in args.sizes:
        sizes = shard_sizes(spec)
        for world_size in args.world_sizes:
            for shuffle in args.shuffles:
                peak, result, seconds = measure(
                    partial(plan, sizes, world_size, shuffle, args.batch_size), args.repeats)
                print(f"| {int(sizes.sum()):,} | {len(sizes):,} | {world_size} | {shuffle} | "
                      f"{peak / MB:.1f} | {result / MB:.1f} | {seconds:.3f} |", flush=True)
    if args.mixture:
        parsed = [mixture_source(spec) for spec in args.mixture]
        sources = [sizes for sizes, _ in parsed]
        weights = Weights.of([weight for _, weight in parsed])
        slots = args.mixture_epoch or sum(int(sizes.sum()) for sizes in sources)
        print(f"\nMixture of {' + '.join(args.mixture)} (weights {list(weights.counts)} in "
              f"lowest terms), {slots:,} slots an epoch:\n")
        print("| slots | world size | shuffle | peak MB | result MB | seconds (median) |")
        print("| ---: | ---: | --- | ---: | ---: | ---: |")
        for world_size in args.world_sizes:
            for shuffle in args.shuffles:
                peak, result, seconds = measure(
                    partial(mixture_plan, sources, weights, slots, world_size, shuffle,
                            args.batch_size), args.repeats)
                print(f"| {slots:,} | {world_size} | {shuffle} | {peak / MB:.1f} | "
                      f"{result / MB:.1f} | {seconds:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
