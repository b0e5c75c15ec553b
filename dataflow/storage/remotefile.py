"""A remote shard's bytes, read in blocks through the bounded local cache.

:class:`RemoteBlob` splits a remote file into :data:`BLOCK_BYTES` blocks. A read fetches the
blocks it lacks with ranged GETs (in parallel, through :class:`~dataflow.storage.remote.Remote`),
stores them in the :class:`~dataflow.storage.lru.DiskLru` and reads only the bytes it needs
from them, so memory holds what a read returns, not whole blocks or files. Blocks are keyed by
the URL and the shard's identity: a changed shard never serves old blocks.

A server that ignores ``Range`` (an HTTP server answering every GET with the whole file) is
detected on the first ranged read; the file is then fetched whole once, block by block into
the cache, with a warning; a file larger than the whole cache is refused (naming
``--cache-size``).

:class:`RemoteStream` is a seekable binary file over a blob, for readers that want a file
(Parquet, the Arrow message walk). Indexing a tar copies it once with
:meth:`RemoteBlob.copy_to`, which does not fill the cache.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from typing import IO

import numpy as np

from dataflow.errors import RangeUnsupported, RemoteFailure, ShardReadError
from dataflow.storage.cache import info_identity
from dataflow.storage.lru import DiskLru
from dataflow.storage.remote import Remote, RemoteConfig, session

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20
BLOCKS_DIR = "blocks"
"""Subdirectory of ``--cache-dir`` holding the cached blocks (bounded by ``--cache-size``)."""
REFETCHES = 4
"""Fetches of a block evicted between its fetch and its read before a read gives up."""
STREAM_BUFFER = 8 << 20
"""Read size of :class:`RemoteStream`'s buffer: 8 blocks fetched in parallel per refill."""
COPY_PART = 8 << 20
"""Bytes of one ranged GET of :meth:`RemoteBlob.copy_to`, the one-pass copy that indexes a tar:
a request costs a round trip whatever its size (and on a moto S3 a copy of the whole object),
so a copy asks for few large parts, not 1 MiB blocks (bench/RESULTS.md: a plain 80 MiB tar
ready in 1.2 s instead of 5.8 s on loopback)."""
COPY_IN_FLIGHT = 2
"""Parts of :meth:`RemoteBlob.copy_to` fetched at once (the bytes a copy holds: 16 MiB)."""


