"""P1: server -> client throughput of large batches vs the best raw pyzmq receiver, same run.

For each batch size (``--sizes``: ``4mib``, 64 samples of 64 KiB; ``19mb``, 128 samples of
3x224x224 uint8 = 150,528 bytes), writes an Arrow dataset of one fixed-size binary field
``x`` (``--record-batch-rows``: by default one record batch per batch, so a reader sends each
batch zero-copy from its map and a request of several batches is joined by a copy; 1000, the
rows of a record batch as Hugging Face ``datasets`` writes them, keeps a run of batches in one
record batch, read zero-copy), serves
it with the real loader server (``--workers`` reader processes, each sending its batches
straight to the client's data connection to it) and reads it with the real DataLoader over
loopback TCP, once per ``--io-threads`` value of the loader's ZeroMQ context. The same bytes
go through raw pyzmq PUSH/PULL (zero-copy send and receive, one message per batch) in every
``--raw`` configuration: ``SxKxT`` is S sender processes, K receiving PULL sockets (one
connected to every sender, or one per sender, polled by one thread) and T I/O threads in the
receiving context. Every measurement is repeated ``--repeats`` times, interleaved (one round
runs every configuration in turn), and reported as the median with its range; the ratio of
each dataflow row is to the raw configuration with the highest median at that size (the
issue's goal: >= 0.8). The receiving process's CPU seconds per GiB (all its threads) is the
load-insensitive figure beside it. The process's malloc is set as a DataLoader sets it
(:mod:`dataflow.heap`) before anything is received, so raw pyzmq's receives get the same.

Usage: python -m dataflow.bench.experiments.transport [--sizes 4mib 19mb] [--gib 0.5]
[--workers 1 2] [--io-threads 1 2] [--raw 1x1x1 1x1x2 1x1x4 2x2x2] [--repeats 3]
[--record-batch-rows N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zmq

from dataflow.bench.experiments.args import per_request
from dataflow.client import DataLoader
from dataflow.heap import THREAD_HEAP_BYTES, keep_freed_memory
from dataflow.server import launch

# name -> (bytes per sample, samples per batch)
SIZES = {"4mib": (64 * 1024, 64), "19mb": (3 * 224 * 224, 128)}
SHARDS = 4
BATCHES_PER_SHARD = 4

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


@dataclass(frozen=True)
class Raw:
    """A raw pyzmq receiving configuration: ``senders`` processes, ``sockets`` PULL sockets
    (1: one connected to every sender; else one per sender), ``io_threads`` in the receiving
    context."""

    senders: int
    sockets: int
    io_threads: int

    @classmethod
    def parse(cls, text: str) -> Raw:
        try:
            s, k, t = (int(v) for v in text.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"raw configuration must be SxKxT (senders x "
                                             f"sockets x io_threads). Found: {text!r}") from None
        if min(s, k, t) < 1 or k not in (1, s):
            raise argparse.ArgumentTypeError(f"raw configuration {text!r}: every number >= 1, "
                                             "and sockets 1 or one per sender")
        return cls(s, k, t)

    def __str__(self) -> str:
        return (f"{self.senders} sender(s), {self.sockets} PULL socket(s), "
                f"io_threads={self.io_threads}")


def write_dataset(out: str, sample_bytes: int, batch: int,
                  record_batch_rows: int | None = None) -> list[str]:
    """Arrow IPC files with one ``fixed_size_binary(sample_bytes)`` field ``x``, one record
    batch per ``record_batch_rows`` samples (default: ``batch``)."""
    rng = np.random.default_rng(0)
    samples = BATCHES_PER_SHARD * batch
    paths = []
    for s in range(SHARDS):
        data = rng.integers(0, 255, samples * sample_bytes, dtype=np.uint8)
        arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(sample_bytes), samples,
                                                   [None, pa.py_buffer(data)])
        table = pa.table({"x": arr})
        path = os.path.join(out, f"big-{sample_bytes}-{s:04d}.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table, max_chunksize=record_batch_rows or batch)
        paths.append(path)
    return paths


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raw_zmq(config: Raw, n: int, size: int) -> tuple[float, float]:
    """Bytes/s of ``n`` raw PUSH/PULL messages of ``size`` bytes from ``config.senders``
    processes, and the receiving process's CPU seconds per GiB (the first ``senders``
    messages are not timed: a poll that brings several counts each, so no message is waited
    for twice)."""
    per = [n // config.senders + (i < n % config.senders) for i in range(config.senders)]
    procs = [subprocess.Popen([sys.executable, "-c", _PUSHER, str(k), str(size)],
                              stdout=subprocess.PIPE) for k in per]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=config.io_threads)
    socks: list[zmq.Socket[bytes]] = []
    try:
        for _ in range(config.sockets):
            sock = ctx.socket(zmq.PULL)
            sock.setsockopt(zmq.LINGER, 0)
            socks.append(sock)
        for i, proc in enumerate(procs):
            assert proc.stdout is not None  # stdout=PIPE
            port = int(proc.stdout.readline())
            socks[i % config.sockets].connect(f"tcp://127.0.0.1:{port}")
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        first = [0]  # the first messages, connections up (a poll may bring several)
        while first[0] < config.senders:
            if not _recv_some(poller, 30_000, lambda: first.__setitem__(0, first[0] + 1)):
                raise TimeoutError("raw pyzmq: no message for 30 s")
        timed = n - first[0]
        left = [timed]
        start, cpu = time.perf_counter(), _cpu()
        while left[0] > 0:
            if not _recv_some(poller, 30_000, lambda: left.__setitem__(0, left[0] - 1)):
                raise TimeoutError("raw pyzmq: no message for 30 s")
        elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
        return timed * size / elapsed, cpu / (timed * size / 2**30)
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
        for proc in procs:
            proc.wait(30)


def _recv_some(poller: zmq.Poller, timeout_ms: int, got: Callable[[], None]) -> bool:
    """Receive one message from each socket ``poller`` finds ready; False on a timeout."""
    ready = poller.poll(timeout_ms)
    for sock, _ in ready:
        sock.recv(copy=False)
        got()
    return bool(ready)


def dataflow_rate(endpoint: str, batch: int, gib: float, io_threads: int,
                  per_request: int | str = "auto") -> tuple[float, float]:
    """Bytes/s through the DataLoader (after one warm-up epoch; whole epochs of about ``gib``
    GiB timed) and the client process's CPU seconds per GiB."""
    with DataLoader(endpoint, batch_size=batch, rank=0, world_size=1, shuffle=False,
                    prefetch=4, timeout=60, io_threads=io_threads,
                    batches_per_request=per_request,
                    shared_memory="off") as dl:  # the link's path: TCP frames
        epoch_bytes = 0
        for b in dl:
            epoch_bytes += b["x"].numel()
        epochs = max(1, round(gib * 2**30 / epoch_bytes))
        start, cpu = time.perf_counter(), _cpu()
        for _ in range(epochs):
            for _ in dl:
                pass
        elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
        nbytes = epochs * epoch_bytes
        return nbytes / elapsed, cpu / (nbytes / 2**30)


