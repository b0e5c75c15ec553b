"""Build a :class:`~dataflow.index.DatasetIndex` by opening every shard of a dataset."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, NamedTuple

from dataflow.batch import Schema
from dataflow.errors import ConfigError
from dataflow.index import DatasetIndex, check_schemas
from dataflow.readers import open_shard
from dataflow.readers.base import SkipRecord, check_on_error
from dataflow.readers.cache import identity
from dataflow.sources import resolve

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


def _count(url: str, cache_dir: str | None, on_error: str) -> _Shard:
    """Open one shard; its identity is taken first, so a shard rewritten while it is counted
    shows a stale identity (a fingerprint that later mismatches), never a new one."""
    ident = identity(url)
    with open_shard(url, cache_dir=cache_dir, on_error=on_error) as r:
        return _Shard(len(r), r.schema, r.skipped, tuple(r.skip_log), ident)


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


def scan_shards(
    shards: Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    progress: bool = False,
) -> Scanned:
    """Open every shard of a resolved list (in a bounded thread pool), count and check schemas.

    The pool overlaps the waits of remote shards (stat, first bytes, downloads); local shards
    with cached tar indexes cost ~0.3 ms each and gain little from it. The result is the same
    for any ``max_workers``: shards keep their order.

    Args:
        shards: shard URLs/paths, as :func:`dataflow.sources.resolve` gives them.
        cache_dir, on_error, max_workers: see :func:`build_index`.
        progress: show a tqdm bar on stderr while it takes more than
            :data:`PROGRESS_DELAY_S` seconds.

    Raises:
        ShardReadError, SchemaMismatchError, ConfigError: see :func:`build_index`.
    """
    check_on_error(on_error)
    if max_workers < 1:
        raise ConfigError(f"`max_workers` must be at least 1. Found: {max_workers}")
    if not shards:
        raise ConfigError("`shards` must not be empty")
    bar = _progress(len(shards), progress)
    try:
        with ThreadPoolExecutor(min(max_workers, len(shards))) as pool:
            futures = [pool.submit(_count, u, cache_dir, on_error) for u in shards]
            try:
                if bar is not None:
                    for done in as_completed(futures):
                        done.result()
                        bar.update()
                results = [f.result() for f in futures]
            except BaseException:
                for f in futures:  # the first failure ends the scan: open no further shard
                    f.cancel()
                raise
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
    index = DatasetIndex(tuple(shards), sizes, schema, tuple(r.identity for r in results))
    return Scanned(index, skipped, damaged)


def build_index(
    specs: str | Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    progress: bool = False,
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
        progress: see :func:`scan_shards`.

    Raises:
        SpecError: a spec matches nothing.
        ShardReadError: a shard cannot be read.
        SchemaMismatchError: two shards disagree on a field.
        ConfigError: ``on_error`` or ``max_workers`` is invalid.
    """
    check_on_error(on_error)
    return scan_shards(resolve(specs), cache_dir=cache_dir, on_error=on_error,
                       max_workers=max_workers, progress=progress).index
