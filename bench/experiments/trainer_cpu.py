"""P2: trainer-process CPU seconds per batch, dataflow DataLoader vs torch DataLoader.

Both read the same demo shards (images 3x64x64 uint8, ids, labels, text): Arrow (``--format
arrow``; torch side: a map-style Arrow dataset, ``bench.torch_datasets.ArrowMapDataset``) or
tar written by webdataset's ``TarWriter``, PAX headers included (``--format tar``; torch side:
the bench's webdataset pipeline, batching in the workers). torch runs
``DataLoader(num_workers=2, pin_memory=True)``; dataflow one loader server (``--workers 2``)
and ``client.DataLoader``, twice: over TCP frames (``shared_memory="off"``, the path of a
server on another host) and through same-host shared memory (the default beside the
trainer). Only the trainer process is measured (``getrusage(RUSAGE_SELF)``:
user + system CPU of all its threads, not of worker or server processes), and for dataflow
also per thread (``/proc/self/task``: the trainer's own thread, the client's I/O thread and
ZeroMQ's I/O thread, which receives the bytes from the kernel). The target is a ratio <= 0.25.

``--metrics-rounds N`` also measures the cost of ``DataLoader(metrics=registry)``: two loaders
on the same server, one with metrics and one without, timed an epoch each in turn for N rounds
(alternating cancels drift of the machine's load).

Without CUDA, torch's ``pin_memory=True`` pins nothing (torch warns and skips it) and
dataflow's ``pin_memory`` is off too.

Usage: python -m dataflow.bench.experiments.trainer_cpu [--format arrow] [--batch-size 256]
[--epochs 10] [--step-ms 0] [--metrics-rounds 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from dataflow.bench.experiments.args import per_request
from dataflow.bench.torch_datasets import ArrowMapDataset, webdataset_pipeline
from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.index.scan import build_index
from dataflow.server import launch

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, summed by name (a
    Python thread's name, else the OS thread's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread exited meanwhile
        name = names.get(int(tid)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def measure(epochs: Iterable[Iterable], step_s: float = 0.0
            ) -> tuple[float, float, int, dict[str, float]]:
    """(trainer CPU s, wall s, batches, CPU s per thread name) over ``epochs``, sleeping
    ``step_s`` after each batch (a GPU step: the trainer's CPU stays free)."""
    n = 0
    threads0 = thread_cpu()
    cpu0, wall0 = _cpu(), time.perf_counter()
    for epoch in epochs:
        for _ in epoch:
            n += 1
            if step_s:
                time.sleep(step_s)
    cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu().items()}
    return cpu, wall, n, threads


def _torch_loader(fmt: str, paths: list[str], batch_size: int) -> torch.utils.data.DataLoader:
    index = build_index(paths)
    if fmt == "tar":
        pipeline = webdataset_pipeline(index.shards, index.schema, batch_size=batch_size,
                                       shuffle=True, seed=0)
        return torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=2,
                                           pin_memory=True, persistent_workers=True)
    dataset = ArrowMapDataset(index.shards, index.sizes, index.schema, "arrow-file")
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                       num_workers=2, pin_memory=True,
                                       persistent_workers=True)


SHARED_MEMORY = {"off": "TCP frames", "auto": "same-host shared memory"}


