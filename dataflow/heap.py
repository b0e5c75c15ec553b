"""Freed large buffers kept for the next ones: a process's glibc ``malloc`` settings.

A batch's arrays, and every message ZeroMQ receives, are megabytes (64 decoded 256x256 images:
12.6 MB; 128 images of 3x224x224: 19 MB). glibc's ``malloc`` serves a block above its mmap
threshold with a mapping of its own, unmapped when freed (the threshold starts at 128 KiB and
rises, up to 32 MiB, to the size of such a block once freed), gives the free memory at the top
of its main heap back to the kernel past its trim threshold (twice the mmap threshold), and
unmaps a thread's heap (64 MiB at most) once it is empty. Each way the next buffer lands on
pages the kernel must fault in and zero again:

* in a reader, the cache's 4-job sweep (``python -m dataflow.bench.experiments.cache --parts
  sweep``): about two thirds of the readers' page faults, a quarter of their CPU time in the
  kernel;
* in the trainer, ZeroMQ's I/O thread (a thread heap) receiving 19 MB batches: ~1,100 page
  faults a batch, taken while the kernel copies the socket's data in (bench/RESULTS.md, "Page
  faults in the receive").

:func:`keep_freed_memory` fixes the mmap threshold at glibc's most, 32 MiB, and the trim
threshold at :data:`TRIM_BYTES`: blocks up to 32 MiB come from a heap, and freed ones are used
again. With ``top_pad`` a heap also grows that much at once and is not given back while its
top is free: with :data:`THREAD_HEAP_BYTES`, a thread's heaps stay mapped. A process then keeps
up to :data:`TRIM_BYTES` of free memory at the top of its main heap, and its threads' heaps as
they grew; its peak is what it uses at once, as before. Larger blocks keep their own mappings.
The settings are process-wide. With another ``malloc`` (musl, a preloaded jemalloc) nothing
changes.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``)."""
TRIM_BYTES = 128 * 2**20
"""Free bytes at the top of the main heap kept rather than given back to the kernel."""
THREAD_HEAP_BYTES = 64 * 2**20
"""The most a thread's heap spans (glibc's ``HEAP_MAX_SIZE`` on 64-bit systems)."""


def keep_freed_memory(trim_bytes: int = TRIM_BYTES, top_pad: int = 0) -> bool:
    """Set this process's glibc ``malloc`` to keep freed blocks of up to 32 MiB for reuse (see
    the module docstring); ``top_pad`` > 0 also keeps its threads' heaps.

    Returns:
        Whether glibc took every setting (False: no glibc ``mallopt``, or it refused one).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = [(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, trim_bytes)]
    if top_pad:
        settings.append((M_TOP_PAD, top_pad))
    return all(mallopt(param, value) == 1 for param, value in settings)
