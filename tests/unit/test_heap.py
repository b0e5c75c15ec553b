"""A process keeps a batch's freed memory for the next batch (:mod:`dataflow.heap`): a reader's
main heap, and with a top pad a trainer's thread heaps (where ZeroMQ's I/O thread receives),
checked in fresh processes by their page faults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from heapfaults import RECEIVING_THREAD

from dataflow.heap import MMAP_THRESHOLD_MAX, THREAD_HEAP_BYTES

THREADED = """
import json, sys
from dataflow.heap import THREAD_HEAP_BYTES, keep_freed_memory

kept = keep_freed_memory(top_pad=THREAD_HEAP_BYTES) if sys.argv[1] == "kept" else None
""" + RECEIVING_THREAD + """
print(json.dumps({"kept": kept, "faults": faults}))
"""

SCRIPT = """
import json, resource, sys
import numpy as np
from dataflow.heap import keep_freed_memory

kept = keep_freed_memory() if sys.argv[1] == "kept" else None
size = int(sys.argv[2])
faults = []
for _ in range(3):  # a batch's array, written, freed; three batches
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(size, np.uint8)
    a.fill(1)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def _faults(mode: str, size: int, script: str = SCRIPT) -> dict:
    out = subprocess.run([sys.executable, "-c", script, mode,
                          str(size)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_batch_memory_is_used_again_without_new_page_faults() -> None:
    size = 24 * 2**20  # a batch's array: 6,144 pages of 4 KiB
    default, kept = _faults("default", size), _faults("kept", size)
    assert kept["kept"] is True
    # By default glibc maps the first batch's block alone and unmaps it when freed: the second
    # batch faults new pages in. Kept, the second and third batches use the first's pages.
    # (More than 8 faults even where transparent huge pages back the block: 12 of 2 MiB.)
    assert default["faults"][1] > 8 >= max(kept["faults"][1:])
    assert size < MMAP_THRESHOLD_MAX


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_threads_heaps_stay_mapped_with_a_top_pad() -> None:
    default, kept = _faults("default", 0, THREADED), _faults("kept", 0, THREADED)
    assert kept["kept"] is True
    # By default a thread's heaps (64 MiB at most: three 19 MB blocks) are unmapped as they
    # empty, and the next four blocks fault pages in again (more than 8 faults even where
    # transparent huge pages back them: 36 of 2 MiB); padded, they stay mapped.
    assert min(default["faults"][1:]) > 8 >= max(kept["faults"][1:])
    assert 3 * 19 * 2**20 < THREAD_HEAP_BYTES < 4 * 19 * 2**20
