"""Build a :class:`~dataflow.index.DatasetIndex` by opening every shard of a dataset."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from dataflow.batch import Schema
from dataflow.checks import check_int
from dataflow.convert.columns import (
    VALID_SUFFIX,
    ReadOptions,
    serving_options,
    with_extras,
    with_hive,
)
from dataflow.errors import ConfigError
from dataflow.index.dataset import DatasetIndex, check_schemas
from dataflow.index.splits import dataset_shards
from dataflow.readers import open_shard
from dataflow.readers.damage import SkipRecord, check_on_error
from dataflow.readers.tar.options import DEFAULT_OPTIONS, TarOptions
from dataflow.storage.cache import identity
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.sources import is_local

log = logging.getLogger(__name__)

MAX_OPEN_WORKERS = 8
PROGRESS_DELAY_S = 1.0
"""Seconds a scan runs before its progress bar appears."""


class _Shard(NamedTuple):
    samples: int
    schema: Schema
    skipped: int
    skips: tuple[SkipRecord, ...]
    identity: str
    nulls: tuple[tuple[str, int], ...]
    categories: dict[str, set]


@dataclass(frozen=True)
class ScanOptions:
    """How shards are opened and read while indexing (and later served).

    Attributes:
        read: which columns to serve and how, with the hive levels of the shard paths
            (:func:`resolve_dataset`).
        tar: WebDataset conventions of tar shards.
        remote: storage options and cache size for remote shards.
    """

    read: ReadOptions = ReadOptions()
    tar: TarOptions = DEFAULT_OPTIONS
    remote: RemoteConfig | None = None


DEFAULT_SCAN = ScanOptions()


def _count(url: str, cache_dir: str | None, on_error: str, how: ScanOptions) -> _Shard:
    """Open one shard; its identity is taken first, so a shard rewritten while it is counted
    shows a stale identity (a fingerprint that later mismatches), never a new one."""
    ident = identity(url, how.remote)
    with open_shard(url, cache_dir=cache_dir, on_error=on_error, options=how.read,
                    tar=how.tar, remote=how.remote) as r:
        found = r.census()
        return _Shard(len(r), r.schema, r.skipped, tuple(r.skip_log), ident,
                      tuple(sorted(found.nulls.items())), found.categories)


@dataclass(frozen=True)
class Scanned:
    """A freshly built index, and what damage it left out.

    Attributes:
        index: the dataset index.
        skipped: samples left out as damaged, over all shards (``on_error="skip"``).
        damaged: shards that left samples out or met damage while opening.
    """

    index: DatasetIndex
    skipped: int
    damaged: int


def log_skips(skipped: int, damaged: int, shards: int) -> None:
    """The one warning that sums up the damage an index left out (nothing when none)."""
    if damaged:
        log.warning("%d sample(s) skipped in total, in %d of %d shard(s)", skipped, damaged,
                    shards)


def _progress(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr, drawn only after :data:`PROGRESS_DELAY_S` (a fast scan shows
    none), or ``None`` when progress is off (tqdm not even imported)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="indexing shards", unit="shard", file=sys.stderr,
                delay=PROGRESS_DELAY_S, mininterval=0.5, leave=False)


def resolve_dataset(specs: str | Sequence[str], *, split: str | None = None,
                    read: ReadOptions | None = None,
                    remote: RemoteConfig | None = None) -> tuple[list[str], ReadOptions]:
    """The shards of ``specs`` (honouring Hugging Face layouts and ``split``) and ``read``
    completed with their hive levels (under the directory a single directory spec names,
    else the shards' common directory).

    Raises:
        SpecError: a spec matches nothing, or a DatasetDict root without a valid split.
    """
    shards, root = dataset_shards(specs, split, remote)
    common = os.path.commonprefix(shards)
    return shards, with_hive(read if read is not None else ReadOptions(), shards,
                             root or common[: common.rfind("/") + 1])


def scan_shards(
    shards: Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    progress: bool = False,
    how: ScanOptions = DEFAULT_SCAN,
) -> Scanned:
    """Open every shard of a resolved list (in a bounded thread pool), count and check schemas.

    The pool overlaps the waits of remote shards (stat, first bytes, downloads); a list of
    local shards only is opened in one thread (their opens hold the GIL). The result is the same
    for any ``max_workers``: shards keep their order.

    Args:
        shards: shard URLs/paths, as :func:`resolve_dataset` gives them.
        cache_dir, on_error, max_workers: see :func:`build_index`.
        progress: show a tqdm bar on stderr while it takes more than
            :data:`PROGRESS_DELAY_S` seconds.
        how: how shards are opened; ``how.read`` completed into the index's ``read`` with
            the fields holding nulls and the categories of dictionary fields.

    Raises:
        ShardReadError, SchemaMismatchError, ConfigError: see :func:`build_index`.
    """
    check_on_error(on_error)
    max_workers = check_int("max_workers", max_workers, 1)
    if not shards:
        raise ConfigError("`shards` must not be empty")
    bar = _progress(len(shards), progress)
    # Local shards are opened in one thread: their opens hold the GIL, so more threads only
    # add hand-overs (1,000 cached tar indexes: 0.44 s in one thread, 0.70 s in eight).
    threads = 1 if all(is_local(u) for u in shards) else min(max_workers, len(shards))
    failures: list[BaseException] = []

    def count(url: str) -> _Shard | None:
        # The first failure ends the scan: no thread opens a further shard.
        if failures:
            return None
        try:
            return _count(url, cache_dir, on_error, how)
        except BaseException as e:
            failures.append(e)
            raise

    try:
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(count, u) for u in shards]
            if bar is not None:
                for done in as_completed(futures):
                    done.result()
                    bar.update()
            # A shard not opened (None) follows a failure, which result() raises first.
            results = [r for r in (f.result() for f in futures) if r is not None]
    finally:
        if bar is not None:
            bar.close()
    for url, r in zip(shards, results, strict=True):
        if r.skips:
            log.warning("%s: %d sample(s) skipped, %d damage record(s), first: %s", url,
                        r.skipped, len(r.skips), r.skips[0].message)
    damaged = sum(1 for r in results if r.skips)
    skipped = sum(r.skipped for r in results)
    log_skips(skipped, damaged, len(shards))
    sizes = tuple(r.samples for r in results)
    schema = check_schemas(shards, [r.schema for r in results], sizes)
    nulls = tuple(r.nulls for r in results)
    lost = tuple(r.skipped for r in results)
    index = DatasetIndex(tuple(shards), sizes, schema, tuple(r.identity for r in results),
                         nulls if any(nulls) else (), skipped=lost if any(lost) else ())
    categories: dict[str, set] = {}
    for r in results:
        for name, values in r.categories.items():
            categories.setdefault(name, set()).update(values)
    read = serving_options(how.read, index.null_totals(), categories)
    hive = {key for key, _ in read.hive}
    hive |= {key + VALID_SUFFIX for key in hive}
    index = replace(index, schema=with_extras(tuple(f for f in schema if f.name not in hive),
                                              read), read=read)
    return Scanned(index, skipped, damaged)


def build_index(
    specs: str | Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    progress: bool = False,
    options: ReadOptions | None = None,
    split: str | None = None,
    tar: TarOptions = DEFAULT_OPTIONS,
    remote: RemoteConfig | None = None,
) -> DatasetIndex:
    """Resolve specs, open every shard (in a bounded thread pool), count and check schemas.

    Empty shards of every format count as zero samples: Arrow and Parquet files with no rows,
    tars with no member. A zero-byte file is damaged (see
    :func:`dataflow.readers.detect_format`): refused, or under ``on_error="skip"`` a shard of
    zero samples with its damage logged.

    Args:
        specs: dataset spec(s), see :func:`dataflow.storage.sources.resolve`.
        cache_dir: passed to :func:`dataflow.readers.open_shard`.
        on_error: passed to :func:`dataflow.readers.open_shard`. Under ``"skip"``, every shard
            that dropped samples or met damage while opening is logged (its count and first
            record), then the total. The sizes are the samples each reader serves: samples
            dropped while opening (a tar's damaged samples, the Arrow stream record batch
            where a damaged stream ends) are left out of them and counted in the index's
            ``skipped``; damage inside Parquet row groups and Arrow record batches is found
            only when they are decoded, so reads of those serve fewer rows and count the rest
            (see :class:`~dataflow.readers.ShardReader`).
        max_workers: most shards opened at once.
        progress: see :func:`scan_shards`.
        options: which columns to serve and how (default: all, nulls masked); completed
            with the hive levels (:func:`resolve_dataset`), the fields holding nulls and the
            categories of dictionary fields into the index's ``read``.
        split: the split of a Hugging Face ``DatasetDict`` root (see :mod:`dataflow.index.splits`).
        tar: passed to :func:`dataflow.readers.open_shard`.
        remote: storage options and cache size for remote shards.

    Raises:
        SpecError: a spec matches nothing.
        ShardReadError: a shard cannot be read.
        SchemaMismatchError: two shards disagree on a field.
        ConfigError: ``on_error`` or ``max_workers`` is invalid.
    """
    check_on_error(on_error)
    shards, read = resolve_dataset(specs, split=split, read=options, remote=remote)
    return scan_shards(shards, cache_dir=cache_dir, on_error=on_error, max_workers=max_workers,
                       progress=progress, how=ScanOptions(read, tar, remote)).index
