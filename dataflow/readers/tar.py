"""WebDataset tar shards (plain or gzipped, local or remote), read through a member index.

On open, the reader loads the shard's member index (see :mod:`dataflow.readers.tarindex`)
or builds and caches it: beside the shard as ``<shard>.dfidx`` when that directory is
writable, else in ``cache_dir``. It then memory-maps the tar and collates any sample range
with vectorized gathers: ``.npy`` fields become one ``(n, *shape)`` array, integer fields come
from the index itself, text and bytes fields become :class:`~dataflow.batch.Ragged` columns.

A tar that cannot be memory-mapped in place (gzipped, or remote) is first decompressed or
downloaded once into ``cache_dir`` as an uncompressed copy, kept next to a record of the
shard's identity and replaced when the shard changes; that copy is then memory-mapped.

A zero-byte tar, like a tar holding only its end-of-archive blocks, is a shard of zero
samples and no fields.

Damage is dealt with when the index is built (see :mod:`dataflow.readers.tarbuild`): under
``on_error="skip"`` the damaged samples are left out of the index and counted once, so reads
never meet them. A cached index is trusted only when it verifies (identity, digest, fit to
the tar, sampled headers); one that does not is rebuilt, with a warning when the shard's
identity matched (a damaged or tampered index).
"""

from __future__ import annotations

import logging
import mmap
import os

import numpy as np

from dataflow.batch import Batch, Column, Ragged
from dataflow.errors import ShardReadError
from dataflow.readers.base import ShardReader, range_rows
from dataflow.readers.cache import cache_name, identity, local_copy, write_atomic
from dataflow.readers.tarbuild import build_index
from dataflow.readers.tarindex import TarIndex, gather_fixed
from dataflow.readers.tarindexfile import OutdatedIndex, load_tar_index, save_tar_index
from dataflow.sources import INDEX_SUFFIX, is_local, local_path

log = logging.getLogger(__name__)


def _index_paths(url: str, cache_dir: str) -> list[str]:
    """Candidate index locations, preferred first: beside a local shard, then in cache_dir."""
    cached = os.path.join(cache_dir, cache_name(url, INDEX_SUFFIX))
    return [local_path(url) + INDEX_SUFFIX, cached] if is_local(url) else [cached]


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


class TarReader(ShardReader):
    """A WebDataset tar shard.

    Attributes:
        index_path: where the member index was loaded from or saved to (``None`` if it could
            not be saved).
        index_built: whether opening this reader built the index (``False``: loaded a cache).
    """

    def __init__(self, url: str, *, cache_dir: str, on_error: str, gzipped: bool) -> None:
        super().__init__(url, on_error)
        ident = identity(url)
        damage = None
        if gzipped or not is_local(url):
            path, damage = local_copy(url, cache_dir, gunzip=gzipped)
        else:
            path = local_path(url)
        if damage is not None:
            self._damaged(ShardReadError(url, f"{damage}: the rest of the shard, from the first "
                                         "damage the tar walk meets, is lost (its samples "
                                         "cannot be counted)"))
        try:
            with open(path, "rb") as f:
                empty = os.fstat(f.fileno()).st_size == 0
                self._mm = None if empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ShardReadError(url, f"cannot map tar: {e}", offset=0) from e
        data: bytes | mmap.mmap = b"" if self._mm is None else self._mm
        self._buf = np.frombuffer(data, dtype=np.uint8)
        paths = _index_paths(url, cache_dir)
        self.index_path, index = self._find_index(paths, ident, data)
        self.index_built = index is None
        if index is None:
            try:
                index = build_index(url, data, ident, on_error, resync=damage is None)
            except BaseException:
                self.close()
                raise
            self.index_path = save_index(index, paths)
        self._index = index
        self.schema = index.schema
        self.skipped = index.skipped
        self.skip_log.extend(index.skips)

    def _find_index(
        self, paths: list[str], ident: str, data: bytes | mmap.mmap
    ) -> tuple[str | None, TarIndex | None]:
        """The first cached index that is current and verifies against the tar, with its
        path; a rejected one that claims to be current is logged."""
        for path in paths:
            try:
                index = load_tar_index(path, self.url)
            except FileNotFoundError:
                continue
            except OutdatedIndex as e:
                log.info("cached tar index outdated, rebuilding: %s", e)
                continue
            except ValueError as e:
                log.warning("cached tar index rejected, rebuilding: %s", e)
                continue
            if index.identity != ident:
                log.debug("%s: cached tar index %s is of another version of the shard",
                          self.url, path)
                continue
            if self.on_error == "raise" and index.skips:
                continue  # built under "skip": it hides damage that must raise
            problem = index.problem(data)
            if problem is None:
                return path, index
            log.warning("%s: cached tar index %s rejected, rebuilding: %s", self.url, path,
                        problem)
        return None, None

    def __len__(self) -> int:
        return len(self._index)

    def _read(self, start: int, stop: int) -> Batch:
        return self._gather(slice(start, stop))

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        return self._gather(range_rows(starts, stops))

    def _gather(self, rows: slice | np.ndarray) -> Batch:
        """Every field of ``rows`` (a slice, or int64 sample indices of shape ``(n,)``)."""
        ix = self._index
        out: Batch = {}
        for j, (spec, codec) in enumerate(zip(self.schema, ix.codecs, strict=True)):
            offs = ix.offsets[rows, j]
            if codec == "int":
                out[spec.name] = ix.ints[rows, j].copy()
            elif codec.startswith("npy:"):
                out[spec.name] = self._npy(np.dtype(codec[4:]), spec.shape, offs,
                                           int(ix.sizes[0, j]))
            else:
                out[spec.name] = self._ragged(offs, ix.sizes[rows, j], codec)
        return out

    def _npy(self, dtype: np.dtype, shape: tuple[int, ...], offs: np.ndarray,
             size: int) -> np.ndarray:
        arr = gather_fixed(self._buf, offs, size).view(dtype).reshape((len(offs), *shape))
        return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))

    def _ragged(self, offs: np.ndarray, sizes: np.ndarray, kind: str) -> Column:
        """One copy of every row's bytes, back to back (one ``np.concatenate`` of views)."""
        bounds = np.zeros(len(offs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=bounds[1:])
        buf = self._buf
        values = np.concatenate(
            [buf[o : o + s] for o, s in zip(offs.tolist(), sizes.tolist(), strict=True)]
        )
        return Ragged(values, bounds, kind)

    def close(self) -> None:
        self.closed = True
        self._buf = np.empty(0, dtype=np.uint8)
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                log.debug("%s: arrays still view the map; it is unmapped when they go", self.url)
