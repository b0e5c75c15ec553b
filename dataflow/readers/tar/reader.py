"""WebDataset tar shards (plain or gzipped, local or remote), read through a member index.

On open, the reader loads the shard's member index (see :mod:`dataflow.readers.tar.index`)
from where it is kept (:mod:`dataflow.readers.tar.indexcache`), or builds and keeps it. It
then memory-maps the tar and collates any sample range
with vectorized gathers: ``.npy`` fields become one ``(n, *shape)`` array, integer fields come
from the index itself, text and bytes fields become :class:`~dataflow.batch.Ragged` columns.

A gzipped tar is first decompressed once into ``cache_dir`` as an uncompressed copy, kept next
to a record of the shard's identity and replaced when the shard changes; that copy is then
memory-mapped. A plain remote tar is not copied: reads fetch the byte span of each sample they
need (:meth:`TarReader._fetch`) through the bounded block cache
(:mod:`dataflow.storage.remotefile`). Only indexing a remote tar without a cached index needs
the whole tar once: it is streamed into a temporary file, indexed and deleted. A cached index
of a remote tar is verified with
:data:`~dataflow.readers.tar.remote.REMOTE_VERIFY_HEADERS` exact ranged reads of sampled
headers.

A tar holding only its end-of-archive blocks is a shard of zero samples and no fields (a
zero-byte file is a failed write: see :func:`dataflow.readers.detect_format`).

A local plain tar is mapped from the file :mod:`dataflow.readers.guard` holds open, never
past the size checked; every read checks first and last that the file kept the identity its
index was built for, and that each sample read still starts with a tar header at its recorded
offset (the first and last bytes of the ``ustar`` magic), so a tar rewritten in place is
refused rather than read at stale offsets.

Damage is dealt with when the index is built (see :mod:`dataflow.readers.tar.build`): under
``on_error="skip"`` the damaged samples are left out of the index and counted once, so reads
never meet them.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from typing import cast

import numpy as np

from dataflow.batch import Batch, FieldSpec, Ragged
from dataflow.errors import ShardChangedError, ShardReadError
from dataflow.readers import lease
from dataflow.readers.base import ShardReader
from dataflow.readers.gather import range_rows
from dataflow.readers.guard import FileGuard, changed
from dataflow.readers.sink import BatchSink
from dataflow.readers.tar.build import build_index
from dataflow.readers.tar.index import (
    TarIndex,
    copy_fixed,
    gather_fixed,
    gather_ragged,
    sample_keys,
)
from dataflow.readers.tar.indexcache import find_index, index_paths, save_index
from dataflow.readers.tar.indexfile import load_tar_index, parse_tar_index
from dataflow.readers.tar.options import DEFAULT_OPTIONS, KEY_FIELD, TarOptions
from dataflow.readers.tar.remote import HeaderProbe, remote_problem
from dataflow.readers.tar.rows import MAGIC_AT, MAGIC_FIRST, MAGIC_LAST, TarRows
from dataflow.readers.tar.sharedindex import SharedIndexFile
from dataflow.storage.cache import local_copy
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import RemoteBlob

log = logging.getLogger(__name__)



class TarReader(ShardReader):
    """A WebDataset tar shard.

    Attributes:
        index_path: where the member index was loaded from or saved to (``None`` if it could
            not be saved).
        index_built: whether opening this reader built the index (``False``: loaded a cache).
    """

    def __init__(self, url: str, source: FileGuard | RemoteBlob, *, cache_dir: str,
                 on_error: str, gzipped: bool, options: TarOptions = DEFAULT_OPTIONS,
                 remote: RemoteConfig | None = None) -> None:
        """Open the tar ``source`` holds.

        Args:
            url: the shard.
            source: a local shard's open file (the reader closes it): a plain tar is mapped
                from it and checked on every read, a gzipped one while it is decompressed;
                or a remote shard's bytes. The member index must be of its identity.
            cache_dir, on_error, remote: see :func:`dataflow.readers.open_shard`.
            gzipped: the shard is a gzipped tar.
            options: WebDataset conventions.

        Raises:
            ShardChangedError: a gzipped shard changed while it was decompressed.
            ShardReadError: the shard cannot be read, or is damaged (``on_error="raise"``).
        """
        super().__init__(url, on_error)
        self.tar = options
        self._row_lent: TarRows | None = None
        self._mm: mmap.mmap | None = None
        self._buf = np.empty(0, dtype=np.uint8)
        self._index_file: SharedIndexFile | None = None
        self._blob = source if isinstance(source, RemoteBlob) and not gzipped else None
        ident = source.identity
        paths = index_paths(url, cache_dir, options.missing_field)
        if self._blob is not None:
            probe = HeaderProbe(self._blob)
            self.index_path, index = find_index(url, paths, ident, self.on_error,
                                                lambda ix: remote_problem(ix, probe))
            self.index_built = index is None
            if index is None:
                index = self._index_remote(self._blob, cache_dir, ident)
                self.index_path = save_index(index, paths)
            self._adopt(index)
            return
        damage = None
        if isinstance(source, FileGuard) and not gzipped:
            self._guard = source
            data = self._map(source.fd, source.size)
        else:  # gzipped, local or remote
            copy = local_copy(url, cache_dir, gunzip=True, remote=remote)
            if copy.identity != ident:
                raise changed(url, ident, copy.identity)
            if isinstance(source, FileGuard):
                source.check()  # not changed while it was decompressed
                source.close()  # reads map the copy, which nothing rewrites
            damage = copy.damage
            data = self._map_file(copy.path)
        if damage is not None:
            self._damaged(ShardReadError(url, f"{damage}: the rest of the shard, from the first "
                                         "damage the tar walk meets, is lost (its samples "
                                         "cannot be counted)"))
        self.index_path, index = find_index(url, paths, ident, self.on_error,
                                            lambda ix: ix.problem(data), self._load_index)
        if self._index_file is not None and self._index_file.path != self.index_path:
            self._index_file.close()  # mapped, then rejected
            self._index_file = None
        self.index_built = index is None
        if index is None:
            try:
                index = build_index(url, data, ident, self.on_error, resync=damage is None,
                                    missing_field=options.missing_field)
            except BaseException:
                self.close()
                raise
            self.index_path = save_index(index, paths)
        self._adopt(index)

    def _load_index(self, path: str, url: str) -> TarIndex:
        """The index kept at ``path``: mapped where a lease on it is granted (shared by the
        host's readers: :mod:`~dataflow.readers.tar.sharedindex`), else read."""
        if not lease.armed():
            return load_tar_index(path, url)
        shared = SharedIndexFile(path)
        if shared.data is None:
            return load_tar_index(path, url)
        try:
            index = parse_tar_index(shared.data, path, url)
        except BaseException:
            shared.close()
            raise
        if self._index_file is not None:
            self._index_file.close()
        self._index_file = shared
        return index

    def _map(self, fd: int, size: int) -> bytes | mmap.mmap:
        """Map the first ``size`` bytes of the uncompressed tar open as ``fd`` (never more,
        so no access lies past the size checked; none is ``b""``)."""
        try:
            self._mm = None if size == 0 else mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ShardReadError(self.url, f"cannot map tar: {e}", offset=0) from e
        data: bytes | mmap.mmap = b"" if self._mm is None else self._mm
        self._buf = np.frombuffer(data, dtype=np.uint8)
        return data

    def _map_file(self, path: str) -> bytes | mmap.mmap:
        """Map the uncompressed tar at ``path`` (a local copy this reader's cache made)."""
        try:
            with open(path, "rb") as f:
                return self._map(f.fileno(), os.fstat(f.fileno()).st_size)
        except OSError as e:
            raise ShardReadError(self.url, f"cannot map tar: {e}", offset=0) from e

    def _index_remote(self, blob: RemoteBlob, cache_dir: str, ident: str) -> TarIndex:
        """Index a remote tar from a temporary local copy, deleted once indexed."""
        os.makedirs(cache_dir, exist_ok=True)
        try:
            with tempfile.NamedTemporaryFile(dir=cache_dir, prefix=".index-") as tmp:
                blob.copy_to(tmp)
                tmp.flush()
                data = self._map_file(tmp.name)
                try:
                    return build_index(self.url, data, ident, self.on_error,
                                       missing_field=self.tar.missing_field)
                finally:
                    self._unmap()
        except OSError as e:
            raise ShardReadError(self.url, f"cannot copy the tar into {cache_dir} to index "
                                 f"it: {e}") from e

    def _adopt(self, index: TarIndex) -> None:
        self._index = index
        # Per field: the size of a present value (filled cells have -1), and whether any is.
        self._field_size: list[int] = index.sizes.max(axis=0, initial=0).tolist()
        self._filled: list[bool] = np.any(index.sizes < 0, axis=0).tolist()
        self._keys: Ragged | None = None
        self.schema = index.schema
        if self.tar.keys and index.schema:
            self.schema += (FieldSpec(KEY_FIELD, "uint8", ragged="str"),)
        self.skipped = index.skipped
        self.skip_log.extend(index.skips)

    def __len__(self) -> int:
        return len(self._index)

    def _read(self, start: int, stop: int) -> Batch:
        return self._gather(slice(start, stop))

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        return self._gather(range_rows(starts, stops))

    def _read_into(self, starts: np.ndarray, stops: np.ndarray, sink: BatchSink) -> Batch:
        return self._gather(range_rows(starts, stops), sink)

    def _gather(self, rows: slice | np.ndarray, sink: BatchSink | None = None) -> Batch:
        """Every field of ``rows`` (a slice, or int64 sample indices of shape ``(n,)``), the
        fixed-size ones written at ``sink``'s rows when there is one."""
        ix = self._index
        offsets, sizes = ix.offsets[rows], ix.sizes[rows]
        buf = self._buf
        if self._guard is not None:
            self._check_headers(rows)
        if self._blob is not None:
            # A filled cell points at a present cell of its field: fetch what a read takes.
            npy = np.array([c.startswith("npy:") for c in ix.codecs], dtype=bool)
            taken = np.where(npy, np.asarray(self._field_size, dtype=np.int64), 0)
            buf, offsets = self._fetch(self._blob, offsets, np.where(sizes < 0, taken, sizes))
        out: Batch = {}
        n = len(offsets)
        for j, (spec, codec) in enumerate(zip(ix.schema, ix.codecs, strict=True)):
            offs = offsets[:, j]
            if codec == "int":
                if sink is None:
                    out[spec.name] = ix.ints[rows, j].copy()
                else:
                    ints = out[spec.name] = sink.rows(spec.name, ix.ints.dtype, (), n)
                    ints[...] = ix.ints[rows, j]
            elif codec.startswith("npy:"):
                dtype = np.dtype(codec[4:])
                if sink is not None and dtype.isnative:
                    arr = sink.rows(spec.name, dtype, spec.shape, n)
                    copy_fixed(buf, offs, self._field_size[j], arr)
                else:
                    arr = self._npy(buf, dtype, spec.shape, offs, self._field_size[j])
                if self._filled[j]:
                    arr[sizes[:, j] < 0] = 0
                out[spec.name] = arr
            else:
                out[spec.name] = gather_ragged(buf, offs, np.maximum(sizes[:, j], 0)
                                                if self._filled[j] else sizes[:, j], codec)
        if self.tar.keys and ix.schema:
            out[KEY_FIELD] = self._key_rows(rows)
        return out

    def _check_headers(self, rows: slice | np.ndarray) -> None:
        """Check that each sample of ``rows`` still starts with a tar header (the ``ustar``
        magic at its recorded offset), where the file's identity alone could miss a change
        (a copy that kept size and mtime).

        Raises:
            ShardChangedError: naming the first sample without one.
        """
        heads = self._index.headers[rows]
        at = heads + MAGIC_AT  # two gathers: ~6 us per 256 samples, the whole magic ~40 us
        bad = np.flatnonzero((self._buf[at] != MAGIC_FIRST) | (self._buf[at + 4] != MAGIC_LAST))
        if bad.size:
            first = int(bad[0])
            sample = (np.arange(len(self), dtype=np.int64)[rows])[first]
            raise ShardChangedError(self.url, "no tar header where the index has this sample's: "
                                    "the shard changed since it was indexed; restart the server "
                                    "to index it again", offset=int(heads[first]),
                                    index=int(sample))

    def _row_source(self) -> TarRows | None:
        """A local plain or gzipped tar's index and map (:mod:`dataflow.readers.tar.rows`);
        a remote tar takes no part."""
        if self._row_lent is None and self._blob is None and self._mm is not None:
            keys = self._all_keys() if self.tar.keys and self._index.schema else None
            self._row_lent = TarRows(self, keys)
        return self._row_lent

    def _all_keys(self) -> Ragged:
        """Every sample's ``__key__``, read from the samples' tar headers on first use (a
        remote tar's headers are fetched then, in parallel)."""
        if self._keys is None:
            data: bytes | mmap.mmap | HeaderProbe = self._mm if self._mm is not None else b""
            if self._blob is not None:
                data = HeaderProbe(self._blob)
                data.prefetch(self._index.headers)
            self._keys = sample_keys(self.url, cast(bytes, data), self._index.headers)
        return self._keys

    def _key_rows(self, rows: slice | np.ndarray) -> Ragged:
        """The ``__key__`` of ``rows``."""
        keys = self._all_keys()
        starts = keys.offsets[:-1][rows]
        stops = keys.offsets[1:][rows]
        return gather_ragged(keys.values, starts, stops - starts, "str")

    def _fetch(self, blob: RemoteBlob, offsets: np.ndarray,
               sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bytes of the rows' fields from the remote tar: one span per row (its first
        field's data to its last one's end), back to back in one buffer.

        Args:
            offsets: int64 ``(n, fields)``: where each field's data lies in the tar.
            sizes: int64 ``(n, fields)``: its size.

        Returns:
            The uint8 buffer, and ``offsets`` moved into it.
        """
        data = np.array([c != "int" for c in self._index.codecs], dtype=bool)
        if not len(offsets) or not data.any():
            return self._buf, offsets
        lo = offsets[:, data].min(axis=1)
        hi = (offsets + sizes)[:, data].max(axis=1)
        buf, where = blob.spans(lo, hi)
        return buf, offsets - lo[:, None] + where[:, None]

    @staticmethod
    def _npy(buf: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], offs: np.ndarray,
             size: int) -> np.ndarray:
        arr = gather_fixed(buf, offs, size).view(dtype).reshape((len(offs), *shape))
        return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))

    def close(self) -> None:
        self.closed = True
        self._row_lent = None  # it views the map
        self._unmap()
        if self._guard is not None:
            self._guard.close()
        if self._index_file is not None:
            self._index_file.close()

    def _unmap(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                log.debug("%s: arrays still view the map; it is unmapped when they go", self.url)
