"""The remote block cache beside fsspec's caches: requests, bytes fetched, time and disk held
for shuffled epochs over tars on S3; and a gzipped tar decompressed into the cache.

A moto S3 server on loopback holds ``--shards`` WebDataset tars; a counting proxy in front of
it measures what each reader fetches. Each sample is read as the tar reader reads it: one byte
span (its first header to its last member's end), a batch of ``--batch`` samples at a time in
a shuffled order, two epochs (two orders), every span checked against the local file. Readers:

* dataflow's :class:`~dataflow.storage.remotefile.RemoteBlob` (1 MiB blocks in the disk cache
  bounded by ``cache_bytes``, a batch's missing blocks fetched in parallel), with a cache that
  holds the dataset and with one of ``--small-cache`` of it;
* fsspec ``blockcache::`` (sparse local files of 1 MiB blocks, no size bound);
* s3fs files with ``cache_type="blockcache"`` (an in-memory LRU of 1 MiB blocks per open
  file, as many blocks as the small cache holds, split over the files);
* fsspec ``simplecache::`` (each file downloaded whole on first open).

Then one gzipped tar, whole and with its last 30 bytes cut: decompressed into the cache by
:func:`~dataflow.storage.cache.local_copy` and by ``simplecache::`` with
``compression="gzip"``.

    python -m dataflow.bench.experiments.s3cache --shards 8 --samples 256
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence

import fsspec
import numpy as np

from dataflow.bench.experiments.s3local import CREDENTIALS, S3Proxy, moto_s3, s3_client
from dataflow.demo import DemoSpec, make_demo, parse_shape
from dataflow.errors import DataflowError
from dataflow.storage.cache import local_copy
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import BLOCK_BYTES, RemoteBlob, open_blob

BUCKET = "cache"
Span = tuple[int, int, int]
"""(shard, start, stop): one sample's bytes in its tar."""
ReadBatch = Callable[[list[Span]], list[bytes]]


def sample_spans(paths: Sequence[str]) -> list[Span]:
    """Each sample's byte span in its tar: from its first member's header to its last member's
    data end (members of a sample are consecutive, as WebDataset writes them)."""
    out: list[Span] = []
    for k, path in enumerate(paths):
        with tarfile.open(path) as tar:
            key, lo, hi = None, 0, 0
            for m in tar.getmembers():
                name = m.name.split(".", 1)[0]
                if name != key:
                    if key is not None:
                        out.append((k, lo, hi))
                    key, lo = name, m.offset
                hi = m.offset_data + m.size
            if key is not None:
                out.append((k, lo, hi))
    return out


