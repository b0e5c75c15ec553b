"""Where the member index of a tar shard is kept, and which kept one is trusted.

An index is saved beside a local shard as ``<shard>.dfidx`` when that directory is writable,
else in ``cache_dir`` under a name unique to the shard (:func:`index_paths`); the file's form
is :mod:`dataflow.readers.tar.indexfile`. A kept index is trusted only when it verifies
(:func:`find_index`: the shard's identity, the file's digest, its fit to the tar, sampled
headers); one that does not is rebuilt, with a warning when the shard's identity matched (a
damaged or tampered index).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from dataflow.errors import IndexCacheError, OutdatedIndex
from dataflow.readers.tar.index import TarIndex
from dataflow.readers.tar.indexfile import load_tar_index, save_tar_index
from dataflow.storage.cache import cache_name, write_atomic
from dataflow.storage.sources import INDEX_SUFFIX, is_local, local_path

log = logging.getLogger(__name__)


def index_paths(url: str, cache_dir: str, missing_field: str) -> list[str]:
    """Candidate index locations, preferred first: beside a local shard, then in cache_dir.
    Indexes built under another ``missing_field`` than ``"error"`` have their own name."""
    suffix = INDEX_SUFFIX if missing_field == "error" else f".{missing_field}{INDEX_SUFFIX}"
    cached = os.path.join(cache_dir, cache_name(url, suffix))
    return [local_path(url) + suffix, cached] if is_local(url) else [cached]


def save_index(index: TarIndex, paths: list[str]) -> str | None:
    """Save ``index`` at the first of ``paths`` whose directory accepts the write.

    Writability is decided by trying: a directory that refuses the file (permissions, a
    read-only filesystem) passes the index on to the next candidate.

    Returns:
        Where the index was saved, or ``None`` if no candidate accepted it (logged).
    """
    for path in paths:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, lambda f: save_tar_index(index, f))
            return path
        except OSError as e:
            log.debug("cannot write tar index %s: %s", path, e)
    log.warning("tar index not cached: none of %s is writable", paths)
    return None


def find_index(url: str, paths: list[str], ident: str, on_error: str,
               problem: Callable[[TarIndex], str | None],
               load: Callable[[str, str], TarIndex] = load_tar_index,
               ) -> tuple[str | None, TarIndex | None]:
    """The first cached index that is current and verifies against the tar, with its path;
    a rejected one that claims to be current is logged.

    Args:
        url: the shard, for messages.
        paths: where its index may be kept (:func:`index_paths`), preferred first.
        ident: the shard's identity: an index of another one is not current.
        on_error: the reader's policy: an index built under ``"skip"`` that left damage out
            is no index for ``"raise"``, which must raise that damage.
        problem: what is wrong with an index against the tar as it is now (``None``: it
            fits), as :meth:`TarIndex.problem` says for a mapped tar and
            :func:`~dataflow.readers.tar.remote.remote_problem` for a remote one.
        load: how an index is loaded from its path (:func:`load_tar_index` by default).

    Returns:
        ``(path, index)``, or ``(None, None)`` when none is current and fits: the index is
        then built anew.
    """
    for path in paths:
        try:
            index = load(path, url)
        except FileNotFoundError:
            continue
        except OutdatedIndex as e:
            log.info("cached tar index outdated, rebuilding: %s", e)
            continue
        except IndexCacheError as e:
            log.warning("cached tar index rejected, rebuilding: %s", e)
            continue
        if index.identity != ident:
            log.debug("%s: cached tar index %s is of another version of the shard", url, path)
            continue
        if on_error == "raise" and index.skips:
            continue  # built under "skip": it hides damage that must raise
        found = problem(index)
        if found is None:
            return path, index
        log.warning("%s: cached tar index %s rejected, rebuilding: %s", url, path, found)
    return None, None