class RemoteBlob:
    """The bytes of one remote file of ``size`` bytes. Thread-safe.

    Attributes:
        fetched: bytes this blob fetched from the remote (not from the cache).
        identity: the file's identity when the blob was made (size and ETag or time, see
            :func:`~dataflow.storage.cache.info_identity`).
    """

    def __init__(self, remote: Remote, url: str, size: int, identity: str, lru: DiskLru) -> None:
        self.remote = remote
        self.url = url
        self.size = size
        self.identity = identity
        self.fetched = 0
        self._lru = lru
        self._prefix = hashlib.sha256(f"{url}\n{identity}".encode()).hexdigest()[:24]
        self._whole = threading.Lock()
        self._count = threading.Lock()
        self._no_range = False

    def _key(self, block: int) -> str:
        return f"{self._prefix}-{block}"

    def _fetch(self, block: int) -> None:
        """Fetch block ``block`` into the cache."""
        start = block * BLOCK_BYTES
        stop = min(start + BLOCK_BYTES, self.size)
        if not self._no_range:
            try:
                data = self.remote.read_range(self.url, start, stop)
            except RangeUnsupported as e:
                self._fetch_whole(str(e))
                return
            except RemoteFailure as e:
                raise ShardReadError(self.url, e.reason, offset=start) from e
            if len(data) != stop - start:
                raise ShardReadError(self.url, f"got {len(data)} bytes of {stop - start} asked: "
                                     "the file changed or was cut short", offset=start)
            self._store(block, data)
            return
        self._fetch_whole("the server ignores HTTP Range requests")

    def _fetch_whole(self, why: str) -> None:
        """Fetch the whole file once (a server without ``Range``) into the cache's blocks."""
        with self._whole:
            if self._no_range and all(self._has(b) for b in range(self.blocks)):
                return
            self._no_range = True
            if self.size > self._lru.limit:
                raise ShardReadError(self.url, f"{why}, so the whole file ({self.size} bytes) "
                                     f"must be cached, but --cache-size is {self._lru.limit} "
                                     "bytes: raise it")
            log.warning("%s: %s; fetching the whole file (%d bytes) into the cache",
                        self.url, why, self.size)
            fs, path = self.remote.fs(self.url)
            try:
                data = self.remote.call(self.url, lambda: fs.cat_file(path))
            except RemoteFailure as e:
                raise ShardReadError(self.url, e.reason) from e
            if len(data) != self.size:
                raise ShardReadError(self.url, f"got {len(data)} bytes, expected {self.size}: "
                                     "the file changed")
            for b in range(self.blocks):
                self._store(b, data[b * BLOCK_BYTES : (b + 1) * BLOCK_BYTES])

    def _store(self, block: int, data: bytes) -> None:
        with self._count:
            self.fetched += len(data)
        try:
            self._lru.put(self._key(block), data)
        except OSError as e:
            raise ShardReadError(self.url, f"cannot write the cache {self._lru.directory}: "
                                 f"{e}") from e

    def _has(self, block: int) -> bool:
        return self._lru.get(self._key(block), 0, 0) is not None

    @property
    def blocks(self) -> int:
        return -(-self.size // BLOCK_BYTES)

    def ensure(self, blocks: list[int]) -> None:
        """Fetch those of ``blocks`` not cached, in parallel."""
        missing = [b for b in blocks if not self._has(b)]
        if len(missing) > 1 and not self._no_range:
            list(self.remote.pool.map(self._fetch, missing))
        else:
            for b in missing:
                self._fetch(b)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)``, clipped to the file.

        Raises:
            ShardReadError: the bytes cannot be fetched or cached.
        """
        stop = min(stop, self.size)
        if stop <= start:
            return b""
        first, last = start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES
        self.ensure(list(range(first, last + 1)))
        parts = []
        for b in range(first, last + 1):
            lo = max(start - b * BLOCK_BYTES, 0)
            hi = min(stop - b * BLOCK_BYTES, BLOCK_BYTES)
            data = self._lru.get(self._key(b), lo, hi)
            for _ in range(REFETCHES):
                if data is not None:
                    break
                self._fetch(b)  # evicted since ensure() by other reads: fetch it again
                data = self._lru.get(self._key(b), lo, hi)
            if data is None:
                raise ShardReadError(self.url, f"block {b} was evicted {REFETCHES} times before "
                                     f"it could be read: --cache-size ({self._lru.limit} "
                                     "bytes) is too small for the reads in flight",
                                     offset=b * BLOCK_BYTES)
            parts.append(data)
        return b"".join(parts)

    def read_exact(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` by one ranged read, bypassing the cache (for a few small
        reads); through the cache when the server ignores ``Range``."""
        stop = min(stop, self.size)
        if stop <= start:
            return b""
        cached = self._cached(start, stop)
        if cached is not None:
            return cached
        if not self._no_range:
            try:
                data = self.remote.read_range(self.url, start, stop)
            except RangeUnsupported as e:
                self._fetch_whole(str(e))
            except RemoteFailure as e:
                raise ShardReadError(self.url, e.reason, offset=start) from e
            else:
                with self._count:
                    self.fetched += len(data)
                return data
        return self.read(start, stop)

    def copy_to(self, dst: IO[bytes]) -> None:
        """Write the whole file to ``dst`` in :data:`COPY_PART` ranged reads,
        :data:`COPY_IN_FLIGHT` at once, not cached (a one-pass copy must not push out what the
        reads use); a part whose blocks are all cached comes from the cache."""
        spans = [(a, min(a + COPY_PART, self.size)) for a in range(0, self.size, COPY_PART)]
        for i in range(0, len(spans), COPY_IN_FLIGHT):
            for data in self.remote.pool.map(lambda s: self.read_exact(*s),
                                             spans[i : i + COPY_IN_FLIGHT]):
                dst.write(data)

    def _cached(self, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` if their blocks are all cached, else ``None``."""
        parts = []
        for b in range(start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES + 1):
            lo = max(start - b * BLOCK_BYTES, 0)
            data = self._lru.get(self._key(b), lo, min(stop - b * BLOCK_BYTES, BLOCK_BYTES))
            if data is None:
                return None
            parts.append(data)
        return b"".join(parts)

    def spans(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte spans ``[starts[i], stops[i])`` back to back in one buffer.

        Args:
            starts: int64 of shape ``(n,)``.
            stops: int64 of shape ``(n,)``, ``stops >= starts``.

        Returns:
            The uint8 buffer, and int64 ``(n,)``: where each span begins in it.
        """
        firsts = starts // BLOCK_BYTES
        lasts = np.maximum(stops - 1, starts) // BLOCK_BYTES
        needed = sorted({b for f, la in zip(firsts.tolist(), lasts.tolist(), strict=True)
                         for b in range(f, la + 1)})
        self.ensure(needed)
        parts = [self.read(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
        where = np.zeros(len(parts), dtype=np.int64)
        if parts:
            np.cumsum([len(p) for p in parts[:-1]], out=where[1:])
        return np.frombuffer(b"".join(parts), dtype=np.uint8), where


class RemoteStream(io.RawIOBase):
    """A seekable, read-only binary file over a :class:`RemoteBlob`."""

    def __init__(self, blob: RemoteBlob) -> None:
        super().__init__()
        self.blob = blob
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.blob.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.blob.read(self._pos, self._pos + len(b))
        memoryview(b)[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        stop = self.blob.size if size is None or size < 0 else self._pos + size
        data = self.blob.read(self._pos, stop)
        self._pos += len(data)
        return data

    def size(self) -> int:
        return self.blob.size


def buffered(blob: RemoteBlob) -> io.BufferedReader:
    """A buffered stream over ``blob`` refilled :data:`STREAM_BUFFER` bytes at a time."""
    return io.BufferedReader(RemoteStream(blob), buffer_size=STREAM_BUFFER)


def open_blob(url: str, config: RemoteConfig, cache_dir: str) -> RemoteBlob:
    """The blob of remote shard ``url``, its blocks cached in ``cache_dir/blocks``.

    Raises:
        ShardReadError: the shard cannot be found or queried (one line: endpoint, bucket...).
    """
    try:
        info = session(config).info(url)
    except RemoteFailure as e:
        raise ShardReadError(url, e.reason, offset=0) from e
    size = info.get("size")
    if not isinstance(size, int):
        raise ShardReadError(url, f"the store reports no size for it (info {sorted(info)})")
    return RemoteBlob(session(config), url, size, info_identity(info),
                      DiskLru(os.path.join(cache_dir, BLOCKS_DIR), config.cache_bytes))
