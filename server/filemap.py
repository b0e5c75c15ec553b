"""Files of a memory filesystem read in place: a read-only shared mapping of a whole file, so
its bytes are the filesystem's own pages (no copy, no new memory to fault in and zero).

Used by the disk tier of the decoded-sample cache (:mod:`dataflow.server.diskcache`) on tmpfs
(``/dev/shm``) only: there a mapped page is memory, and a file the tier writes is never
truncated nor rewritten in place (it is replaced by a rename and removed by an unlink, which
leave a mapping of the old file whole), so reading a mapping cannot fault. On a disk an I/O
error would be a ``SIGBUS`` instead of an ``OSError``, so files there are read with ``read``.

A mapping is made with libc's ``mmap`` (Python's :class:`mmap.mmap` keeps a duplicate of the
file descriptor per mapping, one descriptor per cached sample) and unmapped when the last array
viewing it is gone. Each mapping is one of the process's ``vm.max_map_count`` areas:
:class:`FileMaps` keeps at most ``cap`` at once and answers None above it (the caller reads the
file instead).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import weakref

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MAX_MAPPINGS = 16384
"""Mappings a :class:`FileMaps` keeps by default: a quarter of Linux's default
``vm.max_map_count`` (65530), the rest left to the allocator and the libraries."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # the pages mapped at once: a sample is read whole
_ESCAPE = re.compile(r"\\([0-7]{3})")


def filesystem_type(path: str) -> str:
    """The type of the filesystem ``path`` is on (``/proc/self/mounts``, the longest mount
    point holding it), or "" when not known."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


class FileMaps:
    """Read-only mappings of whole files, at most ``cap`` alive at once. The count is kept by
    the thread that maps and the finalizers of the mappings (run where the last view dies).

    Attributes:
        live: mappings not yet unmapped.
    """

    def __init__(self, cap: int = MAX_MAPPINGS) -> None:
        self.cap = cap
        self.live = 0

    def map(self, fd: int, size: int) -> memoryview | None:
        """The ``size`` first bytes of the file open as ``fd``, mapped read-only and shared
        (unmapped once nothing views them), or None: ``cap`` mappings are alive, ``size`` is
        0, or the kernel refused."""
        if self.live >= self.cap or size <= 0:
            return None
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | _POPULATE, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            return None
        pages = (ctypes.c_char * size).from_address(addr)
        self.live += 1
        # Not at exit while arrays may still view it: the process's end unmaps it.
        weakref.finalize(pages, self._unmap, addr, size).atexit = False
        return memoryview(pages).cast("B").toreadonly()

    def _unmap(self, addr: int, size: int) -> None:
        _libc.munmap(addr, size)
        self.live -= 1
