"""JPEG decode workload: where the decode runs, dataflow vs torch DataLoader + webdataset.

Two comparisons on the same JPEG tar shards (:mod:`.jpeg`: 256x256 photos-like JPEGs,
PAX-header tars), decoding and random-cropping to 224x224 on every side:

* **same budget**: three loaders, no training step, ``--repeats`` interleaved rounds (torch,
  server decode, trainer decode, torch, ...), the median and range of each: samples/s and the
  trainer process's CPU ms per batch (every thread of it, decode threads included).

  - torch's ``DataLoader(num_workers=--workers)`` over a webdataset pipeline decoding with
    Pillow in its workers;
  - dataflow, **server decode**: one server, ``--workers`` reader processes running
    ``--transform dataflow.bench.experiments.jpeg:decode_crop`` (Pillow);
  - dataflow, **trainer decode**: the same server shipping the JPEG bytes (no transform), the
    DataLoader decoding them (``decode={"jpg": ImageDecode(size=224, output="image")}``,
    :mod:`dataflow.client.decode`): nvJPEG on the GPU when CUDA and a torchvision with GPU
    decode are present (the loader then delivers to ``cuda``), else Pillow in ``--workers``
    threads of the trainer process (the row names the decoder).
* **offload**: a trainer host with one core for training and loading (``sched_setaffinity``
  to CPU 0; torch's workers inherit it) against dataflow whose servers run on the other
  CPUs (the trainer still on CPU 0), with a ``--step-ms`` sleep step (the GPU's time): the
  GPU-idle fraction, wait / wall time. The budgets differ on purpose: this is what moving
  the decode off the trainer host buys.

Usage: python -m dataflow.bench.experiments.decode [--workers 2] [--batch-size 64]
[--step-ms 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator

import numpy as np
import torch
import webdataset as wds

from dataflow.bench.experiments.jpeg import CROP, crop_sample, stack_samples, write_shards
from dataflow.bench.procs import descendants
from dataflow.client import DataLoader, Decode, ImageDecode
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
    """(samples/s, trainer CPU ms per batch) over ``n`` batches after 3 warm-up batches (a
    CUDA batch's work is waited for before the clock stops)."""
    for _ in range(3):
        next(batches)
    samples, cpu0, t0 = 0, _cpu(), time.perf_counter()
    batch: dict = {}
    for _ in range(n):
        batch = next(batches)
        samples += len(batch["id"])
    if batch["id"].is_cuda:
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - t0), (_cpu() - cpu0) / n * 1e3


def trainer_decode(workers: int) -> Decode:
    """The trainer-decode loader's setting: the crop of :mod:`.jpeg`, ``workers`` threads."""
    return Decode({"jpg": ImageDecode(size=CROP, crop="random", output="image")},
                  threads=workers)


def _torch_run(paths: list[str], bs: int, w: int, n: int) -> tuple[float, float, str]:
    tl = torch_loader(paths, bs, w)
    rate, cpu = throughput(endless(tl), n)
    del tl
    return rate, cpu, ""


def _dataflow_run(paths: list[str], bs: int, w: int, n: int,
                  decode: Decode | None) -> tuple[float, float, str]:
    """Server decode (``decode`` None: the transform) or trainer decode; the decoder's name."""
    extra = ["--transform", TRANSFORM] if decode is None else []
    device = "cuda" if decode is not None and torch.cuda.is_available() else None
    with launch(paths, workers=w, extra_args=extra) as srv, DataLoader(
            srv.endpoint, batch_size=bs, rank=0, world_size=1, timeout=120, device=device,
            decode=decode) as dl:
        rate, cpu = throughput(endless(dl), n)
        if decode is None:
            return rate, cpu, ""
        return rate, cpu, (f"{dl.decode_backend} ({dl.decoded_ahead} of {n + 3} batches "
                           "decoded ahead)")


