"""A reader's heap: the memory of a batch's freed arrays kept for the next batch's (glibc).

A batch's arrays are megabytes (64 decoded 256x256 images: 12.6 MB). glibc's ``malloc`` serves
a block above its mmap threshold with a mapping of its own, unmapped when freed (the threshold
starts at 128 KiB and rises, up to 32 MiB, to the size of such a block once freed), and gives
the free memory at the top of its heap back to the kernel past its trim threshold (twice the
mmap threshold). Either way the next batch's arrays land on pages the kernel must fault in and
zero again: in the cache's 4-job sweep (``python -m dataflow.bench.experiments.cache --parts
sweep``) about two thirds of the readers' page faults, a quarter of their CPU time in the kernel.

:func:`keep_freed_memory` fixes the mmap threshold at glibc's most, 32 MiB, and the trim
threshold at :data:`TRIM_BYTES`: blocks up to 32 MiB come from the heap, and freed ones are
used again. A reader then keeps up to :data:`TRIM_BYTES` of free memory at the top of its heap
between batches; its peak is what its batches use at once, as before. Larger blocks keep their
own mappings. With another ``malloc`` (musl, a preloaded jemalloc) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``)."""
TRIM_BYTES = 128 * 2**20
"""Free bytes at the top of the heap a reader keeps rather than give back to the kernel."""


def keep_freed_memory(trim_bytes: int = TRIM_BYTES) -> bool:
    """Set this process's glibc ``malloc`` to keep freed blocks of up to 32 MiB for reuse (see
    the module docstring).

    Returns:
        Whether glibc took both settings (False: no glibc ``mallopt``, or it refused one).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                and mallopt(M_TRIM_THRESHOLD, trim_bytes))
