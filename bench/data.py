"""The dataset every loader of a bench run reads: shards, sizes, format, page-cache warming."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dataflow.batch import Schema
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import DatasetMismatchError, SpecError
from dataflow.index import DatasetIndex
from dataflow.index.scan import build_index
from dataflow.readers import detect_format
from dataflow.storage.sources import is_local, local_path, open_file

_READ_CHUNK = 8 << 20
_MAGIC_BYTES = 512
_DEMO_MARKER = "bench-demo.json"


@dataclass(frozen=True)
class BenchData:
    """A resolved dataset.

    Attributes:
        shards: shard paths/URLs in dataset order.
        sizes: samples per shard.
        fmt: ``arrow-file``, ``arrow-stream``, ``parquet``, ``tar`` or ``tar.gz`` (every
            shard must have the same format).
        fingerprint: stable hash of shards, sizes and schema (keys cached conversions).
        schema: the fields every shard has.
        nbytes: total size of the shard files, bytes (0 for remote shards).
        index_s: seconds dataflow took to index the dataset (tar member indexes cached).
    """

    shards: tuple[str, ...]
    sizes: tuple[int, ...]
    fmt: str
    fingerprint: str
    schema: Schema
    nbytes: int
    index_s: float

    @property
    def total(self) -> int:
        """Samples in the dataset."""
        return sum(self.sizes)


def load(specs: Sequence[str]) -> BenchData:
    """Index the dataset named by ``specs`` and check every shard has one format.

    Raises:
        SpecError: specs match nothing, or the shards mix formats.
        ShardReadError: a shard is unreadable.
    """
    t0 = time.perf_counter()
    index = build_index(list(specs))
    index_s = time.perf_counter() - t0
    formats = set()
    for url in index.shards:
        with open_file(url) as f:
            head = f.read(_MAGIC_BYTES)
            formats.add(detect_format(url, head, f.seek(0, os.SEEK_END)))
    if len(formats) != 1:
        raise SpecError(f"shards of {list(specs)} mix formats {sorted(formats)}; "
                        "the bench compares loaders on one format at a time")
    nbytes = sum(os.path.getsize(local_path(u)) for u in index.shards if is_local(u))
    return BenchData(
        shards=index.shards, sizes=index.sizes, fmt=formats.pop(),
        fingerprint=index.fingerprint, schema=index.schema,
        nbytes=nbytes, index_s=index_s,
    )


def check_same_dataset(data: BenchData, specs: Sequence[str], served: DatasetIndex,
                       endpoints: Sequence[str]) -> None:
    """Refuse a comparison in which the given servers serve another dataset than the local
    loaders read.

    Both are compared by their dataset fingerprint (:attr:`DatasetIndex.fingerprint`: each
    shard's name under the dataset root, its sample count and its size and mtime or ETag, and
    the schema), so a copy made with its mtimes (``cp -p``, ``rsync -t``) matches.

    Args:
        data: the dataset of ``specs``, as the local loaders read it.
        specs: the bench's DATA specs (the demo dataset when none were given).
        served: the dataset index the servers sent.
        endpoints: the servers' endpoints.

    Raises:
        DatasetMismatchError: the fingerprints differ, naming both datasets' fingerprints,
            shard and sample counts.
    """
    if served.fingerprint == data.fingerprint:
        return
    raise DatasetMismatchError(
        f"the servers at {', '.join(endpoints)} serve dataset {served.fingerprint} "
        f"({len(served.shards):,} shards, {served.total:,} samples), but DATA "
        f"{', '.join(specs)} is dataset {data.fingerprint} ({len(data.shards):,} shards, "
        f"{data.total:,} samples): the "
        "loaders would read different samples and the comparison would measure different "
        "work. Give as DATA the shards the servers read (a copy must keep its files' names, "
        "sizes and mtimes: cp -p, rsync -t)")


def warm_page_cache(data: BenchData) -> str:
    """Read every local shard file once so all loaders start from a warm page cache.

    Returns:
        A sentence stating the page-cache state, for the report.
    """
    local = [local_path(u) for u in data.shards if is_local(u)]
    t0 = time.perf_counter()
    for path in local:
        with open(path, "rb", buffering=0) as f:
            while f.read(_READ_CHUNK):
                pass
    took = time.perf_counter() - t0
    state = (f"warm: all {len(local)} local shard files ({data.nbytes / 2**20:.1f} MiB) read "
             f"once before the runs ({took:.2f} s)")
    if len(local) != len(data.shards):
        state += f"; {len(data.shards) - len(local)} remote shards not pre-read"
    return state


def ensure_demo(out: str, *, fmt: str, shards: int, samples_per_shard: int,
                image_shape: tuple[int, ...] = DemoSpec.image_shape) -> str:
    """Write the demo dataset into ``out`` unless the same one is already there.

    Args:
        out: directory (created if missing).
        fmt: ``arrow``, ``tar`` or ``parquet``.
        shards: shard count.
        samples_per_shard: mean samples per shard (sizes are uneven, as in real datasets).
        image_shape: each sample's uint8 image shape.

    Returns:
        The directory, usable as a dataset spec.
    """
    spec = DemoSpec(fmt=fmt, shards=shards, samples_per_shard=samples_per_shard, uneven=True,
                    image_shape=tuple(image_shape))
    wanted = {"format": fmt, "shards": shards, "samples_per_shard": samples_per_shard,
              "uneven": spec.uneven, "image_shape": list(spec.image_shape)}
    marker = os.path.join(out, _DEMO_MARKER)
    try:
        with open(marker) as f:
            if json.load(f) == wanted:
                return out
    except (OSError, ValueError):
        pass
    if os.path.isdir(out):
        for name in os.listdir(out):
            if name.startswith("train-"):
                os.unlink(os.path.join(out, name))
    make_demo(out, spec, progress=None)
    with open(marker, "w") as f:
        json.dump(wanted, f)
    return out
