"""The most memory a server's processes can come to hold, as a function of its flags.

The formula of docs/architecture.md (Server, **Memory**), as numbers: what the frontend and the
readers may hold beyond their sizes once ready (F0, R0: the index, the imports), whatever peers
send. Pure: the fuzz (``python -m dataflow.bench fuzz``) and the attack tests hold the peaks
they measure to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.heap import TRIM_BYTES
from dataflow.server.config import ServerConfig
from dataflow.server.guard import ZMTP_ALLOWANCE
from dataflow.server.worker import MAX_DATA_INBOUND_TOTAL

KiB = 1024
HELD_PER_BYTE = 33
"""libzmq's memory per byte received and not yet delivered (an empty frame: 2 bytes on the
wire, a 64-byte message in memory)."""
QUEUED_CONTROL_BYTES = 2 * KiB
"""Most bytes of one control message (ERRORs cut to 1 KiB) the frontend queues for a peer."""
QUEUED_DATA_BYTES = 1 * KiB
"""Most bytes of one answer (HEARTBEAT, ERROR) a reader queues on a data connection."""
RANGE_BYTES = 24
QUEUED_RANGE_BYTES = 48
"""A queued request's bytes per range: the int64 triple and numpy's copy of it."""
QUEUED_REQUEST_BYTES = 512
"""A queued request's bookkeeping besides its ranges."""
PLANNED_ROW_BYTES = 256
"""A reader's bytes per row of an announced window (:class:`~dataflow.server.eviction.
PlanAware`: the key, its place in the session's window and in the merged next uses)."""


@dataclass(frozen=True)
class MemoryBound:
    """Bytes a server's processes may hold beyond their sizes once ready.

    Attributes:
        frontend: the frontend process.
        readers: all reader processes together.
    """

    frontend: int
    readers: int


def memory_bound(config: ServerConfig) -> MemoryBound:
    """docs/architecture.md's bound of ``config``'s server (see the module docstring).

    With S sessions, C = ``config.max_connections`` connections per process, H messages queued
    for one peer (its send high-water mark), W readers of Q tasks queued, R bytes a reply:

    * frontend: 33 x (inbound total + C x 4 KiB) + C x H x 2 KiB + S x (48 B x the largest
      window or request of samples + H x (512 B + 48 B x P)) + W x Q x 24 B x
      (``max_request_samples`` + P), with P = ``cache_plan_window`` (each queued request's
      ``ahead``);
    * readers: unsent bytes + W x (Q + 1) x R + W x (33 x 1 MiB + C x H x 1 KiB) + the
      decoded-sample caches (``cache_memory``, shared equally) + W x S x 256 B x P (each
      reader's announced windows) + W x 128 MiB (the freed heap a reader keeps for its next
      batch, :mod:`~dataflow.heap`).
    """
    s, c, h = config.max_sessions, config.max_connections, config.peer_queue
    w, q = config.workers, config.worker_queue
    plan = config.cache_plan_window
    frontend = (HELD_PER_BYTE * (config.max_inbound_total + c * ZMTP_ALLOWANCE)
                + c * h * QUEUED_CONTROL_BYTES
                + s * (QUEUED_RANGE_BYTES * max(config.max_window_samples,
                                                config.max_request_samples)
                       + h * (QUEUED_REQUEST_BYTES + QUEUED_RANGE_BYTES * plan))
                + w * q * RANGE_BYTES * (config.max_request_samples + plan))
    readers = (config.max_unsent_bytes + w * (q + 1) * config.max_reply_bytes
               + w * (HELD_PER_BYTE * MAX_DATA_INBOUND_TOTAL + c * h * QUEUED_DATA_BYTES)
               + w * config.reader_cache_memory + w * s * PLANNED_ROW_BYTES * plan
               + w * TRIM_BYTES)
    return MemoryBound(frontend, readers)
