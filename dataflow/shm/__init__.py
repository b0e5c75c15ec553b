"""Shared memory between a trainer client and a loader server on the same host.

* :mod:`~dataflow.shm.segment`: the segment file in ``/dev/shm`` (created, mapped, proved,
  cleaned up after a crash);
* :mod:`~dataflow.shm.slots`: :class:`SlotLedger`, which slots are lent, read or free, and the
  check of a BATCH's descriptor against them (pure).

This package never imports torch.
"""

from dataflow.shm.segment import (
    HEADER_BYTES,
    SHM_DIR,
    Geometry,
    Mapped,
    Segment,
    SegmentError,
    is_segment_name,
    read_proof,
    remove_stale,
)
from dataflow.shm.slots import SlotLedger

__all__ = ["HEADER_BYTES", "SHM_DIR", "Geometry", "Mapped", "Segment", "SegmentError",
           "SlotLedger", "is_segment_name", "read_proof", "remove_stale"]
