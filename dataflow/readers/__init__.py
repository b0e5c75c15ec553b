"""Shard readers: one module per format, chosen by the shard's magic bytes.

``open_shard(url)`` returns a :class:`ShardReader` giving random access to a shard's samples
as columnar batches; :func:`read_ranges` reads the ranges of one request across shards.

* formats: :mod:`~dataflow.readers.tar` (WebDataset tars), :mod:`~dataflow.readers.parquet`,
  :mod:`~dataflow.readers.arrow` (Arrow IPC files and streams; remote ones
  :mod:`~dataflow.readers.arrowremote`, record batch metadata :mod:`~dataflow.readers.arrowmeta`,
  rows lent to a gather across shards :mod:`~dataflow.readers.arrowrows`);
* what they share: :mod:`~dataflow.readers.base` (the interface), :mod:`~dataflow.readers.damage`
  (``on_error`` and what damage lost), :mod:`~dataflow.readers.guard` (a local file held open
  and checked), :mod:`~dataflow.readers.gather` (rows out of chunks),
  :mod:`~dataflow.readers.lost` (a shard that serves nothing),
  :mod:`~dataflow.readers.multi` (many ranges at once),
  :mod:`~dataflow.readers.across` (a few rows of each of many shards, in one pass),
  :mod:`~dataflow.readers.book` (the addresses of the shards a process keeps open, for it).
"""

from __future__ import annotations

import importlib
import os
import struct
from typing import TYPE_CHECKING, Any

from dataflow.convert.columns import ReadOptions
from dataflow.errors import ShardChangedError, ShardReadError
from dataflow.readers.base import ShardReader
from dataflow.readers.damage import MAX_SKIP_LOG, SkipRecord, check_on_error
from dataflow.readers.guard import FileGuard, IndexedShard, changed
from dataflow.readers.lost import LostShard
from dataflow.readers.multi import read_ranges
from dataflow.readers.tar.options import DEFAULT_OPTIONS, TarOptions
from dataflow.readers.tar.reader import TarReader
from dataflow.storage.cache import default_cache_dir
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import buffered, open_blob
from dataflow.storage.sources import is_local

if TYPE_CHECKING:
    from dataflow.readers.arrow import ArrowFileReader, ArrowStreamReader
    from dataflow.readers.arrowremote import RemoteArrowReader
    from dataflow.readers.parquet import ParquetReader

_DEFAULT_READ = ReadOptions()

__all__ = [
    "ArrowFileReader",
    "ArrowStreamReader",
    "IndexedShard",
    "LostShard",
    "ParquetReader",
    "RemoteArrowReader",
    "MAX_SKIP_LOG",
    "ShardReader",
    "SkipRecord",
    "TarOptions",
    "TarReader",
    "detect_format",
    "open_shard",
    "read_ranges",
]

_LAZY = {"ArrowFileReader": "arrow", "ArrowStreamReader": "arrow", "ParquetReader": "parquet",
         "RemoteArrowReader": "arrowremote"}
