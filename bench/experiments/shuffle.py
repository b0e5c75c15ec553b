"""Shuffle quality and cost: the plan's modes beside a full shuffle and webdataset's.

Run: ``python -m dataflow.bench.experiments.shuffle [--parts mix,scale,read,cost]
[--plan-samples 10000000] [--read-shards 8] [--read-samples-per-shard 2000] [--repeats 3]
[--read-layouts 8x1000,64x200,1024x50] [--read-batches 30] [--cost-layouts 8x1000,64x200]
[--cost-epochs 4] [--workers 2] [--max-open-shards N]``. Four parts, each a table:

``mix``: quality on small class-sorted data (100 classes x 400 samples in 20 shards of 5
classes each, batch 256, epochs 0 and 1, full batches only), for:

* ``torch RandomSampler``: a full uniform shuffle (``BatchSampler(RandomSampler)``, a seeded
  ``torch.Generator`` per epoch).
* ``webdataset``: its real pipeline over 20 tar shards written with ``webdataset.TarWriter``
  (members ``KEY.cls``): ``WebDataset(urls, shardshuffle=100, detshuffle=True, seed=e)``
  then ``.shuffle(1000, seed=e)`` for epoch ``e``; each ``cls`` member holds the sample id
  (its class is ``id // 400``).
* ``dataflow block (64, 8)``: ``shuffle="block"``.
* ``dataflow sample``: the default, ``shuffle="sample"`` (its window covers the dataset).

Columns: mean distinct classes per batch (of 100); the share of pairs of samples sharing a
batch in epoch 0 that share one again in epoch 1 (ideal: 256/40000 = 0.64%); the mean over
classes of the Kolmogorov-Smirnov distance between the class's normalised positions in the
epoch and the uniform distribution (a full shuffle gives ~0.04 with 400 samples per class,
storage order 0.99); seconds to compute one rank's batches (``rank_batches``) of a
``--plan-samples`` dataset in 1000 equal shards for world sizes 1 and 8 (best of
``--repeats``); samples/s of reading one epoch of rank 0 of 1 from a demo tar dataset
(``make_demo``, 3x64x64 images; indexes built and page cache warmed first), gathering each
batch two ways: ``open_shard(path).read(start, stop)`` per range, or
:func:`~dataflow.readers.read_ranges` (one ``read_many`` per shard of the batch, into one
set of columns).

``scale``: quality at ImageNet's size and beyond, from the plans alone (no data read):
class-sorted layouts of 1,280,000 samples in 1,024 shards and 4,096,000 in 4,096 shards,
1,000 classes each (shard ``k`` holds the next samples of the sorted order: about one class
per shard, or a class over four shards), batch 256, epochs 0 and 1. Rows: a full shuffle
(``torch.randperm``, what ``RandomSampler`` draws), the default, the sample shuffle with
smaller windows (a half, a quarter and a sixteenth of the dataset, and 2^18, the default
before), and the block shuffle. Columns: distinct classes per batch and its share of the
full shuffle's; co-batched pairs kept (as above) and its ratio to the full shuffle's; the
mean number of distinct shards a batch touches (what a server opens and reads per batch);
the shards one window spans (a batch draws from at most two consecutive windows: the
working set, in shards and in the share of the dataset's bytes); seconds for
``rank_batches`` of rank 0 of 1.

``read``: what a server's reader process spends on a batch: the CPU time
(``time.thread_time``, less moved by other load than the wall clock) of ``read_ranges`` and
the message's encoding, the last 8 messages kept (as queued sends), in this process, over
demo datasets of each of ``--read-layouts`` in tar
and Arrow with every shard open and the page cache warm, ``--read-batches`` batches of the
default shuffle and of ``shuffle="none"`` per run, ``--repeats`` runs of each interleaved
(medians), and the default's batches also gathered as before :mod:`dataflow.readers.sink`
(one ``read_many`` per shard into arrays of its own, then ``concat``); the last column
divides the difference between the default and ``"none"`` by the shards a batch of the
default touches.

``cost``: samples/s through the real loader at step 0 (a loop that only takes batches):
one local server (``--workers`` reader processes, ``--max-open-shards`` as given) on a demo
dataset of each of ``--cost-layouts`` (``SHARDSxSAMPLES``, 3x64x64 uint8 images) in tar and
Arrow, read by one
DataLoader (batch 256, ``shared_memory`` as by default) with the default shuffle and with
``shuffle="none"``, ``--cost-epochs`` epochs per run after one untimed batch,
after one untimed epoch of the default (so every reader opened nearly every shard before
anything is timed, not in the first run, which was ``"none"``'s), ``--repeats`` runs of each
interleaved (none, sample, none, ...); the table gives the
median samples/s of each, the median of the per-repeat ratios with their range, the reader
processes' CPU per sample, and the mean distinct shards a batch touches.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import BatchSampler, RandomSampler

from dataflow import wire
from dataflow.batch import Batch, concat
from dataflow.bench.experiments.mixing import distinct_classes, kept_pairs, ks_to_uniform
from dataflow.bench.procs import cpu_seconds
from dataflow.client import DataLoader
from dataflow.demo import DemoResult, DemoSpec, make_demo
from dataflow.plan import Batches, rank_batches
from dataflow.readers import ShardReader, open_shard, read_ranges
from dataflow.server import launch
from dataflow.shuffle import Shuffle

CLASSES, PER_CLASS, SHARDS, BATCH = 100, 400, 20, 256
TOTAL = CLASSES * PER_CLASS
LABELS = np.arange(TOTAL) // PER_CLASS  # sample id -> class; shard s holds 5 classes
MODES = {"dataflow block (64, 8)": "block", "dataflow sample (default)": "sample"}


def torch_epochs(epochs: int) -> list[list[np.ndarray]]:
    """Sample ids per batch of a full shuffle, one list per epoch."""
    out = []
    for epoch in range(epochs):
        gen = torch.Generator().manual_seed(epoch)
        sampler = BatchSampler(RandomSampler(range(TOTAL), generator=gen), BATCH, True)
        out.append([np.asarray(b) for b in sampler])
    return out


def webdataset_epochs(epochs: int, tmp: str) -> list[list[np.ndarray]]:
    """Sample ids per batch of webdataset's shard shuffle + ``shuffle(1000)``."""
    urls = []
    per_shard = TOTAL // SHARDS
    for s in range(SHARDS):
        urls.append(os.path.join(tmp, f"cls-{s:04d}.tar"))
        with wds.TarWriter(urls[-1]) as sink:
            for i in range(s * per_shard, (s + 1) * per_shard):
                sink.write({"__key__": f"{i:08d}", "cls": str(i).encode()})
    out = []
    for epoch in range(epochs):
        dataset = wds.WebDataset(urls, shardshuffle=100, detshuffle=True, seed=epoch,
                                 empty_check=False).shuffle(1000, seed=epoch).to_tuple("cls")
        ids = np.array([int(cls) for (cls,) in dataset])
        if sorted(ids.tolist()) != list(range(TOTAL)):
            raise RuntimeError("webdataset did not yield every sample exactly once")
        out.append(list(ids[: TOTAL // BATCH * BATCH].reshape(-1, BATCH)))
    return out


def plan_epochs(shuffle: str, epochs: int) -> list[list[np.ndarray]]:
    """Sample ids per batch of the dataflow plan (one rank) in mode ``shuffle``."""
    per_shard = TOTAL // SHARDS
    out = []
    for epoch in range(epochs):
        batches = rank_batches([per_shard] * SHARDS, world_size=1, rank=0, epoch=epoch, seed=0,
                               batch_size=BATCH, drop_last=True, shuffle=shuffle)
        out.append([np.concatenate([np.arange(r.shard * per_shard + r.start,
                                              r.shard * per_shard + r.stop) for r in batch])
                    for batch in batches])
    return out


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def plan_seconds(shuffle: str, samples: int, world_size: int, repeats: int) -> float:
    sizes = [samples // 1000] * 1000
    return best_of(repeats, lambda: rank_batches(sizes, world_size=world_size, rank=0, epoch=0,
                                                 seed=0, batch_size=BATCH, shuffle=shuffle))


def read_rates(shuffle: str, tmp: str, shards: int, per_shard: int,
               repeats: int) -> tuple[float, float]:
    """Samples/s of reading one epoch of rank 0 of 1 from a demo tar dataset, two ways.

    Returns:
        (one ``read`` per range joined with ``concat``, ``read_ranges`` per batch).
    """
    out = os.path.join(tmp, "demo-tar")
    if not os.path.isdir(out):
        make_demo(out, DemoSpec(fmt="tar", shards=shards, samples_per_shard=per_shard,
                                uneven=False), progress=None)
    paths = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    readers = [open_shard(p) for p in paths]
    try:
        sizes = [len(r) for r in readers]
        batches = rank_batches(sizes, world_size=1, rank=0, epoch=0, seed=0, batch_size=BATCH,
                               shuffle=shuffle)
        for r in readers:
            r.read(0, len(r))

        def by_range() -> None:
            for batch in batches:
                concat([readers[r.shard].read(r.start, r.stop) for r in batch])

        def by_shard() -> None:
            for i in range(len(batches)):
                read_ranges(readers.__getitem__, batches.rows(i))

        total = sum(sizes)
        return total / best_of(repeats, by_range), total / best_of(repeats, by_shard)
    finally:
        for r in readers:
            r.close()



LAYOUTS = ((1024, 1250), (4096, 1000))  # (shards, samples per shard), 1,000 classes each
SCALE_CLASSES = 1000


def _label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n:,}"


def _ids_of(batches: Batches, sizes: np.ndarray) -> list[np.ndarray]:
    """Sample ids of each batch of a plan over shards of ``sizes``."""
    offsets = np.cumsum(sizes) - sizes
    out = []
    for i in range(len(batches)):
        rows = batches.rows(i)
        lengths = rows[:, 2] - rows[:, 1]
        heads = np.cumsum(lengths) - lengths
        out.append(np.arange(int(lengths.sum())) + np.repeat(offsets[rows[:, 0]] + rows[:, 1]
                                                             - heads, lengths))
    return out


def scale_rows(shards: int, per_shard: int) -> list[list[str]]:
    """The ``scale`` table's rows for one layout (see the module)."""
    total = shards * per_shard
    sizes = np.full(shards, per_shard, dtype=np.int64)
    labels = np.arange(total) * SCALE_CLASSES // total
    shard_of = np.arange(total) // per_shard
    cut = total // BATCH * BATCH
    full = []
    for epoch in range(2):
        gen = torch.Generator().manual_seed(epoch)
        full.append(list(torch.randperm(total, generator=gen).numpy()[:cut].reshape(-1, BATCH)))
    ref_classes = distinct_classes(full[0], labels)
    ref_kept = kept_pairs(full[0], full[1], total)
    windows: list[tuple[str, Shuffle]] = [("dataflow sample (default)", Shuffle())]
    for share, name in ((2, "1/2"), (4, "1/4"), (16, "1/16")):
        windows.append((f"sample, window {name} of the data",
                        Shuffle(shuffle_window=total // share)))
    windows += [("sample, window 2^18 (the default before)", Shuffle(shuffle_window=1 << 18)),
                ("dataflow block (64, 8)", Shuffle("block"))]
    rows = [[f"{_label(total)} / {shards:,}", "full shuffle (torch.randperm)",
             f"{ref_classes:.1f} (100%)", f"{100 * ref_kept:.4f} (1.00x)",
             f"{distinct_classes(full[0], shard_of):.0f}", "-", "-"]]
    for name, how in windows:
        epochs = []
        seconds = 0.0
        for epoch in range(2):
            t0 = time.perf_counter()
            plan = rank_batches(sizes, world_size=1, rank=0, epoch=epoch, seed=0,
                                batch_size=BATCH, drop_last=True, shuffle=how)
            seconds = time.perf_counter() - t0 if epoch == 0 else seconds
            epochs.append(_ids_of(plan, sizes))
        classes = distinct_classes(epochs[0], labels)
        kept = kept_pairs(epochs[0], epochs[1], total)
        if how.mode == "sample":
            window = min(how.shuffle_window, total)
            span = f"{min(shards, -(-window // per_shard) + 1):,} ({window / total:.0%})"
        else:
            span = f"{how.window} ({how.window / shards:.1%})"
        rows.append([f"{_label(total)} / {shards:,}", name,
                     f"{classes:.1f} ({classes / ref_classes:.0%})",
                     f"{100 * kept:.4f} ({kept / ref_kept:.2f}x)",
                     f"{distinct_classes(epochs[0], shard_of):.0f}", span, f"{seconds:.2f}"])
    return rows


@functools.cache
def _demo(tmp: str, fmt: str, shards: int, per_shard: int) -> DemoResult:
    """A demo dataset of ``shards`` shards of ``per_shard`` samples (3x64x64 images), written
    once per run."""
    return make_demo(os.path.join(tmp, f"{fmt}-{shards}x{per_shard}"),
                     DemoSpec(fmt=fmt, shards=shards, samples_per_shard=per_shard, uneven=False),
                     progress=None)


def _reader_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def loader_rate(endpoint: str, pids: list[int], shuffle: str, epochs: int) -> tuple[float, float]:
    """Samples/s of ``epochs`` epochs through a DataLoader (after one untimed batch), and
    the reader processes' CPU seconds per sample meanwhile."""
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, shuffle=shuffle,
                    timeout=300) as loader:
        batches = iter(loader)
        next(batches)
        samples = 0
        t0, cpu0 = time.perf_counter(), _reader_cpu(pids)
        for epoch in range(epochs):
            for batch in batches:
                samples += len(batch["id"])
            if epoch + 1 < epochs:
                batches = iter(loader)
        return samples / (time.perf_counter() - t0), (_reader_cpu(pids) - cpu0) / samples


def cost_rows(tmp: str, layouts: list[tuple[int, int]], workers: int, epochs: int,
              repeats: int, open_shards: int | None = None) -> list[list[str]]:
    """The ``cost`` table's rows (see the module); ``open_shards``: the server's
    ``--max-open-shards`` (None: its default)."""
    rows = []
    for fmt in ("tar", "arrow"):
        for shards, per_shard in layouts:
            demo = _demo(tmp, fmt, shards, per_shard)
            plan = rank_batches(demo.sizes, world_size=1, rank=0, epoch=0, seed=0,
                                batch_size=BATCH)
            touched = np.mean([len(np.unique(plan.rows(i)[:, 0])) for i in range(len(plan))])
            got: dict[str, list[tuple[float, float]]] = {"none": [], "sample": []}
            extra = [] if open_shards is None else ["--max-open-shards", str(open_shards)]
            with launch([str(p) for p in demo.paths], workers=workers, timeout=300,
                        extra_args=extra) as server:
                pids = list(server.ready["worker_pids"])
                loader_rate(server.endpoint, pids, "sample", 1)  # every reader opens its shards
                for _ in range(repeats):
                    for mode in got:
                        got[mode].append(loader_rate(server.endpoint, pids, mode, epochs))
            rate = {m: statistics.median(r for r, _ in v) for m, v in got.items()}
            cpu = {m: statistics.median(c for _, c in v) for m, v in got.items()}
            ratios = [s / n for (s, _), (n, _) in zip(got["sample"], got["none"], strict=True)]
            rows.append([fmt, f"{shards:,} x {per_shard:,}", f"{touched:.0f}",
                         f"{rate['none']:,.0f}", f"{rate['sample']:,.0f}",
                         f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]",
                         f"{1e6 * cpu['none']:.1f}", f"{1e6 * cpu['sample']:.1f}"])
    return rows


def _per_shard_concat(get_reader: Callable[[int], ShardReader], ranges: np.ndarray) -> Batch:
    """A batch gathered as before :mod:`dataflow.readers.sink`: one ``read_many`` per shard
    into arrays of its own, then ``concat``."""
    cuts = [0, *(np.flatnonzero(np.diff(ranges[:, 0])) + 1).tolist(), len(ranges)]
    return concat([get_reader(int(ranges[lo, 0])).read_many(ranges[lo:hi, 1], ranges[lo:hi, 2])
                   for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)])


def read_rows(tmp: str, layouts: list[tuple[int, int]], batches: int,
              repeats: int) -> list[list[str]]:
    """The ``read`` table's rows (see the module)."""
    rows = []
    for fmt in ("tar", "arrow"):
        for shards, per_shard in layouts:
            demo = _demo(tmp, fmt, shards, per_shard)
            readers = [open_shard(str(p)) for p in demo.paths]
            try:
                for r in readers:
                    r.read(0, len(r))
                plans = {mode: rank_batches(demo.sizes, world_size=1, rank=0, epoch=0, seed=0,
                                            batch_size=BATCH, drop_last=True, shuffle=mode)
                         for mode in ("none", "sample")}
                ways = {"none": (plans["none"], read_ranges),
                        "sample": (plans["sample"], read_ranges),
                        "concat": (plans["sample"], _per_shard_concat)}
                times: dict[str, list[float]] = {way: [] for way in ways}
                for _ in range(repeats):
                    for way, (plan, read) in ways.items():
                        n = min(batches, len(plan))
                        kept: list[list[wire.Buffer]] = []  # as a server's send queue
                        t0 = time.thread_time()
                        for i in range(n):
                            kept.append(wire.encode(wire.batch_to_message(
                                1, read(readers.__getitem__, plan.rows(i)), 0)))
                            del kept[:-8]
                        times[way].append((time.thread_time() - t0) / n)
                ms = {m: 1e3 * statistics.median(v) for m, v in times.items()}
                plan = plans["sample"]
                touched = np.mean([len(np.unique(plan.rows(i)[:, 0]))
                                   for i in range(min(batches, len(plan)))])
            finally:
                for r in readers:
                    r.close()
            rows.append([fmt, f"{shards:,} x {per_shard:,}", f"{touched:.0f}",
                         f"{ms['none']:.2f}", f"{ms['sample']:.2f}", f"{ms['concat']:.2f}",
                         f"{ms['sample'] / ms['none']:.1f}x",
                         f"{1e3 * (ms['sample'] - ms['none']) / touched:.0f}"])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def _layout(text: str) -> tuple[int, int]:
    shards, _, per_shard = text.partition("x")
    return int(shards), int(per_shard)


def mix_rows(tmp: str, args: argparse.Namespace) -> list[list[str]]:
    """The ``mix`` table's rows (see the module)."""
    epochs = {"torch RandomSampler (full shuffle)": torch_epochs(2),
              "webdataset shardshuffle + shuffle(1000)": webdataset_epochs(2, tmp)}
    epochs.update({name: plan_epochs(mode, 2) for name, mode in MODES.items()})
    rows = []
    for name, (first, second) in epochs.items():
        row = [name, f"{distinct_classes(first, LABELS):.1f}",
               f"{100 * kept_pairs(first, second, TOTAL):.2f}",
               f"{ks_to_uniform(first, LABELS):.3f}"]
        if name in MODES:
            mode = MODES[name]
            row += [f"{plan_seconds(mode, args.plan_samples, w, args.repeats):.2f}"
                    for w in (1, 8)]
            rates = read_rates(mode, tmp, args.read_shards, args.read_samples_per_shard,
                               args.repeats)
            row += [f"{rate:,.0f}" for rate in rates]
        else:
            row += ["-"] * 4
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.shuffle",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="mix,scale,read,cost",
                        help="comma-separated, from mix, scale, read, cost (default: "
                        "%(default)s)")
    parser.add_argument("--plan-samples", type=int, default=10_000_000)
    parser.add_argument("--read-shards", type=int, default=8)
    parser.add_argument("--read-samples-per-shard", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-layouts", default="8x1000,64x200",
                        help="comma-separated SHARDSxSAMPLES (default: %(default)s)")
    parser.add_argument("--cost-epochs", type=int, default=4)
    parser.add_argument("--max-open-shards", type=int, default=None, metavar="N",
                        help="cost part: the server's --max-open-shards (default: the "
                             "server's default)")
    parser.add_argument("--read-layouts", default="8x1000,64x200,1024x50",
                        help="comma-separated SHARDSxSAMPLES (default: %(default)s)")
    parser.add_argument("--read-batches", type=int, default=30,
                        help="batches timed per run of the read part")
    parser.add_argument("--workers", type=int, default=2, help="the server's reader processes")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - {"mix", "scale", "read", "cost"})
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}")
    for option in ("--read-layouts", "--cost-layouts"):
        for shards, per_shard in (_layout(t) for t in getattr(
                args, option[2:].replace("-", "_")).split(",") if t):
            if shards * per_shard < BATCH:
                parser.error(f"{option}: {shards}x{per_shard} holds fewer samples than a "
                             f"batch ({BATCH})")
    command = " ".join(["python -m dataflow.bench.experiments.shuffle",
                        *(sys.argv[1:] if argv is None else argv)])
    print(f"`{command}` ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the "
          "start)")
    print()
    with tempfile.TemporaryDirectory() as tmp:
        if "mix" in parts:
            millions = f"{args.plan_samples / 1e6:g}M"
            read = f"{args.read_shards}x{args.read_samples_per_shard}"
            _table(["method", "distinct classes / batch", "co-batched pairs kept %",
                    "KS to uniform", f"plan {millions} W=1 s", f"plan {millions} W=8 s",
                    f"tar {read} samples/s, read per range",
                    f"tar {read} samples/s, read_ranges"], mix_rows(tmp, args))
        if "scale" in parts:
            _table(["samples / shards", "method", "distinct classes / batch (of full)",
                    "co-batched pairs kept % (x full)", "shards / batch",
                    "shards a window spans (bytes)", "plan W=1 s"],
                   [row for shards, per in LAYOUTS for row in scale_rows(shards, per)])
        if "read" in parts:
            layouts = [_layout(t) for t in args.read_layouts.split(",") if t]
            _table(["format", "shards x samples", "shards / batch", "none CPU ms / batch",
                    "default CPU ms / batch", "default, per shard + concat",
                    "default / none", "CPU us per shard touched"],
                   read_rows(tmp, layouts, args.read_batches, args.repeats))
        if "cost" in parts:
            layouts = [_layout(t) for t in args.cost_layouts.split(",") if t]
            _table(["format", "shards x samples", "shards / batch", "none samples/s",
                    "default samples/s", "default / none [range]",
                    "reader CPU us / sample, none", "reader CPU us / sample, default"],
                   cost_rows(tmp, layouts, args.workers, args.cost_epochs, args.repeats,
                             args.max_open_shards))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
