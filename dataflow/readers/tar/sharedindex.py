"""A tar member index file mapped by every reader of a host instead of read into each.

A reader keeping every shard open holds every tar's member index (~110 bytes a sample with
four fields): read into each reader process, a server of R readers holds it R times. Mapped
read-only, the index's pages are the kernel's page cache, one copy for every reader of the
host. A mapping sees the file as it is now, though, and a reader must keep using exactly the
index it verified (its digest, its fit to the tar). So an index file is mapped only under a
read lease (:mod:`dataflow.readers.lease`): no process can open it for writing or truncate it
while the lease holds. If the lease breaks (a writer waits), the reader, before letting go
(:func:`~dataflow.readers.guard.settle`), replaces the mapping by a private copy of what it
held, at the same addresses (``mmap(MAP_FIXED)`` of anonymous memory, filled, then made
read-only): every array and view of the index keeps its values, now in the reader's own
memory. Where no lease is granted (a process that did not arm leases, another owner, a
network filesystem), or where the process may map no more (:func:`allow`: each mapped index
holds two descriptors, which the server reserves when the hard limit leaves room), the index
is read into the process as before.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os

import numpy as np

from dataflow.errors import IndexCacheError, ShardChangedError, ShardReadError
from dataflow.readers.guard import FileGuard

log = logging.getLogger(__name__)
_budget = 0  # index files this process may map at once (each holds two descriptors)
_mapped = 0


def allow(files: int) -> None:
    """Let this process map at most ``files`` index files at once (0 by default: none), the
    descriptors its open-file limit leaves for them (two each)."""
    global _budget
    _budget = files


_MAP_FIXED = 0x10  # Linux's, on every architecture (Python's mmap module does not name it)
_MAP_FAILED = ctypes.c_void_p(-1).value


class SharedIndexFile:
    """One index file mapped under a read lease (see the module); nothing when none is
    granted. Not thread-safe (a reader's main thread).

    Attributes:
        path: the index file.
        data: the file's bytes as a read-only map, or ``None`` when no lease was granted.
    """

    def __init__(self, path: str) -> None:
        """Open ``path`` and map it if a lease on it is granted.

        Raises:
            FileNotFoundError: there is no file at ``path``.
            IndexCacheError: it cannot be opened or mapped, naming it.
        """
        self.path = path
        self.data: mmap.mmap | None = None
        self._guard: FileGuard | None = None
        if _mapped >= _budget:
            return
        try:
            self._guard = FileGuard(path, on_break=self._privatize)
        except ShardChangedError:
            return  # open for writing: read, and its digest checked, as when not leased
        except ShardReadError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                raise e.__cause__ from None
            raise IndexCacheError(f"tar index {path}: {e}") from e
        if not self._guard.leased or self._guard.size == 0:
            self.close()
            return
        try:
            self.data = mmap.mmap(self._guard.fd, self._guard.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            self.close()
            raise IndexCacheError(f"tar index {path}: cannot map: {e}") from e
        _count(1)

    def _privatize(self) -> None:
        """Put a private copy of the map's bytes at its addresses (its lease is breaking: the
        file cannot have changed yet)."""
        if self.data is None:
            return
        size = len(self.data)
        copy = bytes(self.data)
        addr = np.frombuffer(self.data, dtype=np.uint8).ctypes.data
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        got = libc.mmap(addr, size, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | _MAP_FIXED | mmap.MAP_ANONYMOUS, -1, 0)
        if got != addr or got == _MAP_FAILED:  # the kernel refused (no memory)
            # Letting go would leave the index mapped while a writer changes it: the reader
            # exits instead (its tasks go to the others, and a replacement starts).
            log.error("tar index %s: cannot replace its map by a copy (%s); the reader exits",
                      self.path, os.strerror(ctypes.get_errno()))
            raise SystemExit(1)
        ctypes.memmove(addr, copy, size)
        libc.mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(size), mmap.PROT_READ)

    def close(self) -> None:
        """Let go of the lease and the descriptor (idempotent). The map itself goes with the
        last array viewing it."""
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.close()
            if self.data is not None:
                _count(-1)
                try:
                    self.data.close()
                except BufferError:
                    pass  # arrays view it: unmapped (and its descriptor closed) when they go


def _count(change: int) -> None:
    global _mapped
    _mapped += change
