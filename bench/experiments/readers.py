"""Reader throughput: the data plane's shard readers beside each format's own reader.

Run: ``python -m dataflow.bench.experiments.readers [--samples N] [--batch-size 256]
[--repeats 3]``.

Writes demo data (id, label, 3x64x64 uint8 image, text) in every format into a temporary
directory, warms the page cache, then times, in one run:

* Arrow IPC file and stream: ``open_shard`` + ``read`` in batches, against pyarrow's
  ``read_all`` on a memory map of the same files. Both sides touch every byte they return
  (a uint64 sum over each buffer), so neither gets credit for lazily mapped pages.
  ``read_all`` leaves the table in 128-row chunks (zero-copy), while a 256-sample batch
  spanning two record batches must be copied into one array; so pyarrow is also shown with
  ``combine_chunks()`` (every column contiguous, as a batch is), and dataflow with reads
  aligned to the record batches (zero-copy).
* Parquet: ``open_shard`` + ``read`` against ``pyarrow.parquet.read_table``, both touched.
* WebDataset tar (written by ``TarWriter``, PAX headers): ``open_shard`` + ``read`` through
  the member index (decoding ``.npy`` into arrays and ints from the index) against
  ``webdataset.WebDataset(urls)`` iterating raw member bytes without decoding. The index
  build is timed separately (cold open).

Each case runs ``--repeats`` times; the best is reported. Ratios compare samples/s within
this run only.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataflow.batch import Batch, Ragged, batch_len
from dataflow.demo import ROWS_PER_CHUNK, DemoSpec, make_demo
from dataflow.readers import open_shard

SHARDS = 8


def touch(arr: np.ndarray) -> int:
    """Read every byte of ``arr`` (a uint64 sum over its bytes); returns bytes touched."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    whole = len(flat) // 8 * 8
    flat[:whole].view(np.uint64).sum()
    flat[whole:].sum()
    return len(flat)


def touch_batch(batch: Batch) -> int:
    total = 0
    for col in batch.values():
        if isinstance(col, Ragged):
            total += touch(col.values) + touch(col.offsets)
        else:
            total += touch(col)
    return total


def touch_arrow(table: pa.Table) -> int:
    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    total += touch(np.frombuffer(buf, dtype=np.uint8))
    return total


@dataclass(frozen=True)
class Result:
    name: str
    samples: int
    nbytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds


def best_of(repeats: int, name: str, run: Callable[[], tuple[int, int]]) -> Result:
    """Run ``run() -> (samples, bytes)`` ``repeats`` times; keep the fastest."""
    best: Result | None = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        samples, nbytes = run()
        r = Result(name, samples, nbytes, time.perf_counter() - t0)
        if best is None or r.seconds < best.seconds:
            best = r
    assert best is not None
    return best


def dataflow_read(paths: Iterable[str], batch_size: int, cache_dir: str) -> tuple[int, int]:
    samples = nbytes = 0
    for path in paths:
        with open_shard(path, cache_dir=cache_dir) as r:
            for start in range(0, len(r), batch_size):
                batch = r.read(start, min(start + batch_size, len(r)))
                samples += batch_len(batch)
                nbytes += touch_batch(batch)
    return samples, nbytes


def pyarrow_ipc(paths: Iterable[str], stream: bool, contiguous: bool) -> tuple[int, int]:
    samples = nbytes = 0
    for path in paths:
        with pa.memory_map(path, "r") as source:
            opener = pa.ipc.open_stream if stream else pa.ipc.open_file
            table = opener(source).read_all()
            if contiguous:
                table = table.combine_chunks()
            samples += table.num_rows
            nbytes += touch_arrow(table)
    return samples, nbytes


def pyarrow_parquet(paths: Iterable[str]) -> tuple[int, int]:
    samples = nbytes = 0
    for path in paths:
        table = pq.read_table(path, memory_map=True)
        samples += table.num_rows
        nbytes += touch_arrow(table)
    return samples, nbytes


