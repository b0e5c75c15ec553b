"""JPEG decode workload: dataflow with a server-side transform vs torch DataLoader + webdataset.

Two comparisons on the same JPEG tar shards (:mod:`.jpeg`: 256x256 photos-like JPEGs,
PAX-header tars), decoding with Pillow and random-cropping to 224x224 on both sides:

* **same budget**: dataflow (one server, ``--workers`` reader processes running
  ``--transform dataflow.bench.experiments.jpeg:decode_crop``) and torch's
  ``DataLoader(num_workers=--workers)`` over a webdataset pipeline decoding the same way, no
  training step: samples/s and the trainer process's CPU ms per batch.
* **offload**: a trainer host with one core for training and loading (``sched_setaffinity``
  to CPU 0; torch's workers inherit it) against dataflow whose servers run on the other
  CPUs (the trainer still on CPU 0), with a ``--step-ms`` sleep step (the GPU's time): the
  GPU-idle fraction, wait / wall time. The budgets differ on purpose: this is what moving
  the decode off the trainer host buys.

Usage: python -m dataflow.bench.experiments.decode [--workers 2] [--batch-size 64]
[--step-ms 100]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Iterator

import numpy as np
import torch
import webdataset as wds

from dataflow.bench.experiments.jpeg import crop_sample, stack_samples, write_shards
from dataflow.bench.procs import descendants
from dataflow.client import DataLoader
from dataflow.server import launch

TRANSFORM = "dataflow.bench.experiments.jpeg:decode_crop"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def torch_loader(paths: list[str], batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """torch DataLoader over webdataset decoding and cropping in its workers."""
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(paths), wds.detshuffle(bufsize=len(paths), seed=0),
        wds.split_by_worker, wds.tarfile_to_samples(), wds.shuffle(1000, initial=100),
        wds.map(crop_sample), wds.batched(batch_size, collation_fn=stack_samples, partial=True))
    return torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers,
                                       persistent_workers=True, prefetch_factor=2)


def endless(loader: object) -> Iterator[dict]:
    """Batches epoch after epoch (``set_epoch`` where the loader has it)."""
    epoch = 0
    while True:
        if isinstance(loader, DataLoader):
            loader.set_epoch(epoch)
        yield from loader  # type: ignore[misc]
        epoch += 1


def throughput(batches: Iterator[dict], n: int) -> tuple[float, float]:
    """(samples/s, trainer CPU ms per batch) over ``n`` batches after 3 warm-up batches."""
    for _ in range(3):
        next(batches)
    samples, cpu0, t0 = 0, _cpu(), time.perf_counter()
    for _ in range(n):
        samples += len(next(batches)["id"])
    return samples / (time.perf_counter() - t0), (_cpu() - cpu0) / n * 1e3


def gpu_idle(batches: Iterator[dict], n: int, step_s: float) -> tuple[float, float]:
    """(wait / wall, p99 wait ms) of ``n`` steps of ``step_s`` sleep after 3 warm-up steps."""
    for _ in range(3):
        next(batches)
    waits = np.empty(n)
    t0 = time.perf_counter()
    for i in range(n):
        w0 = time.perf_counter()
        next(batches)
        waits[i] = time.perf_counter() - w0
        time.sleep(step_s)
    return float(waits.sum() / (time.perf_counter() - t0)), float(np.percentile(waits, 99) * 1e3)


def _pin(pids: list[int], cpus: set[int]) -> None:
    for pid in pids:
        try:
            os.sched_setaffinity(pid, cpus)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.decode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2,
                   help="torch num_workers = dataflow reader processes (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="default: %(default)s")
    p.add_argument("--batches", type=int, default=40,
                   help="timed batches per measurement (default: %(default)s)")
    p.add_argument("--step-ms", type=float, default=100.0,
                   help="offload case: sleep step per batch, ms (default: %(default)s)")
    p.add_argument("--shards", type=int, default=8, help="default: %(default)s")
    p.add_argument("--samples-per-shard", type=int, default=500, help="default: %(default)s")
    p.add_argument("--out", default="bench-out",
                   help="directory for the JPEG shards, reused (default: %(default)s)")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("the offload case needs at least 2 CPUs")
    paths = write_shards(os.path.join(args.out, f"jpeg-{args.shards}x{args.samples_per_shard}"),
                         args.shards, args.samples_per_shard)
    bs, n, w = args.batch_size, args.batches, args.workers
    rows: list[tuple[str, str, str]] = []

    tl = torch_loader(paths, bs, w)
    rate_t, cpu_t = throughput(endless(tl), n)
    del tl
    with launch(paths, workers=w, extra_args=["--transform", TRANSFORM]) as srv, DataLoader(
            srv.endpoint, batch_size=bs, rank=0, world_size=1, timeout=120) as dl:
        rate_d, cpu_d = throughput(endless(dl), n)
    rows.append((f"torch DataLoader({w}) + webdataset, decode in workers",
                 f"{rate_t:,.0f}", f"{cpu_t:.2f}"))
    rows.append((f"dataflow 1 server x {w} readers, --transform decode",
                 f"{rate_d:,.0f} ({rate_d / rate_t:.2f}x)", f"{cpu_d:.2f} ({cpu_d / cpu_t:.2f})"))

    step = args.step_ms / 1e3
    own = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpus[0]})
        tl = torch_loader(paths, bs, w)
        idle_t, p99_t = gpu_idle(endless(tl), n, step)
        del tl
        with launch(paths, workers=w, extra_args=["--transform", TRANSFORM]) as srv:
            _pin([srv.pid, *descendants([srv.pid])], set(cpus[1:]))
            with DataLoader(srv.endpoint, batch_size=bs, rank=0, world_size=1,
                            timeout=120) as dl:
                idle_d, p99_d = gpu_idle(endless(dl), n, step)
    finally:
        os.sched_setaffinity(0, own)

    command = " ".join(argv or sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.decode {command}".rstrip())
    print(f"{len(paths)} JPEG tar shards x {args.samples_per_shard}, batch {bs}, {n} timed "
          f"batches per row, {os.cpu_count()} CPUs\n")
    print("Same budget, no step:\n")
    print("| loader | samples/s (vs torch) | trainer CPU ms / batch (vs torch) |")
    print("| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nOffload, {args.step_ms:g} ms sleep step, trainer on CPU {cpus[0]}:\n")
    print("| loader | where loading runs | GPU-idle | wait p99 ms |")
    print("| --- | --- | --- | --- |")
    print(f"| torch DataLoader({w}) + webdataset | CPU {cpus[0]} with the trainer | "
          f"{idle_t:.1%} | {p99_t:.1f} |")
    print(f"| dataflow 1 server x {w} readers | CPUs {cpus[1:]} (server host) | {idle_d:.1%} | "
          f"{p99_d:.1f} |")


if __name__ == "__main__":
    main()