def _whole(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _disk(path: str) -> int:
    """Bytes allocated under ``path`` (sparse files count only what they hold)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(d, f)).st_blocks * 512
    return total


def _blob_reader(blobs: list[RemoteBlob]) -> ReadBatch:
    def read(batch: list[Span]) -> list[bytes]:
        out: dict[int, bytes] = {}
        for k, blob in enumerate(blobs):
            mine = [i for i, s in enumerate(batch) if s[0] == k]
            if not mine:
                continue
            starts = np.array([batch[i][1] for i in mine], dtype=np.int64)
            stops = np.array([batch[i][2] for i in mine], dtype=np.int64)
            buf, where = blob.spans(starts, stops)
            for i, w, a, b in zip(mine, where.tolist(), starts.tolist(), stops.tolist(),
                                  strict=True):
                out[i] = buf[w : w + b - a].tobytes()
        return [out[i] for i in range(len(batch))]

    return read


def _file_reader(files: list) -> ReadBatch:  # noqa: ANN001 - fsspec file objects
    def read(batch: list[Span]) -> list[bytes]:
        out = []
        for k, a, b in batch:
            files[k].seek(a)
            out.append(files[k].read(b - a))
        return out

    return read


def _epochs(label: str, read: ReadBatch, spans: list[Span], local: list[bytes], batch: int,
            proxy: S3Proxy, cache: str | None, opened: tuple[int, int]) -> list[str]:
    """Two shuffled epochs through ``read``; one result line each."""
    rows = []
    for epoch in range(2):
        order = np.random.default_rng(epoch).permutation(len(spans))
        asked, got = opened if epoch == 0 else (proxy.forwarded, proxy.bytes_out)
        t0 = time.perf_counter()
        for first in range(0, len(order), batch):
            chunk = [spans[i] for i in order[first : first + batch]]
            for (k, a, b), data in zip(chunk, read(chunk), strict=True):
                if data != local[k][a:b]:
                    raise DataflowError(f"{label}: shard {k} bytes {a}..{b} differ")
        seconds = time.perf_counter() - t0
        held = "-" if cache is None else f"{_disk(cache) / 2**20:.1f}"
        rows.append(f"| {label} | {epoch + 1} | {seconds:.2f} | {proxy.forwarded - asked} | "
                    f"{(proxy.bytes_out - got) / 2**20:.1f} | {held} |")
    return rows


def epochs_table(proxy: S3Proxy, paths: list[str], batch: int, small: float,
                 work: str) -> list[str]:
    """Two shuffled epochs per reader (see the module docstring); a result line each."""
    spans = sample_spans(paths)
    local = [_whole(p) for p in paths]
    urls = [f"s3://{BUCKET}/{os.path.basename(p)}" for p in paths]
    size = sum(len(x) for x in local)
    small_bytes = max(BLOCK_BYTES * 2, int(size * small))
    options = {"endpoint_url": proxy.endpoint}
    rows = []
    for label, limit in (("dataflow RemoteBlob, cache >= data", 2 * size),
                         (f"dataflow RemoteBlob, cache {small:g} of data", small_bytes)):
        cache = os.path.join(work, f"blob-{limit}")
        opened = (proxy.forwarded, proxy.bytes_out)
        config = RemoteConfig.of(options, cache_bytes=limit)
        blobs = [open_blob(u, config, cache) for u in urls]
        rows += _epochs(label, _blob_reader(blobs), spans, local, batch, proxy, cache, opened)
    target = {"target_protocol": "s3", "target_options": {"client_kwargs": options}}
    cache = os.path.join(work, "blockcache")
    opened = (proxy.forwarded, proxy.bytes_out)
    fs = fsspec.filesystem("blockcache", cache_storage=cache, **target)
    files = [fs.open(u, "rb", block_size=BLOCK_BYTES) for u in urls]
    rows += _epochs("fsspec blockcache::, 1 MiB blocks", _file_reader(files), spans, local,
                    batch, proxy, cache, opened)
    per_file = max(1, small_bytes // BLOCK_BYTES // len(urls))
    opened = (proxy.forwarded, proxy.bytes_out)
    s3 = fsspec.filesystem("s3", client_kwargs=options)
    files = [s3.open(u, "rb", block_size=BLOCK_BYTES, cache_type="blockcache",
                     cache_options={"maxblocks": per_file}) for u in urls]
    rows += _epochs(f"s3fs cache_type=blockcache, {per_file} x 1 MiB per file in memory",
                    _file_reader(files), spans, local, batch, proxy, None, opened)
    cache = os.path.join(work, "simplecache")
    opened = (proxy.forwarded, proxy.bytes_out)
    fs = fsspec.filesystem("simplecache", cache_storage=cache, **target)
    files = [fs.open(u, "rb") for u in urls]
    rows += _epochs("fsspec simplecache::", _file_reader(files), spans, local, batch, proxy,
                    cache, opened)
    return rows


def gzip_table(endpoint: str, proxy: S3Proxy, path: str, work: str) -> list[str]:
    """A gzipped tar into the cache, whole and cut short, by ``local_copy`` and by
    ``simplecache::`` with ``compression="gzip"``."""
    raw = _whole(path)
    whole = gzip.compress(raw, compresslevel=6)
    client = s3_client(endpoint)
    rows = []
    for name, body in (("whole", whole), ("cut", whole[:-30])):
        key = f"{name}.tar.gz"
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        url = f"s3://{BUCKET}/{key}"
        options = {"endpoint_url": proxy.endpoint}
        got = proxy.bytes_out
        t0 = time.perf_counter()
        copy = local_copy(url, os.path.join(work, f"gz-df-{name}"), gunzip=True,
                          remote=RemoteConfig.of(options))
        kept = os.path.getsize(copy.path)
        note = copy.damage or ("complete" if kept == len(raw) else "up to the cut; the tar "
                               "reader reports the truncation there")
        rows.append(f"| dataflow local_copy | {name} | {time.perf_counter() - t0:.2f} | "
                    f"{(proxy.bytes_out - got) / 2**10:.0f} | {kept / 2**20:.2f} of "
                    f"{len(raw) / 2**20:.2f} ({note}) |")
        got = proxy.bytes_out
        t0 = time.perf_counter()
        fs = fsspec.filesystem("simplecache", cache_storage=os.path.join(work, f"gz-sc-{name}"),
                               compression="gzip", target_protocol="s3",
                               target_options={"client_kwargs": options})
        try:
            with fs.open(url, "rb") as f:
                result = f"{len(f.read()) / 2**20:.2f} of {len(raw) / 2**20:.2f}"
        except Exception as e:  # noqa: BLE001 - what the library raises is the finding
            result = f"0 ({type(e).__name__}: {str(e)[:60]})"
        rows.append(f"| fsspec simplecache::, compression=gzip | {name} | "
                    f"{time.perf_counter() - t0:.2f} | {(proxy.bytes_out - got) / 2**10:.0f} | "
                    f"{result} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.s3cache",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=8, help="tar shards (default: %(default)s)")
    p.add_argument("--samples", type=int, default=256,
                   help="samples per shard (default: %(default)s)")
    p.add_argument("--image", default="3,64,64", help="image shape (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="samples per read (default: %(default)s)")
    p.add_argument("--small-cache", type=float, default=0.25,
                   help="the small cache, as a fraction of the data (default: %(default)s)")
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(CREDENTIALS)
    work = tempfile.mkdtemp(prefix="s3cache-")
    try:
        demo = make_demo(os.path.join(work, "src"),
                         DemoSpec(fmt="tar", shards=args.shards, samples_per_shard=args.samples,
                                  uneven=False, image_shape=parse_shape(args.image)),
                         progress=None)
        paths = [str(x) for x in demo.paths]
        size = sum(os.path.getsize(x) for x in paths)
        print(f"{args.shards} tar shards, {demo.total} samples, {size / 2**20:.1f} MiB on S3 "
              f"(moto on loopback); batches of {args.batch} spans, shuffled\n")
        with moto_s3() as endpoint, S3Proxy(endpoint) as proxy:
            client = s3_client(endpoint)
            client.create_bucket(Bucket=BUCKET)
            for x in paths:
                client.upload_file(x, BUCKET, os.path.basename(x))
            print("| reader | epoch | seconds | requests | MiB fetched | MiB on disk after |\n"
                  "| --- | --- | --- | --- | --- | --- |")
            for row in epochs_table(proxy, paths, args.batch, args.small_cache, work):
                print(row, flush=True)
            print("\n| gzipped tar into the cache | stream | seconds | KiB fetched | "
                  "MiB of tar kept |\n| --- | --- | --- | --- | --- |")
            for row in gzip_table(endpoint, proxy, paths[0], work):
                print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
