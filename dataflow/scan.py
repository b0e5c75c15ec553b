"""Build a :class:`~dataflow.index.DatasetIndex` by opening every shard of a dataset."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple

from dataflow.batch import Schema
from dataflow.columns import ReadOptions, serving_options, with_extras, with_hive
from dataflow.errors import ConfigError
from dataflow.index import DatasetIndex, check_schemas
from dataflow.readers import open_shard
from dataflow.readers.base import SkipRecord, check_on_error
from dataflow.readers.cache import identity
from dataflow.readers.tar import DEFAULT_OPTIONS, TarOptions
from dataflow.remote import RemoteConfig
from dataflow.splits import dataset_shards

log = logging.getLogger(__name__)

MAX_OPEN_WORKERS = 8


class _Shard(NamedTuple):
    samples: int
    schema: Schema
    skipped: int
    skips: tuple[SkipRecord, ...]
    identity: str
    nulls: tuple[tuple[str, int], ...]
    categories: dict[str, set]


def _count(url: str, cache_dir: str | None, on_error: str, options: ReadOptions,
           tar: TarOptions, remote: RemoteConfig | None) -> _Shard:
    """Open one shard; its identity is taken first, so a shard rewritten while it is counted
    shows a stale identity (a fingerprint that later mismatches), never a new one."""
    ident = identity(url, remote)
    with open_shard(url, cache_dir=cache_dir, on_error=on_error, options=options,
                    tar=tar, remote=remote) as r:
        found = r.census()
        return _Shard(len(r), r.schema, r.skipped, tuple(r.skip_log), ident,
                      tuple(sorted(found.nulls.items())), found.categories)


def build_index(
    specs: str | Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    options: ReadOptions | None = None,
    split: str | None = None,
    tar: TarOptions = DEFAULT_OPTIONS,
    remote: RemoteConfig | None = None,
) -> DatasetIndex:
    """Resolve specs, open every shard (in a bounded thread pool), count and check schemas.

    Empty shards of every format count as zero samples: Arrow and Parquet files with no rows,
    tars with no member and zero-byte ``.tar`` files (see
    :func:`dataflow.readers.detect_format`).

    Args:
        specs: dataset spec(s), see :func:`dataflow.sources.resolve`.
        cache_dir: passed to :func:`dataflow.readers.open_shard`.
        on_error: passed to :func:`dataflow.readers.open_shard`. Under ``"skip"``, every shard
            that dropped samples or met damage while opening is logged (its count and first
            record), then the total. The sizes are the samples each reader serves: a tar's
            damaged samples are already left out of them; damage inside Parquet row groups
            and Arrow record batches is found only when they are decoded, so reads of those
            serve fewer rows and count the rest (see
            :class:`~dataflow.readers.ShardReader`).
        max_workers: most shards opened at once.
        options: which columns to serve and how (default: all, nulls masked); completed
            with the hive levels of the shard paths (under the directory a single directory
            spec names, else the shards' common directory), the fields holding nulls and the
            categories of dictionary fields into the index's ``read``.
        split: the split of a Hugging Face ``DatasetDict`` root (see :mod:`dataflow.splits`).
        tar: passed to :func:`dataflow.readers.open_shard`.
        remote: storage options and cache size for remote shards.

    Raises:
        SpecError: a spec matches nothing.
        ShardReadError: a shard cannot be read.
        SchemaMismatchError: two shards disagree on a field.
        ConfigError: ``on_error`` or ``max_workers`` is invalid.
    """
    check_on_error(on_error)
    if max_workers < 1:
        raise ConfigError(f"`max_workers` must be at least 1. Found: {max_workers}")
    shards, root = dataset_shards(specs, split, remote)
    common = os.path.commonprefix(shards)
    options = with_hive(options if options is not None else ReadOptions(), shards,
                        root or common[: common.rfind("/") + 1])
    with ThreadPoolExecutor(min(max_workers, len(shards))) as pool:
        results = list(pool.map(lambda u: _count(u, cache_dir, on_error, options, tar, remote),
                                     shards))
    for url, r in zip(shards, results, strict=True):
        if r.skips:
            log.warning("%s: %d sample(s) skipped, %d damage record(s), first: %s", url,
                        r.skipped, len(r.skips), r.skips[0].message)
    damaged = sum(1 for r in results if r.skips)
    if damaged:
        log.warning("%d sample(s) skipped in total, in %d of %d shard(s)",
                    sum(r.skipped for r in results), damaged, len(shards))
    sizes = tuple(r.samples for r in results)
    schema = check_schemas(shards, [r.schema for r in results], sizes)
    nulls = tuple(r.nulls for r in results)
    index = DatasetIndex(tuple(shards), sizes, schema, tuple(r.identity for r in results),
                         nulls if any(nulls) else ())
    categories: dict[str, set] = {}
    for r in results:
        for name, values in r.categories.items():
            categories.setdefault(name, set()).update(values)
    read = serving_options(options, index.null_totals(), categories)
    hive = {key for key, _ in read.hive}
    return replace(index, schema=with_extras(tuple(f for f in schema if f.name not in hive), read),
                   read=read)
