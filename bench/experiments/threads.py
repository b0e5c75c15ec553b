"""Which thread bounds one rank's receive: how busy every thread of the trainer process, of the
server's front process and of its reader processes is, over whole epochs of TCP frames.

For each batch size (``--sizes``, as :mod:`.transport`: ``4mib``, ``19mb``) and each
``--io-threads`` value, one real server with ``--workers`` readers serves the Arrow dataset of
:mod:`.transport` to one real DataLoader (``shared_memory="off"``, no shuffle) for about
``--gib`` GiB of whole epochs after a warm-up epoch; each thread's CPU seconds (user + system,
``/proc/<pid>/task/<tid>/stat``) over the wall time of those epochs is its busy fraction. The
trainer's threads are named by what they are: the consumer (the thread iterating), the
loader's I/O thread, ZeroMQ's I/O threads (``ZMQbg/IO/N``); a thread near 100% is the bound.

Usage: python -m dataflow.bench.experiments.threads [--sizes 4mib 19mb] [--gib 2]
    [--workers 2] [--io-threads 1 2] [--min-busy 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

from dataflow.bench.experiments.transport import SIZES, write_dataset
from dataflow.client import DataLoader
from dataflow.server import launch

TICK = os.sysconf("SC_CLK_TCK")
IO_THREAD = "dataflow-client-io"  # the name of a DataLoader's I/O thread (client/iothread.py)
Key = tuple[str, int, str]  # (process role, thread id, thread name)


def thread_cpu(pid: int, role: str, names: dict[int, str]) -> dict[Key, float]:
    """CPU seconds of every thread of process ``pid`` so far, by (role, tid, name); ``names``
    names threads of this process the kernel knows only as ``python``."""
    out: dict[Key, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except FileNotFoundError:  # the thread ended
            continue
        name = names.get(int(tid), comm)
        out[(role, int(tid), name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def measure(endpoint: str, server_pids: list[int], batch: int, gib: float,
            io_threads: int) -> tuple[float, dict[Key, float]]:
    """GB/s through the DataLoader and each thread's busy fraction over the timed epochs."""
    with DataLoader(endpoint, batch_size=batch, rank=0, world_size=1, shuffle=False,
                    prefetch=4, timeout=60, io_threads=io_threads,
                    shared_memory="off") as dl:
        epoch_bytes = sum(b["x"].numel() for b in dl)
        epochs = max(1, round(gib * 2**30 / epoch_bytes))
        names = {t.native_id: "loader I/O thread" for t in threading.enumerate()
                 if t.name == IO_THREAD and t.native_id is not None}
        names[threading.get_native_id()] = "consumer"

        def snap() -> dict[Key, float]:
            out = thread_cpu(os.getpid(), "trainer", names)
            for i, pid in enumerate(server_pids):
                out.update(thread_cpu(pid, "server front" if i == 0 else f"reader {i}", {}))
            return out

        before, start = snap(), time.perf_counter()
        for _ in range(epochs):
            for _ in dl:
                pass
        wall, after = time.perf_counter() - start, snap()
    busy = {k: (v - before.get(k, v)) / wall for k, v in after.items()}
    return epochs * epoch_bytes / wall / 1e9, busy


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.threads",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["4mib", "19mb"],
                   help="batch sizes measured (default: %(default)s)")
    p.add_argument("--gib", type=float, default=2.0,
                   help="data timed per measurement (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2,
                   help="reader processes of the server (default: %(default)s)")
    p.add_argument("--io-threads", type=int, nargs="+", default=[1, 2],
                   help="the DataLoader's io_threads values tried (default: %(default)s)")
    p.add_argument("--min-busy", type=float, default=5.0,
                   help="threads less busy than this percentage are left out (default: "
                        "%(default)s)")
    args = p.parse_args(argv)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.threads {command}".rstrip())
    print(f"loopback TCP, {os.cpu_count()} CPUs, {args.workers} reader(s); busy = a thread's "
          "CPU time / wall time of the timed epochs")
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        for size in args.sizes:
            sample, batch = SIZES[size]
            out = os.path.join(tmp, size)
            os.mkdir(out)
            paths = write_dataset(out, sample, batch)
            with launch(paths, workers=args.workers, timeout=120) as server:
                pids = [server.pid, *server.ready["worker_pids"]]
                for io in args.io_threads:
                    rate, busy = measure(server.endpoint, pids, batch, args.gib, io)
                    print(f"\n{size}, io_threads={io}: {rate:.2f} GB/s")
                    print("| process | thread | busy |")
                    print("| --- | --- | ---: |")
                    for (role, _, name), b in sorted(busy.items(), key=lambda kv: -kv[1]):
                        if b * 100 >= args.min_busy:
                            print(f"| {role} | {name} | {b * 100:.1f}% |")


if __name__ == "__main__":
    main()
