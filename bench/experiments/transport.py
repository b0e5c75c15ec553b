"""P1: server -> client throughput of large batches vs raw pyzmq PUSH/PULL, same run.

Writes an Arrow dataset of one fixed-size uint8 field (64 KiB per sample), serves it with the
real loader server and reads it with the real DataLoader in 4 MiB batches over loopback TCP
(each reader process sends its batches straight to the client's data connection to it; the
server's front process only routes requests and credits),
then measures raw pyzmq PUSH/PULL (zero-copy send, zero-copy receive) of 4 MiB messages between
two processes on the same machine. Prints a table; the target ratio is >= 0.70. On a loaded
machine the throughput ratio is noise; the receiving process's CPU seconds per GiB (all its
threads: ZeroMQ's I/O thread and the client's included) is the load-insensitive figure: the
receiver is the bottleneck, and its CPU per GiB relative to raw pyzmq's bounds the ratio.

Usage: python -m dataflow.bench.experiments.transport [--mib-per-batch 4] [--gib 2] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import zmq

from dataflow.client import DataLoader
from dataflow.server import launch

SAMPLE_BYTES = 64 * 1024

_PUSHER = """
import sys, numpy as np, zmq
n, size = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
sock = ctx.socket(zmq.PUSH)
sock.setsockopt(zmq.SNDHWM, 16)
port = sock.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
buf = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
for _ in range(n):
    sock.send(buf, copy=False)
sock.close(linger=-1)
ctx.term()
"""


def write_dataset(out: str, shards: int, samples: int) -> list[str]:
    """Arrow IPC files with one ``fixed_size_binary(64 KiB)`` field ``x``."""
    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        data = rng.integers(0, 255, samples * SAMPLE_BYTES, dtype=np.uint8)
        arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(SAMPLE_BYTES), samples,
                                                   [None, pa.py_buffer(data)])
        table = pa.table({"x": arr})
        path = os.path.join(out, f"big-{s:04d}.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table, max_chunksize=64)
        paths.append(path)
    return paths


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raw_zmq(n: int, size: int) -> tuple[float, float]:
    """Bytes/s of ``n`` raw PUSH/PULL messages of ``size`` bytes from a second process, and
    the receiving process's CPU seconds per GiB."""
    proc = subprocess.Popen([sys.executable, "-c", _PUSHER, str(n), str(size)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None  # stdout=PIPE
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.PULL)
    try:
        port = int(proc.stdout.readline())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 30_000)
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.recv(copy=False)
        start, cpu = time.perf_counter(), _cpu()
        for _ in range(n - 1):
            sock.recv(copy=False)
        elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
        return (n - 1) * size / elapsed, cpu / ((n - 1) * size / 2**30)
    finally:
        sock.close(linger=0)
        proc.wait(30)


def dataflow_rate(endpoint: str, batch: int, epochs: int) -> tuple[float, int, float]:
    """Bytes/s through the DataLoader (first epoch is warm-up), batches timed, and the
    client process's CPU seconds per GiB."""
    with DataLoader(endpoint, batch_size=batch, rank=0, world_size=1, shuffle=False,
                    prefetch=4, timeout=60) as dl:
        for _ in dl:
            pass
        nbytes = 0
        count = 0
        start, cpu = time.perf_counter(), _cpu()
        for _ in range(epochs):
            for b in dl:
                nbytes += b["x"].numel()
                count += 1
        cpu = _cpu() - cpu
        return nbytes / (time.perf_counter() - start), count, cpu / (nbytes / 2**30)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.transport",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--mib-per-batch", type=int, default=4)
    p.add_argument("--gib", type=float, default=2.0, help="data timed per measurement")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = p.parse_args(argv)
    batch = args.mib_per_batch * 1024 * 1024 // SAMPLE_BYTES
    size = batch * SAMPLE_BYTES
    shards, per_shard = 4, 4 * batch
    epoch_bytes = shards * per_shard * SAMPLE_BYTES
    epochs = max(1, round(args.gib * 1024**3 / epoch_bytes))
    n_raw = max(2, int(args.gib * 1024**3 // size))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        paths = write_dataset(tmp, shards, per_shard)
        raw, raw_cpu = raw_zmq(n_raw, size)
        rows.append(("raw pyzmq PUSH/PULL (copy=False both ends)", "-", raw, n_raw - 1,
                     raw_cpu))
        for w in args.workers:
            with launch(paths, workers=w, timeout=120) as server:
                rate, count, cpu = dataflow_rate(server.endpoint, batch, epochs)
            rows.append(("dataflow server + DataLoader (reader -> client direct)", str(w), rate,
                         count, cpu))
        raw2, raw2_cpu = raw_zmq(n_raw, size)
        rows.append(("raw pyzmq PUSH/PULL (again)", "-", raw2, n_raw - 1, raw2_cpu))
    base = (raw + raw2) / 2
    base_cpu = (raw_cpu + raw2_cpu) / 2
    command = " ".join(argv or sys.argv[1:])
    print(f"command: python -m dataflow.bench.experiments.transport {command}".rstrip())
    print(f"message/batch size {size / 2**20:.0f} MiB, loopback tcp, {os.cpu_count()} CPUs")
    print()
    print("| path | server workers | GB/s | messages | ratio to raw (mean of both raw runs) "
          "| receiver CPU s / GiB | raw's CPU / this CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, w, rate, count, cpu in rows:
        print(f"| {name} | {w} | {rate / 1e9:.2f} | {count} | {rate / base:.2f} | {cpu:.2f} | "
              f"{base_cpu / cpu:.2f} |")


if __name__ == "__main__":
    main()
