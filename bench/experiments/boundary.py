"""What the training loop waits at an epoch's end: the consumer's ``next()`` gaps near the
boundary, where the next epoch's plan is needed.

A server of ``--workers`` readers on an Arrow demo of ``--shards`` x ``--samples-per-shard``
one-byte images (the plan's cost grows with the samples, not their bytes), one DataLoader of
``--world-size`` ranks' rank 0 reading the ``id`` column only, a sleep of ``--step-ms`` a batch
standing for a GPU step (so batches wait ready and what remains is the loader's own stall).
Printed: each epoch boundary's largest ``next()`` gap within the last ``--window`` batches of the
epoch, beside the median gap and the largest anywhere, and the time one rank's plan of an epoch
takes (:func:`dataflow.plan.rank_batches`, cold and warm).

    python -m dataflow.bench.experiments.boundary --epochs 2 --step-ms 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.plan import rank_batches
from dataflow.server import launch


def plan_seconds(sizes: list[int], world_size: int, batch_size: int) -> list[float]:
    """Seconds of three plans of consecutive epochs (the first cold)."""
    out = []
    for epoch in range(3):
        t0 = time.perf_counter()
        rank_batches(sizes, world_size=world_size, rank=0, epoch=epoch, seed=0,
                     batch_size=batch_size)
        out.append(time.perf_counter() - t0)
    return out


def gaps(endpoint: str, args: argparse.Namespace) -> list[list[float]]:
    """Each timed epoch's ``next()`` gaps, seconds (after one untimed epoch)."""
    step = args.step_ms / 1e3
    with DataLoader(endpoint, batch_size=args.batch_size, rank=0, world_size=args.world_size,
                    columns=["id"], timeout=300) as loader:
        for _ in loader:
            time.sleep(step)
        out = []
        for _ in range(args.epochs):
            got = []
            last = time.perf_counter()
            for _ in loader:
                got.append(time.perf_counter() - last)
                time.sleep(step)
                last = time.perf_counter()
            out.append(got)
        return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.boundary",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=1024, help="default: %(default)s")
    p.add_argument("--samples-per-shard", type=int, default=1250,
                   help="default: %(default)s (1.28 M samples)")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--world-size", type=int, default=1,
                   help="ranks the plan is cut for; rank 0 reads (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="the server's readers (default: "
                   "%(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs (default: %(default)s)")
    p.add_argument("--step-ms", type=float, default=4.0,
                   help="sleep a batch, like a GPU step (default: %(default)s)")
    p.add_argument("--window", type=int, default=100,
                   help="batches before an epoch's end searched for its stall (default: "
                        "%(default)s)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    sizes = [args.samples_per_shard] * args.shards
    cold, *warm = plan_seconds(sizes, args.world_size, args.batch_size)
    print(f"`python -m dataflow.bench.experiments.boundary {' '.join(argv)}`".replace(" `", "`"))
    print(f"{sum(sizes):,} samples, world size {args.world_size}: one rank's plan of an epoch "
          f"{cold:.3f} s cold, {min(warm):.3f}-{max(warm):.3f} s warm")
    with tempfile.TemporaryDirectory(prefix="boundary-") as tmp:
        demo = make_demo(tmp, DemoSpec(fmt="arrow", shards=args.shards,
                                       samples_per_shard=args.samples_per_shard,
                                       image_shape=(1, 1, 1), uneven=False), progress=None)
        with launch([str(x) for x in demo.paths], workers=args.workers, timeout=300) as server:
            for epoch, got in enumerate(gaps(server.endpoint, args), start=1):
                tail = got[-args.window:]
                at = len(got) - len(tail) + max(range(len(tail)), key=tail.__getitem__)
                top = sorted(range(len(got)), key=got.__getitem__)[-3:][::-1]
                print(f"epoch {epoch} ({len(got)} batches): largest gap in its last "
                      f"{len(tail)} batches {1e3 * max(tail):.1f} ms (batch {at}); median "
                      f"{1e3 * statistics.median(got):.3f} ms; largest anywhere "
                      + ", ".join(f"{1e3 * got[i]:.1f} ms (batch {i})" for i in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