def metrics_overhead(endpoint: str, batch_size: int, rounds: int) -> list:
    """Rows (name, CPU s, wall s, batches) of loaders without and with metrics, timed an epoch
    each in turn for ``rounds`` rounds."""
    totals = {"off": [0.0, 0.0, 0.0], "on": [0.0, 0.0, 0.0]}  # CPU s, wall s, batches
    kw: dict[str, Any] = {"batch_size": batch_size, "rank": 0, "world_size": 1, "timeout": 60}
    with DataLoader(endpoint, **kw) as off, DataLoader(
            endpoint, metrics=CollectorRegistry(), **kw) as on:
        loaders = {"off": off, "on": on}
        for dl in loaders.values():
            next(iter(dl))
        for _ in range(rounds):
            for key, dl in loaders.items():
                totals[key] = [t + m for t, m in zip(totals[key], measure([dl])[:3], strict=True)]
    return [(f"dataflow DataLoader, metrics {key} (alternating epochs)", cpu, wall, int(n))
            for key, (cpu, wall, n) in totals.items()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.trainer_cpu",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--format", choices=("arrow", "tar"), default="arrow",
                   help="demo shard format; tar is compared with torch + webdataset "
                   "(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--epochs", type=int, default=10,
                   help="timed epochs after one warm-up epoch (default: %(default)s)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="sleep per batch, like a GPU step; with a step the loaders' request "
                   "windows are full and every batch is a hand-over (default: %(default)s)")
    p.add_argument("--shards", type=int, default=8, help="default: %(default)s")
    p.add_argument("--samples-per-shard", type=int, default=1000, help="default: %(default)s")
    p.add_argument("--batches-per-request", type=per_request, default="auto",
                   help="the DataLoader's batches_per_request: auto, or 1 to 64 "
                        "(default: %(default)s)")
    p.add_argument("--metrics-rounds", type=int, default=0,
                   help="also compare loaders with and without metrics=registry over this "
                        "many alternating epochs each (default: 0, not measured)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-trainer-cpu-") as tmp:
        demo = make_demo(tmp, DemoSpec(fmt=args.format, shards=args.shards,
                                       samples_per_shard=args.samples_per_shard), progress=None)
        kind = ("webdataset pipeline" if args.format == "tar" else "map-style Arrow")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_dl = _torch_loader(args.format, list(demo.paths), args.batch_size)
            for _ in torch_dl:
                pass
            cpu, wall, n, _ = measure((torch_dl for _ in range(args.epochs)),
                                      args.step_ms / 1e3)
        rows.append((f"torch DataLoader(num_workers=2, pin_memory=True), {kind}", cpu, wall, n))
        del torch_dl

        by_thread = {}
        with launch(list(demo.paths), workers=2) as server:
            for mode, path in SHARED_MEMORY.items():
                with DataLoader(server.endpoint, batch_size=args.batch_size, rank=0,
                                world_size=1, timeout=60, shared_memory=mode,
                                batches_per_request=args.batches_per_request) as dl:
                    for _ in dl:
                        pass
                    cpu, wall, n, by_thread[path] = measure(
                        (dl for _ in range(args.epochs)), args.step_ms / 1e3)
                    if (dl.stats()["shm_batches"] > 0) != (mode == "auto"):
                        raise RuntimeError(f"shared_memory={mode!r}: "
                                           f"{dl.stats()['shm_batches']} batches through it")
                rows.append((f"dataflow DataLoader, 1 server --workers 2, {path}, "
                             f"batches_per_request={args.batches_per_request}", cpu, wall, n))
            if args.metrics_rounds:
                rows += metrics_overhead(server.endpoint, args.batch_size,
                                         args.metrics_rounds)

    base = rows[0][1] / rows[0][3]
    command = " ".join(argv or sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.trainer_cpu {command}".rstrip())
    print(f"{demo.total} samples in {args.shards} {args.format} shards, batch {args.batch_size}, "
          f"{args.epochs} timed epochs after warm-up, step {args.step_ms:g} ms, CUDA available: "
          f"{torch.cuda.is_available()}")
    print()
    print("| loader | batches | trainer CPU s | CPU ms / batch | wall s | ratio to torch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, cpu, wall, n in rows:
        print(f"| {name} | {n} | {cpu:.2f} | {1000 * cpu / n:.2f} | {wall:.2f} | "
              f"{cpu / n / base:.2f} |")
    for row, (path, threads) in zip(rows[1:], by_thread.items(), strict=False):
        n = row[3]
        print(f"\ndataflow trainer CPU by thread ({path}), ms / batch: " + ", ".join(
            f"{name} {1000 * s / n:.2f}"
            for name, s in sorted(threads.items(), key=lambda t: -t[1]) if s > 0))
    if args.metrics_rounds:
        (_, off_cpu, _, off_n), (_, on_cpu, _, on_n) = rows[-2:]
        ratio = on_cpu / on_n / (off_cpu / off_n)
        print(f"\nmetrics on vs off: trainer CPU per batch x{ratio:.3f}")


if __name__ == "__main__":
    main()
