"""Same-host shared memory vs TCP frames: the client's receive rate and the CPU it saves.

The same Arrow dataset (one fixed-size uint8 field, 64 KiB per sample) is served by one real
loader server and read by the real DataLoader on this host, at each batch size, with
``shared_memory="auto"`` (batches land in the loader's ``/dev/shm`` segment; the run checks
that every batch did) and ``"off"`` (TCP frames over loopback), interleaved, ``--repeats``
times each; the table gives the median of each. Receiver CPU is the DataLoader process's (all
threads: ZeroMQ's I/O thread included) per GiB received; reader CPU is the server's reader
processes' per GiB served (they copy into the slot instead of handing frames to ZeroMQ). On a
loaded machine GB/s is noise; the CPU per GiB is the figure that shows the copies saved.

With ``--device cuda`` the DataLoader delivers every batch on the GPU (from its slot in the
registered segment, or from its pinned ring for TCP frames) and the clock stops after the last
copy has finished: the rate is host to GPU memory.

Usage: python -m dataflow.bench.experiments.shm [--batch-bytes 4194304 19267584] [--gib 1]
    [--repeats 3] [--workers 2] [--prefetch 4] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

from dataflow.bench.experiments.transport import BATCHES_PER_SHARD, SHARDS, write_dataset
from dataflow.client import DataLoader
from dataflow.server import launch

MODES = ("off", "auto")
SAMPLE_BYTES = 64 * 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _proc_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of processes ``pids`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _synchronize(device: str | None) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run(endpoint: str, readers: list[int], batch: int, epochs: int, mode: str,
        device: str | None = None, prefetch: int = 4) -> tuple[float, float, float]:
    """GB/s through the DataLoader (an untimed warm-up epoch first), receiver CPU s/GiB and
    reader CPU s/GiB, with ``shared_memory=mode``, batches delivered on ``device``, ``prefetch``
    batches in flight."""
    with DataLoader(endpoint, batch_size=batch, rank=0, world_size=1, shuffle=False,
                    prefetch=prefetch, timeout=60, shared_memory=mode, device=device,
                    shared_memory_slot_bytes=batch * SAMPLE_BYTES) as dl:
        for _ in dl:
            pass
        _synchronize(device)
        nbytes = 0
        start, cpu, rcpu = time.perf_counter(), _cpu(), _proc_cpu(readers)
        for _ in range(epochs):
            for b in dl:
                nbytes += b["x"].numel()
        _synchronize(device)
        elapsed, cpu, rcpu = (time.perf_counter() - start, _cpu() - cpu,
                              _proc_cpu(readers) - rcpu)
        stats = dl.stats()  # batches read ahead may be received and not delivered yet
        every = stats["shm_batches"] >= stats["delivered"] > 0
        if (every, stats["shm_batches"] > 0) != ((True, True) if mode == "auto"
                                                  else (False, False)):
            raise RuntimeError(f"shared_memory={mode!r}: {stats['shm_batches']} of "
                               f"{stats['delivered']} batches through shared memory")
    gib = nbytes / 2**30
    return nbytes / elapsed / 1e9, cpu / gib, rcpu / gib


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.shm",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-bytes", type=int, nargs="+", default=[4 * 2**20, 19_267_584],
                   help="bytes per batch (rounded down to whole 64 KiB samples)")
    p.add_argument("--gib", type=float, default=1.0, help="data timed per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="reader processes")
    p.add_argument("--prefetch", type=int, default=4,
                   help="the DataLoader's prefetch: batches in flight (default: %(default)s)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the DataLoader delivers batches (default: %(default)s)")
    args = p.parse_args(argv)
    device = "cuda" if args.device == "cuda" else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-shm-") as tmp:
        for want in args.batch_bytes:
            batch = max(1, want // SAMPLE_BYTES)
            size = batch * SAMPLE_BYTES
            epoch_bytes = SHARDS * BATCHES_PER_SHARD * batch * SAMPLE_BYTES
            epochs = max(1, round(args.gib * 2**30 / epoch_bytes))
            out = os.path.join(tmp, str(batch))
            os.mkdir(out)
            paths = write_dataset(out, SAMPLE_BYTES, batch)
            got: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
            with launch(paths, workers=args.workers, timeout=120) as server:
                readers = list(server.ready["worker_pids"])
                for _ in range(args.repeats):
                    for mode in MODES:
                        got[mode].append(run(server.endpoint, readers, batch, epochs, mode, device,
                                              args.prefetch))
            for mode in MODES:
                rates, cpus, rcpus = zip(*got[mode], strict=True)
                rows.append((size, mode, statistics.median(rates), min(rates), max(rates),
                             statistics.median(cpus), statistics.median(rcpus)))
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.shm {command}".rstrip())
    print(f"one server, {args.workers} reader(s), prefetch {args.prefetch}, same host, "
          f"{os.cpu_count()} CPUs, batches "
          f"delivered on {args.device}; median of "
          f"{args.repeats} interleaved runs (GB/s range in brackets)")
    print()
    print("| batch | path | GB/s | receiver CPU s / GiB | reader CPU s / GiB |")
    print("| --- | --- | --- | --- | --- |")
    for size, mode, rate, lo, hi, cpu, rcpu in rows:
        path = "shared memory" if mode == "auto" else "TCP frames (loopback)"
        print(f"| {size / 1e6:.1f} MB | {path} | {rate:.2f} [{lo:.2f}-{hi:.2f}] | {cpu:.3f} | "
              f"{rcpu:.3f} |")


if __name__ == "__main__":
    main()