def _load(avg: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def _spread(values: list[float], fmt: str) -> str:
    """``median [min-max]`` (the median alone for one value)."""
    med = format(statistics.median(values), fmt)
    if len(values) < 2:
        return med
    return f"{med} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


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
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved rounds of the same-budget loaders (default: %(default)s)")
    p.add_argument("--no-offload", action="store_true",
                   help="skip the offload case (default: run it)")
    p.add_argument("--out", default="bench-out",
                   help="directory for the JPEG shards, reused (default: %(default)s)")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("the offload case needs at least 2 CPUs")
    paths = write_shards(os.path.join(args.out, f"jpeg-{args.shards}x{args.samples_per_shard}"),
                         args.shards, args.samples_per_shard)
    bs, n, w = args.batch_size, args.batches, args.workers
    load0 = os.getloadavg()

    names = ("torch", "server", "trainer")
    runs: dict[str, list[tuple[float, float, str]]] = {k: [] for k in names}
    for _ in range(args.repeats):  # interleaved: each round meets the same machine
        runs["torch"].append(_torch_run(paths, bs, w, n))
        runs["server"].append(_dataflow_run(paths, bs, w, n, None))
        runs["trainer"].append(_dataflow_run(paths, bs, w, n, trainer_decode(w)))
    decoder = runs["trainer"][0][2]
    labels = {
        "torch": f"torch DataLoader({w}) + webdataset, decode in workers (Pillow)",
        "server": f"dataflow 1 server x {w} readers, server decode (--transform, Pillow)",
        "trainer": f"dataflow 1 server x {w} readers ship bytes, trainer decode: {decoder}"
                   + (f", {w} threads" if decoder.startswith("pillow") else ""),
    }
    rows: list[tuple[str, ...]] = []
    for k in names:
        rates = [r for r, _, _ in runs[k]]
        cpu_ms = [c for _, c, _ in runs[k]]
        vs_rate = [r / t for (r, _, _), (t, _, _) in zip(runs[k], runs["torch"], strict=True)]
        vs_cpu = [c / t for (_, c, _), (_, t, _) in zip(runs[k], runs["torch"], strict=True)]
        if k == "torch":
            rows.append((labels[k], _spread(rates, ",.0f"), "1.00x", _spread(cpu_ms, ".2f"),
                         "1.00"))
        else:
            rows.append((labels[k], _spread(rates, ",.0f"), _spread(vs_rate, ".2f") + "x",
                         _spread(cpu_ms, ".2f"), _spread(vs_cpu, ".2f")))

    command = " ".join(argv or sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.decode {command}".rstrip())
    print(f"{len(paths)} JPEG tar shards x {args.samples_per_shard}, batch {bs}, {n} timed "
          f"batches per row, {os.cpu_count()} CPUs, load average (1/5/15 min) "
          f"{_load(load0)} at the start, {_load(os.getloadavg())} at the end\n")
    print(f"Same budget, no step, median [range] of {args.repeats} interleaved rounds (ratios "
          "taken per round):\n")
    print("| loader | samples/s | vs torch | trainer CPU ms / batch | vs torch |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if not args.no_offload:
        offload(paths, bs, n, w, args.step_ms / 1e3, cpus)


def offload(paths: list[str], bs: int, n: int, w: int, step: float, cpus: list[int]) -> None:
    """The offload case (see the module): torch on CPU ``cpus[0]`` with the trainer, dataflow's
    server decoding on the others; printed as a table."""
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
    print(f"\nOffload, {step * 1e3:g} ms sleep step, trainer on CPU {cpus[0]}:\n")
    print("| loader | where loading runs | GPU-idle | wait p99 ms |")
    print("| --- | --- | --- | --- |")
    print(f"| torch DataLoader({w}) + webdataset | CPU {cpus[0]} with the trainer | "
          f"{idle_t:.1%} | {p99_t:.1f} |")
    print(f"| dataflow 1 server x {w} readers | CPUs {cpus[1:]} (server host) | {idle_d:.1%} | "
          f"{p99_d:.1f} |")


if __name__ == "__main__":
    main()
