"""A cache of whole dataset indexes, so a restarted server does not open every shard again.

One JSON file per (shard list, ``on_error``, read and tar options) under
``<cache_dir>/datasets/``, named by a hash of them, holding the
:class:`~dataflow.index.DatasetIndex` (shards, sizes, schema, identities, nulls, read options)
and the damage it left out, behind a SHA-256 digest of that content. It is used only while
every shard's identity (size and mtime, or ETag) is still the one recorded: checking that
costs one ``stat`` per local shard (one metadata request per remote one, in a thread pool),
not an open. A shard changed, added or removed, a file of another version, or a file that
fails its digest or does not parse means a rebuild (the last two with a warning: a cache is
never trusted blindly), and the rebuilt index replaces the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.errors import ConfigError, DataflowError, IndexCacheError, OutdatedIndex
from dataflow.index.dataset import DatasetIndex
from dataflow.index.scan import (
    DEFAULT_SCAN,
    MAX_OPEN_WORKERS,
    Scanned,
    ScanOptions,
    log_skips,
    scan_shards,
)
from dataflow.storage.cache import default_cache_dir, identity, write_atomic
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.sources import is_local

log = logging.getLogger(__name__)

CACHE_VERSION = 2
"""2: the index holds the samples each shard lost to damage (``skipped``)."""
SUBDIR = "datasets"


@dataclass(frozen=True)
class LoadedIndex:
    """A dataset index and how it was obtained.

    Attributes:
        index: the index.
        hit: whether it came from the cache (``False``: every shard was opened).
        seconds: wall time spent loading or building the index.
        path: the cache file (``None`` when it could not be written).
    """

    index: DatasetIndex
    hit: bool
    seconds: float
    path: str | None


def cache_path(cache_dir: str, shards: Sequence[str], on_error: str,
               how: ScanOptions = DEFAULT_SCAN) -> str:
    """The cache file of an index of ``shards`` built under ``on_error`` and ``how``'s read
    and tar options (frozen dataclasses: their repr names every setting)."""
    key = hashlib.sha256(json.dumps([CACHE_VERSION, on_error, list(shards), repr(how.read),
                                     repr(how.tar)]).encode("utf-8"))
    return os.path.join(cache_dir, SUBDIR, f"{key.hexdigest()[:32]}.json")


def _encode(scanned: Scanned, on_error: str) -> bytes:
    body = json.dumps({"version": CACHE_VERSION, "on_error": on_error,
                       "index": scanned.index.to_json(), "skipped": scanned.skipped,
                       "damaged": scanned.damaged})
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{digest}\n{body}".encode()


def read_cache(path: str, shards: Sequence[str], on_error: str) -> Scanned:
    """The index cached at ``path`` for ``shards`` under ``on_error``, as it was stored.

    Raises:
        FileNotFoundError: no cache file.
        IndexCacheError: the file is damaged or of other shards (the message says which;
            :class:`~dataflow.errors.OutdatedIndex`: of another version); its shards'
            identities are not checked here.
    """
    with open(path, "rb") as f:
        raw = f.read()
    digest, _, body = raw.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise IndexCacheError("content does not match its digest (damaged or modified)")
    try:
        obj = json.loads(body)
        version, mode = obj["version"], obj["on_error"]
        scanned = Scanned(DatasetIndex.from_json(obj["index"]), int(obj["skipped"]),
                          int(obj["damaged"]))
    except (ValueError, KeyError, TypeError, ConfigError) as e:
        raise IndexCacheError(f"unreadable: {type(e).__name__}: {e}") from e
    if version != CACHE_VERSION:
        raise OutdatedIndex(f"cache version {version!r}, not {CACHE_VERSION}")
    if mode != on_error or list(scanned.index.shards) != list(shards):
        raise IndexCacheError("it indexes other shards or another --on-error policy")
    return scanned


def changed_shards(index: DatasetIndex, max_workers: int,
                   remote: RemoteConfig | None = None) -> list[str]:
    """Shards of ``index`` whose identity differs now (or that cannot be stat'ed).

    Local shards are checked in this thread (a ``stat`` costs microseconds, less than handing
    it to a pool); remote ones in a pool of ``max_workers`` threads (a request each).
    """

    def changed(url: str, ident: str) -> bool:
        try:
            return identity(url, remote) != ident
        except DataflowError:
            return True

    pairs = list(zip(index.shards, index.identities, strict=True))
    far = [(u, i) for u, i in pairs if not is_local(u)]
    bad = {u for u, i in pairs if is_local(u) and changed(u, i)}
    if far:
        with ThreadPoolExecutor(min(max_workers, len(far))) as pool:
            flags = list(pool.map(changed, *zip(*far, strict=True)))
        bad.update(u for (u, _), flag in zip(far, flags, strict=True) if flag)
    return [u for u in index.shards if u in bad]


def _cached(path: str, shards: Sequence[str], on_error: str, max_workers: int,
            remote: RemoteConfig | None) -> Scanned | None:
    """The cached index if it is intact and current; why not is logged."""
    try:
        scanned = read_cache(path, shards, on_error)
    except FileNotFoundError:
        log.info("index cache miss: no cache file %s", path)
        return None
    except (OSError, IndexCacheError) as e:
        log.warning("index cache %s rejected, rebuilding: %s", path, e)
        return None
    changed = changed_shards(scanned.index, max_workers, remote)
    if changed:
        log.info("index cache miss: %d of %d shard(s) changed since it was written, first %s",
                 len(changed), len(shards), changed[0])
        return None
    return scanned


def load_index(
    shards: Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
    progress: bool = False,
    how: ScanOptions = DEFAULT_SCAN,
) -> LoadedIndex:
    """The dataset index of ``shards``: from the cache when current, else built and cached.

    Args:
        shards: the resolved shard list (:func:`dataflow.storage.sources.resolve`).
        cache_dir, on_error, max_workers, progress: as for
            :func:`dataflow.index.scan.build_index`; ``cache_dir`` also holds the index cache
            (default :func:`~dataflow.storage.cache.default_cache_dir`).
        how: as for :func:`dataflow.index.scan.scan_shards`.

    Raises:
        ShardReadError, SchemaMismatchError, ConfigError: as
            :func:`dataflow.index.scan.build_index` (a cache hit opens no shard, so raises none of
            the shard errors).
    """
    max_workers = check_int("max_workers", max_workers, 1)
    start = time.monotonic()
    path = cache_path(cache_dir or default_cache_dir(), shards, on_error, how)
    saved: str | None = path
    scanned = _cached(path, shards, on_error, max_workers, how.remote)
    hit = scanned is not None
    if scanned is not None:
        for url, n in zip(shards, scanned.index.skipped, strict=False):
            if n:
                log.warning("%s: %d sample(s) skipped when the cached index was built", url, n)
        log_skips(scanned.skipped, scanned.damaged, len(shards))
    else:
        log.info("indexing %d shard(s), %d at once", len(shards), min(max_workers, len(shards)))
        scanned = scan_shards(shards, cache_dir=cache_dir, on_error=on_error,
                              max_workers=max_workers, progress=progress, how=how)
        data = _encode(scanned, on_error)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, lambda f: f.write(data))
        except OSError as e:
            log.warning("index cache not written to %s: %s", path, e)
            saved = None
    return LoadedIndex(scanned.index, hit, time.monotonic() - start, saved)
