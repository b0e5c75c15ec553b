"""Decode once, serve many: the readers' decoded-sample cache on the JPEG workload (:mod:`.jpeg`).

One run, three parts, every server running ``--transform
dataflow.bench.experiments.jpeg:STAGES`` (decode JPEGs to 256x256 pixels, a cacheable stage,
then a random 224 crop seeded per batch; ``--image-size`` sets the JPEGs' size, 256x256 by
default, larger ones are resized and center-cropped in the decode stage as ImageNet training
does, see :mod:`.jpeg`), server CPU measured as the CPU time of the server's
processes (frontend and readers):

* **epochs**: one job (one rank) reading epochs 0, 1, 2 from a server with the cache
  (``--cache-memory`` holding the decoded set in each reader, ``--cache-disk`` on /dev/shm
  shared by the readers) and from one without: samples/s, server CPU ms per sample, and the
  cache's hits per epoch.
* **sweep**: ``--jobs`` jobs of different seeds started together on one fresh cached server,
  against one job alone on a fresh cached server, and the same sweep on an uncached server:
  total server CPU of the epoch, each job's samples/s.
* **eviction**: a cache smaller than the decoded set under the sweep: the hit rate of LRU and of
  plan-aware eviction (``--cache-plan-window``: each request announces the next samples its
  session reads) measured on servers with one reader and no disk tier, and computed offline
  for LRU and for Belady's rule over the jobs' whole orders (the most a plan-aware eviction
  can reach) on the same access stream, the jobs' global orders
  (:func:`dataflow.shuffle.epoch_order`) interleaved batch by batch.

Usage: python -m dataflow.bench.experiments.cache [--workers 2] [--batch-size 64] [--jobs 4]
[--image-size 256x256] [--parts epochs,sweep,eviction] [--plan-window 2048]
"""

from __future__ import annotations

import argparse
import heapq
import os
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections import OrderedDict

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from dataflow.bench.experiments.jpeg import SIDE, parse_size, write_shards
from dataflow.bench.procs import cpu_delta, cpu_snapshot, descendants
from dataflow.client import DataLoader
from dataflow.server import ServerHandle, launch
from dataflow.shuffle import epoch_order

STAGES = "dataflow.bench.experiments.jpeg:STAGES"
DECODED = SIDE * SIDE * 3  # bytes of one decoded sample's pixels


def _server(paths: list[str], workers: int, cache: list[str]) -> ServerHandle:
    return launch(paths, workers=workers,
                  extra_args=["--transform", STAGES, "--metrics-port", "0", *cache])


def _counts(srv: ServerHandle) -> dict[str, float]:
    """The server's cache counters: hits (both tiers), misses."""
    url = f"http://127.0.0.1:{srv.ready['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {"hits": 0.0, "misses": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "dataflow_cache_hits_total":
                out["hits"] += s.value
            elif s.name == "dataflow_cache_misses_total":
                out["misses"] += s.value
    return out


def _settled(srv: ServerHandle, timeout: float = 30.0) -> dict[str, float]:
    """The cache counters once two reads 0.5 s apart agree: the metrics are refreshed 4 times
    a second, and a closed loader's last requests (its next epoch, read ahead) are still
    served."""
    last, deadline = _counts(srv), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _counts(srv)
        if now == last:
            return now
        last = now
    return last


def _pids(srv: ServerHandle) -> list[int]:
    return [srv.pid, *descendants([srv.pid])]


def _epoch(endpoint: str, seed: int, epoch: int, bs: int) -> tuple[int, float]:
    """(samples, seconds) of one epoch of a fresh one-rank job."""
    with DataLoader(endpoint, batch_size=bs, rank=0, world_size=1, seed=seed,
                    timeout=300) as dl:
        dl.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for b in dl:
            n += len(b["image"])
        return n, time.perf_counter() - t0


def _measured(srv: ServerHandle, jobs: list[int], epoch: int,
              bs: int) -> tuple[float, list[float], dict[str, float]]:
    """Run one epoch of a job per seed of ``jobs``, together: (server CPU s, each job's
    samples/s, the cache counters' change)."""
    pids = _pids(srv)
    before, counts0 = cpu_snapshot(pids), _counts(srv)
    rates: list[float] = [0.0] * len(jobs)
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait()
            n, s = _epoch(srv.endpoint, jobs[i], epoch, bs)
            rates[i] = n / s
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    counts1 = _settled(srv)
    cpu = cpu_delta(before, cpu_snapshot(pids))
    return cpu, rates, {k: counts1[k] - counts0[k] for k in counts0}