"""Readers whose modules import pyarrow: loaded on first use, so a server of tar shards starts
without pyarrow (about 0.2 s of imports)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


FORMATS = ("arrow-file", "arrow-stream", "parquet", "tar", "tar.gz")
_TAR_BLOCK = 512
_MAGIC_BYTES = _TAR_BLOCK


def detect_format(url: str, head: bytes, size: int) -> str:
    """The format of a shard from its first bytes (not its name).

    A file of whole 512-byte blocks whose first block is all zeros is an empty tar (just its
    end-of-archive blocks, as ``tarfile`` and webdataset write one). A zero-byte file has no
    format: every shard holds at least its header (a tar its end-of-archive blocks, an Arrow
    or Parquet file its schema, a gzip stream its header), so zero bytes mean a failed write.

    Args:
        url: the shard, for the error message.
        head: the shard's first bytes (at least 262 for tar detection, 512 for an empty tar).
        size: the shard's size in bytes.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        ShardReadError: a zero-byte file, or no known magic at offset 0.
    """
    if size == 0:
        raise ShardReadError(url, "empty file (zero bytes): every shard holds at least its "
                             "header (a tar its end-of-archive blocks), so this is a failed "
                             "write", offset=0)
    if head.startswith(b"ARROW1"):
        return "arrow-file"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head[257:262] == b"ustar" or _empty_tar(head, size):
        return "tar"
    if head.startswith(b"\xff\xff\xff\xff"):
        return "arrow-stream"
    if len(head) >= 8:
        length, root = struct.unpack_from("<iI", head)
        if 0 < length <= size - 4 and 0 < root < length:
            return "arrow-stream"
    raise ShardReadError(url, f"unknown shard format (first bytes {head[:8]!r})", offset=0)


def _empty_tar(head: bytes, size: int) -> bool:
    """Whether a file starts with an all-zero block and is made of whole tar blocks."""
    return len(head) >= _TAR_BLOCK and not any(head[:_TAR_BLOCK]) and size % _TAR_BLOCK == 0


def open_shard(
    url: str, *, cache_dir: str | None = None, on_error: str = "raise",
    options: ReadOptions = _DEFAULT_READ,
    tar: TarOptions = DEFAULT_OPTIONS,
    remote: RemoteConfig | None = None,
    indexed: IndexedShard | None = None,
) -> ShardReader:
    """Open one shard, detecting its format by magic bytes.

    Local shards are memory-mapped, their files held open and checked against their identity
    on every read (see :mod:`dataflow.readers.guard`). Remote ones are read through the
    bounded block cache (:mod:`dataflow.storage.remotefile`): Parquet and Arrow by ranged
    reads, plain tars by each sample's byte span; only a gzipped tar is decompressed whole
    into ``cache_dir``.

    Under ``on_error="skip"``, a zero-byte shard opens as a shard of no sample and no field
    (its damage recorded in ``skip_log``), and a shard that no longer matches ``indexed`` as
    one that serves none of the indexed samples and counts every one a read asks for (a
    :class:`~dataflow.readers.lost.LostShard`).

    Args:
        url: a local path or fsspec URL.
        cache_dir: where tar indexes go when they cannot sit beside the shard, where remote
            bytes are cached (``blocks/``, bounded by ``remote.cache_bytes``) and where gzipped
            tars are decompressed; default :func:`default_cache_dir`.
        on_error: ``"raise"`` on bad samples, or ``"skip"`` to drop them and count them in
            ``reader.skipped`` (see :class:`ShardReader`).
        options: column selection and conversion (Arrow and Parquet shards only).
        tar: WebDataset conventions of tar shards (``__key__``, samples missing a field).
        remote: storage options and cache size for remote shards (default: none, and the
            default size).
        indexed: what the dataset index recorded of the shard (its identity: size and mtime,
            or size and ETag; its sample count): a shard that differs is refused. ``None``:
            the shard is taken as it is (and a local one still checked on every read against
            what it was when opened).

    Raises:
        ConfigError: ``on_error`` is invalid.
        ShardChangedError: the shard differs from ``indexed`` (``on_error="raise"``).
        ShardReadError: the shard is missing, unreadable, of unknown format or damaged, or
            column options are given for a tar shard.
    """
    check_on_error(on_error)
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    expect = indexed.identity if indexed is not None else None
    try:
        if not is_local(url):
            reader = _open_remote(url, cache_dir, on_error, remote or RemoteConfig(), options,
                                  tar, expect)
        else:
            reader = _open_local(url, cache_dir, on_error, options, tar, expect)
        if indexed is not None and len(reader) != indexed.samples:
            reader.close()
            raise ShardChangedError(url, f"has {len(reader)} sample(s) where the dataset "
                                    f"index recorded {indexed.samples}; restart the server to "
                                    "index it again")
    except ShardChangedError as e:
        if on_error == "raise" or indexed is None:
            raise
        return LostShard(url, indexed.schema, indexed.samples, e)
    return reader


def _sniff(url: str, head: bytes, size: int, on_error: str) -> str | LostShard:
    """The shard's format, or under ``on_error="skip"`` a zero-byte shard's stand-in."""
    try:
        return detect_format(url, head, size)
    except ShardReadError as e:
        if size or on_error == "raise":
            raise
        return LostShard(url, (), 0, e)


def _open_local(url: str, cache_dir: str, on_error: str, options: ReadOptions,
                tar: TarOptions, expect: str | None) -> ShardReader:
    guard = FileGuard(url, expect)
    try:
        fmt = _sniff(url, os.pread(guard.fd, _MAGIC_BYTES, 0), guard.size, on_error)
        if isinstance(fmt, LostShard):
            guard.close()
            return fmt
        if fmt == "arrow-file":
            from dataflow.readers.arrow import ArrowFileReader

            return ArrowFileReader(url, on_error, options, guard=guard)
        if fmt == "arrow-stream":
            from dataflow.readers.arrow import ArrowStreamReader

            return ArrowStreamReader(url, on_error, options, guard=guard)
        if fmt == "parquet":
            from dataflow.readers.parquet import ParquetReader

            return ParquetReader(url, on_error, options, guard=guard)
        _check_tar_options(url, options)
        return TarReader(url, guard, cache_dir=cache_dir, on_error=on_error,
                         gzipped=fmt == "tar.gz", options=tar)
    except BaseException:
        guard.close()  # a reader that took it closed it too (idempotent)
        raise


def _check_tar_options(url: str, options: ReadOptions) -> None:
    if options.columns is not None or options.drop or options.fill or options.hive:
        raise ShardReadError(url, "--columns, --drop-columns, --fill-value and hive "
                             "partitions apply to Arrow and Parquet shards, not tars", offset=0)


def _open_remote(url: str, cache_dir: str, on_error: str, remote: RemoteConfig,
                 options: ReadOptions, tar: TarOptions, expect: str | None) -> ShardReader:
    blob = open_blob(url, remote, cache_dir)
    if expect is not None and blob.identity != expect:
        raise changed(url, expect, blob.identity)
    fmt = _sniff(url, blob.read_exact(0, _MAGIC_BYTES), blob.size, on_error)
    if isinstance(fmt, LostShard):
        return fmt
    if fmt in ("arrow-file", "arrow-stream"):
        from dataflow.readers.arrowremote import RemoteArrowReader

        return RemoteArrowReader(url, blob, on_error, file=fmt == "arrow-file", options=options)
    if fmt == "parquet":
        from dataflow.readers.parquet import ParquetReader

        return ParquetReader(url, on_error, options, source=buffered(blob))
    _check_tar_options(url, options)
    return TarReader(url, blob, cache_dir=cache_dir, on_error=on_error, gzipped=fmt == "tar.gz",
                     options=tar, remote=remote)