def webdataset_raw(paths: list[str]) -> tuple[int, int]:
    import webdataset

    samples = nbytes = 0
    for sample in webdataset.WebDataset(paths, shardshuffle=False, empty_check=False):
        samples += 1
        nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
    return samples, nbytes


def cold_tar_index(paths: list[str], cache_dir: str) -> tuple[int, int]:
    samples = 0
    for path in paths:
        if os.path.exists(path + ".dfidx"):
            os.remove(path + ".dfidx")
        with open_shard(path, cache_dir=cache_dir) as r:
            samples += len(r)
    return samples, 0


def write_data(root: str, samples: int) -> dict[str, list[str]]:
    per_shard = max(samples // SHARDS, 1)
    out = {}
    for name, fmt, kind in [("arrow-file", "arrow", "file"), ("arrow-stream", "arrow", "stream"),
                            ("parquet", "parquet", "file"), ("tar", "tar", "file")]:
        spec = DemoSpec(fmt=fmt, shards=SHARDS, samples_per_shard=per_shard, uneven=False,
                        arrow_kind=kind)
        out[name] = list(make_demo(os.path.join(root, name), spec, progress=None).paths)
    return out


def warm(paths: Iterable[str]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def table(rows: list[tuple[Result, Result | None]]) -> str:
    lines = ["| case | samples | seconds | samples/s | GB/s | vs baseline (samples/s) |",
             "|---|---:|---:|---:|---:|---|"]
    for r, base in rows:
        gbs = f"{r.nbytes / r.seconds / 1e9:.2f}" if r.nbytes else "-"
        ratio = f"{r.rate / base.rate:.2f}x {base.name}" if base is not None else "(baseline)"
        lines.append(f"| {r.name} | {r.samples} | {r.seconds:.3f} | {r.rate:,.0f} | {gbs} "
                     f"| {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.readers",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20_000, help="samples per format (20000)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per read (256)")
    p.add_argument("--repeats", type=int, default=3, help="runs per case; best kept (3)")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="dataflow-bench-readers-")
    try:
        cache = os.path.join(root, "cache")
        data = write_data(root, args.samples)
        warm(glob.glob(os.path.join(root, "*", "*")))
        bs, rep = args.batch_size, args.repeats
        rows: list[tuple[Result, Result | None]] = []
        for name, stream in [("arrow-file", False), ("arrow-stream", True)]:
            paths = data[name]
            base = best_of(rep, f"pyarrow read_all ({name})",
                           partial(pyarrow_ipc, paths, stream, False))
            flat = best_of(rep, f"pyarrow read_all + combine_chunks ({name})",
                           partial(pyarrow_ipc, paths, stream, True))
            ours = best_of(rep, f"dataflow {name}", partial(dataflow_read, paths, bs, cache))
            aligned = best_of(rep, f"dataflow {name}, reads of {ROWS_PER_CHUNK} (zero-copy)",
                              partial(dataflow_read, paths, ROWS_PER_CHUNK, cache))
            rows += [(base, None), (flat, None), (ours, base), (ours, flat), (aligned, base)]
        base = best_of(rep, "pq.read_table (parquet)", lambda: pyarrow_parquet(data["parquet"]))
        ours = best_of(rep, "dataflow parquet", lambda: dataflow_read(data["parquet"], bs, cache))
        rows += [(base, None), (ours, base)]
        base = best_of(rep, "webdataset raw (tar)", lambda: webdataset_raw(data["tar"]))
        cold = best_of(rep, "dataflow tar index build", lambda: cold_tar_index(data["tar"], cache))
        ours = best_of(rep, "dataflow tar (indexed)", lambda: dataflow_read(data["tar"], bs,
                                                                           cache))
        rows += [(base, None), (cold, base), (ours, base)]
        print(f"{args.samples} samples per format, {SHARDS} shards, batch {bs}, "
              f"best of {rep}, page cache warm\n")
        print(table(rows))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