def _spread(values: list[float], scale: float) -> str:
    return (f"{statistics.median(values) / scale:.2f} "
            f"({min(values) / scale:.2f}-{max(values) / scale:.2f})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.transport",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["4mib", "19mb"],
                   help="batch sizes measured (default: %(default)s)")
    p.add_argument("--gib", type=float, default=0.5,
                   help="data timed per measurement (default: %(default)s)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="reader processes of the server (default: %(default)s)")
    p.add_argument("--io-threads", type=int, nargs="+", default=[1, 2],
                   help="the DataLoader's io_threads values tried (default: %(default)s)")
    p.add_argument("--batches-per-request", type=per_request, nargs="+", default=["auto"],
                   help="the DataLoader's batches_per_request values tried: auto, or 1 to 64 "
                        "(default: %(default)s)")
    p.add_argument("--raw", type=Raw.parse, nargs="+",
                   default=[Raw(1, 1, 1), Raw(1, 1, 2), Raw(1, 1, 4), Raw(2, 2, 2)],
                   help="raw pyzmq configurations SxKxT: S senders, K PULL sockets (1 or S), "
                        "T receiving io_threads (default: 1x1x1 1x1x2 1x1x4 2x2x2)")
    p.add_argument("--record-batch-rows", type=int, default=None,
                   help="rows of each record batch of the dataset written (default: one "
                        "record batch per batch; 1000 as Hugging Face `datasets` writes)")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved rounds; medians and ranges are reported "
                        "(default: %(default)s)")
    args = p.parse_args(argv)
    if args.record_batch_rows is not None and args.record_batch_rows < 1:
        p.error(f"--record-batch-rows must be >= 1. Found: {args.record_batch_rows}")
    keep_freed_memory(top_pad=THREAD_HEAP_BYTES)
    rows: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        for name in args.sizes:
            sample_bytes, batch = SIZES[name]
            size = sample_bytes * batch
            n_raw = max(2 * max(r.senders for r in args.raw), int(args.gib * 2**30 // size))
            paths = write_dataset(tmp, sample_bytes, batch, args.record_batch_rows)
            servers = {w: launch(paths, workers=w, timeout=120) for w in args.workers}
            try:
                for _ in range(args.repeats):
                    for raw in args.raw:
                        rows.setdefault((name, "raw pyzmq PUSH/PULL", str(raw)), []).append(
                            raw_zmq(raw, n_raw, size))
                    for w, server in servers.items():
                        for t in args.io_threads:
                            for k in args.batches_per_request:
                                key = (name, "dataflow server + DataLoader",
                                       f"{w} reader(s), io_threads={t}, "
                                       f"batches_per_request={k}")
                                rows.setdefault(key, []).append(
                                    dataflow_rate(server.endpoint, batch, args.gib, t, k))
            finally:
                for server in servers.values():
                    server.close()
    command = " ".join(argv if argv is not None else sys.argv[1:])
    batch_word = "a batch's"
    print(f"command: python -m dataflow.bench.experiments.transport {command}".rstrip())
    print(f"loopback tcp, {os.cpu_count()} CPUs, {args.repeats} interleaved rounds: median "
          f"(min-max); a record batch: {args.record_batch_rows or batch_word} rows")
    print()
    print("| batch | path | configuration | GB/s | ratio to best raw | receiver CPU s / GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.sizes:
        here = {k: v for k, v in rows.items() if k[0] == name}
        best = max((k for k in here if k[1].startswith("raw")),
                   key=lambda k: statistics.median(r for r, _ in here[k]))
        base = statistics.median(r for r, _ in here[best])
        for key, got in here.items():
            rates = [r for r, _ in got]
            mark = " (best raw)" if key == best else ""
            print(f"| {name} | {key[1]} | {key[2]}{mark} | {_spread(rates, 1e9)} | "
                  f"{_spread(rates, base)} | {_spread([c for _, c in got], 1)} |")


if __name__ == "__main__":
    main()
