"""A local cache of remote bytes, bounded in bytes, least recently used evicted first.

Entries are files in one directory, shared by every process of a server (and by servers
sharing ``--cache-dir``). A put takes an exclusive ``flock`` on the directory's lock file and
keeps a running total in a small usage file; when the total would pass the limit, it lists
the directory and deletes the least recently used entries (oldest modification time: a hit
touches its entry) until the total, new entry included, is at most ``LOW_WATER`` of the
limit, so listings are rare. So the bytes on disk never exceed the limit, whatever the
number of processes. A reader never keeps an entry open: it reads the bytes it needs and
closes the file, so a deleted entry frees its space at once; an entry deleted under a reader
is a miss, fetched again.

:func:`evictions` is the pure part (which entries go), tested without a disk.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from typing import NamedTuple

from dataflow.errors import ConfigError
from dataflow.storage.cache import write_atomic

LOW_WATER = 0.9
_LOCK = ".lock"
_USAGE = ".usage"


class Entry(NamedTuple):
    """A cached entry: its key, size in bytes and last use (seconds, any monotonic scale)."""

    key: str
    size: int
    used: float


def evictions(entries: Sequence[Entry], limit: int, incoming: int,
              low_water: float = LOW_WATER) -> list[str]:
    """Keys to delete, least recently used first, so that the entries left plus ``incoming``
    bytes fit in ``low_water * limit`` bytes (or nothing is left).

    Args:
        entries: what the cache holds.
        limit: the cache's size limit in bytes.
        incoming: bytes about to be added; at most ``limit``.

    Raises:
        ConfigError: ``incoming`` is larger than ``limit``.
    """
    if incoming > limit:
        raise ConfigError(f"an entry of {incoming} bytes cannot fit a cache of {limit} bytes")
    total = sum(e.size for e in entries) + incoming
    if total <= limit:
        return []
    target = int(limit * low_water)
    out: list[str] = []
    for e in sorted(entries, key=lambda e: (e.used, e.key)):
        if total <= target:
            break
        out.append(e.key)
        total -= e.size
    return out


class DiskLru:
    """Files in ``directory`` holding at most ``limit`` bytes. Safe across threads and
    processes (every change is made under the directory's ``flock``).

    Attributes:
        evicted: entries this object deleted.
    """

    def __init__(self, directory: str, limit: int) -> None:
        if limit < 1:
            raise ConfigError(f"cache size limit must be at least 1 byte. Found: {limit}")
        self.directory = directory
        self.limit = limit
        self.evicted = 0
        os.makedirs(directory, exist_ok=True)

    def get(self, key: str, start: int = 0, stop: int | None = None) -> bytes | None:
        """Bytes ``[start, stop)`` of entry ``key`` (touched as used), or ``None`` if absent."""
        path = os.path.join(self.directory, key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(-1 if stop is None else stop - start)
            os.utime(path)
        except FileNotFoundError:
            return None
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` as entry ``key``, evicting least recently used entries first.

        Raises:
            ConfigError: ``data`` is larger than the whole cache.
            OSError: the directory is not writable.
        """
        with open(os.path.join(self.directory, _LOCK), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            usage = self._usage()
            old = self._size(key)
            if usage - old + len(data) > self.limit:
                entries = self._scan(exclude=key)
                gone = evictions(entries, self.limit, len(data))
                for k in gone:
                    try:
                        os.unlink(os.path.join(self.directory, k))
                    except FileNotFoundError:
                        pass
                self.evicted += len(gone)
                usage = sum(e.size for e in entries if e.key not in set(gone))
                old = 0
            write_atomic(os.path.join(self.directory, key), lambda f: f.write(data))
            self._set_usage(usage - old + len(data))

    def usage(self) -> int:
        """Bytes held, from the directory listing."""
        return sum(e.size for e in self._scan(exclude=None))

    def _size(self, key: str) -> int:
        try:
            return os.path.getsize(os.path.join(self.directory, key))
        except FileNotFoundError:
            return 0

    def _scan(self, exclude: str | None) -> list[Entry]:
        out = []
        with os.scandir(self.directory) as it:
            for d in it:
                if d.name.startswith(".") or d.name == exclude:
                    continue
                try:
                    st = d.stat()
                except FileNotFoundError:
                    continue
                out.append(Entry(d.name, st.st_size, st.st_mtime))
        return out

    def _usage(self) -> int:
        try:
            with open(os.path.join(self.directory, _USAGE), encoding="ascii") as f:
                return int(f.read())
        except (FileNotFoundError, ValueError):
            return sum(e.size for e in self._scan(exclude=None))

    def _set_usage(self, n: int) -> None:
        write_atomic(os.path.join(self.directory, _USAGE), lambda f: f.write(str(n).encode()))