def _hit_rate(counts: dict[str, float]) -> str:
    total = counts["hits"] + counts["misses"]
    return f"{counts['hits'] / total:.1%}" if total else "-"


def lru_hits(stream: np.ndarray, capacity: int) -> int:
    """Hits of an LRU of ``capacity`` samples over the access ``stream``."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for s in stream.tolist():
        if s in cache:
            hits += 1
            cache.move_to_end(s)
            continue
        cache[s] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def belady_hits(stream: np.ndarray, capacity: int) -> int:
    """Hits of Belady's rule (evict the sample used again furthest ahead) over ``stream``."""
    nxt = np.full(len(stream), len(stream), dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(len(stream) - 1, -1, -1):
        s = int(stream[i])
        nxt[i] = last.get(s, len(stream))
        last[s] = i
    held: dict[int, int] = {}  # sample -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, sample), stale entries skipped
    hits = 0
    for i, s in enumerate(stream.tolist()):
        if s in held:
            hits += 1
        elif len(held) >= capacity:
            while True:
                use, victim = heapq.heappop(heap)
                if held.get(victim) == -use:
                    del held[victim]
                    break
        held[s] = int(nxt[i])
        heapq.heappush(heap, (-int(nxt[i]), s))
    return hits


def sweep_stream(sizes: list[int], seeds: list[int], epochs: int, bs: int) -> np.ndarray:
    """The samples ``len(seeds)`` jobs read, epoch after epoch, their batches interleaved
    round robin."""
    out: list[np.ndarray] = []
    for epoch in range(epochs):
        orders = [epoch_order(sizes, epoch=epoch, seed=seed) for seed in seeds]
        for at in range(0, len(orders[0]), bs):
            out.extend(order[at:at + bs] for order in orders)
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.cache",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2,
                   help="reader processes per server (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="default: %(default)s")
    p.add_argument("--jobs", type=int, default=4, help="jobs of the sweep (default: %(default)s)")
    p.add_argument("--shards", type=int, default=4, help="default: %(default)s")
    p.add_argument("--samples-per-shard", type=int, default=500, help="default: %(default)s")
    p.add_argument("--image-size", type=parse_size, default=(SIDE, SIDE), metavar="WxH",
                   help="the JPEGs' width x height, each at least 256; larger ones are "
                        "resized to 256 on the shorter side and center-cropped by the decode "
                        "stage (ImageNet's most common size is 500x375) (default: 256x256)")
    p.add_argument("--small", type=float, default=0.5,
                   help="eviction part: the cache's size, a fraction of the decoded set "
                        "(default: %(default)s)")
    p.add_argument("--plan-window", type=int, default=2048,
                   help="eviction part: the plan-aware server's --cache-plan-window "
                        "(default: %(default)s)")
    p.add_argument("--parts", default="epochs,sweep,eviction",
                   help="which parts to run, comma-separated (default: %(default)s)")
    p.add_argument("--out", default="bench-out",
                   help="directory for the JPEG shards, reused (default: %(default)s)")
    args = p.parse_args(argv)
    width, height = args.image_size
    paths = write_shards(os.path.join(args.out, f"jpeg-{args.shards}x{args.samples_per_shard}"
                                                f"-{width}x{height}"),
                         args.shards, args.samples_per_shard, args.image_size)
    total = args.shards * args.samples_per_shard
    bs, w = args.batch_size, args.workers
    seeds = list(range(1, args.jobs + 1))
    decoded = total * DECODED
    memory = str(w * decoded * 2)  # every reader holds the decoded set, with room
    load0 = os.getloadavg()
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.cache {command}".rstrip())
    print(f"{len(paths)} JPEG tar shards x {args.samples_per_shard} ({width}x{height}, "
          f"{_jpeg_kib(paths):.0f} KiB a JPEG, decoded to {SIDE}x{SIDE}: decoded set "
          f"{decoded / 2**20:.0f} MiB), batch {bs}, {w} readers a server, {os.cpu_count()} CPUs\n")

    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        cached = ["--cache-memory", memory, "--cache-disk", shm]
        if "epochs" in parts:
            _epochs(paths, w, cached, bs, total)
        if "sweep" in parts:
            _sweep(paths, w, cached, bs, seeds)
    if "eviction" in parts:
        _eviction(paths, args, seeds, total)
    print(f"\nload average (1/5/15 min) {' / '.join(f'{x:.2f}' for x in load0)} at the start, "
          f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


def _jpeg_kib(paths: list[str]) -> float:
    """Mean size of a JPEG in the shards, KiB (the shards' bytes over their images)."""
    with tarfile.open(paths[0]) as tar:
        sizes = [m.size for m in tar.getmembers() if m.name.endswith(".jpg")]
    return sum(sizes) / max(1, len(sizes)) / 1024


def _epochs(paths: list[str], w: int, cached: list[str], bs: int, total: int) -> None:
    print("Epochs, one job (seed 1):\n")
    print("| server | epoch | samples/s | server CPU ms / sample | cache hits |")
    print("| --- | --- | --- | --- | --- |")
    for name, flags in (("uncached", []), ("cached", cached)):
        with _server(paths, w, flags) as srv:
            for epoch in range(3):
                cpu, rates, counts = _measured(srv, [1], epoch, bs)
                print(f"| {name} | {epoch} | {rates[0]:,.0f} | {cpu / total * 1e3:.2f} | "
                      f"{_hit_rate(counts)} |")


def _sweep(paths: list[str], w: int, cached: list[str], bs: int, seeds: list[int]) -> None:
    print(f"\nSweep, epoch 0, fresh servers; {len(seeds)} jobs (seeds {seeds}) together "
          "vs one alone:\n")
    print("| server | jobs | server CPU s | vs one job | each job's samples/s | "
          "vs alone | cache hits |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, flags in (("cached", cached), ("uncached", [])):
        with _server(paths, w, flags) as srv:
            cpu1, alone, counts = _measured(srv, [seeds[0]], 0, bs)
        print(f"| {name} | 1 | {cpu1:.1f} | 1.00x | {alone[0]:,.0f} | 1.00x | "
              f"{_hit_rate(counts)} |")
        with _server(paths, w, flags) as srv:
            cpu, rates, counts = _measured(srv, seeds, 0, bs)
        each = ", ".join(f"{r:,.0f}" for r in rates)
        vs = ", ".join(f"{r / alone[0]:.2f}" for r in rates)
        print(f"| {name} | {len(seeds)} | {cpu:.1f} | {cpu / cpu1:.2f}x | {each} | {vs} | "
              f"{_hit_rate(counts)} |")


def _eviction(paths: list[str], args: argparse.Namespace, seeds: list[int], total: int) -> None:
    bs = args.batch_size
    capacity = int(total * args.small)
    small = str(capacity * (DECODED + 512))
    print(f"\nEviction, a cache of {capacity} samples ({args.small:.0%} of the decoded set), "
          f"{len(seeds)} jobs, epochs 0 and 1, one server of 1 reader, --cache-memory "
          f"{int(small) / 2**20:.0f} MiB, no disk tier:\n")
    rows = []
    for name, flags in (("LRU", []), (f"plan-aware, window {args.plan_window}",
                                      ["--cache-plan-window", str(args.plan_window)])):
        with _server(paths, 1, ["--cache-memory", small, *flags]) as srv:
            cpu0, r0, c0 = _measured(srv, seeds, 0, bs)
            cpu1, r1, c1 = _measured(srv, seeds, 1, bs)
        measured = {k: c0[k] + c1[k] for k in c0}
        rate = sum(r0 + r1) / len(r0 + r1)
        rows.append(f"| {name} | {_hit_rate(measured)} | measured; server CPU "
                    f"{(cpu0 + cpu1) / (2 * total * len(seeds)) * 1e3:.2f} ms a sample, "
                    f"{rate:,.0f} samples/s a job |")
    stream = sweep_stream([args.samples_per_shard] * args.shards, seeds, 2, bs)
    print("| eviction | hit rate | how |")
    print("| --- | --- | --- |")
    print("\n".join(rows))
    print(f"| LRU | {lru_hits(stream, capacity) / len(stream):.1%} | computed, the stream of "
          "the jobs' orders interleaved batch by batch |")
    print(f"| Belady over the jobs' whole orders | "
          f"{belady_hits(stream, capacity) / len(stream):.1%} | computed, same stream (the "
          "bound of plan-aware eviction) |")


if __name__ == "__main__":
    main()
