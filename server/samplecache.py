"""A reader process's cache of decoded samples: the output of a
:class:`~dataflow.transform.Stages` transform's ``decode`` stage, per sample.

Every session a reader serves shares it: the ranks of a job, its epochs, and other jobs on the
same data whatever their seed, batch size or world size, since an entry is one sample's decoded
columns, keyed by where the sample is (shard, row) and which decode made it. A reader serves one
dataset index and one transform, so in memory the key is ``(shard number, row)``: the shard's
identity (:attr:`~dataflow.index.DatasetIndex.identities`) and the decode stage's identity
(:attr:`~dataflow.transform.Stages.identity`) are the same for every entry of one reader.

Bounded in bytes, never over: an entry's size is :func:`sample_bytes` (its arrays' bytes plus a
fixed allowance for the objects holding them); entries are evicted before an insert would pass
the bound, as its eviction policy says (:mod:`~dataflow.server.eviction`: least recently used,
or plan-aware over the windows the sessions announce, when the new entry itself may be the one
not kept), and an entry larger than the bound is not cached. With
a disk tier (:class:`~dataflow.server.diskcache.DiskTier`, its own bound, shared with the
server's other readers) every new entry is also written there, and a sample found there (this
reader's file or a sibling's) is kept in memory again; on a memory filesystem an entry in memory
is the mapping of its file, the same pages (:mod:`~dataflow.server.filemap`). Without one it is
pure (no I/O, no clock); not thread-safe (one per reader process, used by its one thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dataflow.batch import Batch, Ragged
from dataflow.errors import ConfigError, TransformError
from dataflow.server.eviction import Recency

if TYPE_CHECKING:
    from dataflow.server.diskcache import DiskTier

ENTRY_OVERHEAD = 256
"""Bytes allowed for one entry's key, tuple and dictionary slot."""
FIELD_OVERHEAD = 160
"""Bytes allowed for one field of an entry: its numpy array object and name."""

Field = tuple[str, np.ndarray, str | None]
"""One field of one sample: its name, its values (a fixed field: an array of shape
``(1, *shape)``; a ragged one: the sample's 1-D values) and its ragged kind (None: fixed)."""
Sample = tuple[Field, ...]
"""One sample's decoded columns, in the decode stage's field order."""
Key = tuple[int, int]
"""``(shard number, row)`` of a sample."""


def rows_of(ranges: np.ndarray) -> Iterator[Key]:
    """The ``(shard, row)`` keys of int64 ``(shard, start, stop)`` ``ranges``, in order."""
    for shard, start, stop in ranges.tolist():
        for row in range(start, stop):
            yield shard, row


def sample_bytes(sample: Sample) -> int:
    """What an entry counts against the bound: its arrays' bytes and the fixed allowances."""
    return ENTRY_OVERHEAD + sum(FIELD_OVERHEAD + values.nbytes for _, values, _ in sample)


def split(batch: Batch, copy: bool = True) -> list[Sample]:
    """``batch`` cut into its samples, each field's values copied (an entry never holds a view
    that keeps a whole batch alive), or views of ``batch`` (``copy=False``: to give
    :meth:`SampleCache.put`, which keeps copies)."""
    n = len(next(iter(batch.values()))) if batch else 0
    out: list[list[Field]] = [[] for _ in range(n)]
    for name, col in batch.items():
        if isinstance(col, Ragged):
            offsets = col.offsets
            for i in range(n):
                values = col.values[offsets[i]:offsets[i + 1]]
                out[i].append((name, values.copy() if copy else values, col.kind))
        else:
            for i in range(n):
                out[i].append((name, col[i:i + 1].copy() if copy else col[i:i + 1], None))
    return [tuple(fields) for fields in out]


def copied(sample: Sample) -> Sample:
    """``sample`` with its arrays copied."""
    return tuple((name, values.copy(), kind) for name, values, kind in sample)


def assemble(samples: Sequence[Sample], where: str) -> Batch:
    """The batch of ``samples`` in order (the inverse of :func:`split`).

    Raises:
        TransformError: the samples do not agree on their fields, kinds, dtypes or per-sample
            shapes (a decode stage whose output depends on the batch it was given, e.g.
            padded to the batch's longest); the message starts with ``where``.
    """
    first = samples[0]
    for sample in samples[1:]:
        if len(sample) != len(first) or any(
                a[0] != b[0] or a[2] != b[2] or a[1].dtype != b[1].dtype
                or (a[2] is None and a[1].shape != b[1].shape)
                for a, b in zip(sample, first, strict=True)):
            raise TransformError(
                f"{where}: the decode stage gave samples of different fields, dtypes or shapes "
                f"({_describe(first)} and {_describe(sample)}); it must decode each sample "
                "alone, the same whatever batch it is in (no padding to the batch's longest)")
    batch: Batch = {}
    for j, (name, values, kind) in enumerate(first):
        parts = [sample[j][1] for sample in samples]
        if kind is None:
            batch[name] = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
            continue
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        joined = np.concatenate(parts) if parts else values[:0]
        batch[name] = Ragged(joined, offsets, kind)
    return batch


def _describe(sample: Sample) -> str:
    return "{" + ", ".join(f"{name}: {values.dtype}{list(values.shape[1:]) if kind is None else ''}"
                           f"{'' if kind is None else ' ' + kind}"
                           for name, values, kind in sample) + "}"


@dataclass(frozen=True)
class CacheCounts:
    """A cache's counters.

    Attributes:
        hits: lookups that found their sample in memory.
        misses: lookups that found it nowhere.
        evictions: entries evicted from memory to make room.
        bytes: bytes held in memory now (:func:`sample_bytes` of every entry).
        entries: entries held in memory now.
        disk_hits: lookups that found their sample in the disk tier (this reader's files or
            a sibling's).
        disk_evictions: files removed from the disk tier to make room.
        disk_bytes: bytes of the disk tier's files now.
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    disk_hits: int = 0
    disk_evictions: int = 0
    disk_bytes: int = 0


class SampleCache:
    """Decoded samples, at most ``bound`` bytes in memory, evicted as ``policy`` says (None:
    least recently used), over an optional ``disk`` tier (see the module docstring).

    Raises:
        ConfigError: ``bound`` is not a positive integer.
    """

    def __init__(self, bound: int, disk: DiskTier | None = None,
                 policy: Recency[Key] | None = None) -> None:
        if not isinstance(bound, int) or bound < 1:
            raise ConfigError(f"`cache_memory` must be a positive number of bytes. Found: "
                              f"{bound!r}")
        self.bound = bound
        self.disk = disk
        self.policy: Recency[Key] = policy if policy is not None else Recency()
        self._entries: dict[Key, tuple[Sample, int]] = {}
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Sample | None:
        """The sample of ``key`` (now the most recently used), or None; counted."""
        entry = self._entries.get(key)
        if entry is not None:
            self._hits += 1
            self.policy.used(key)
            return entry[0]
        sample = self.disk.get(key) if self.disk is not None else None
        if sample is None:
            self._misses += 1
            return None
        self._insert(key, sample)
        return sample

    def put(self, key: Key, sample: Sample) -> bool:
        """Cache ``sample`` under ``key`` (and write it to the disk tier, if any), evicting
        entries first so the bound holds (the policy may choose ``key`` itself); an entry
        larger than the bound is not kept in memory. Memory keeps the mapping of the file just
        written when the tier maps its files (:meth:`DiskTier.mapped`), else a copy:
        ``sample`` may view a larger batch.

        Returns:
            Whether it is cached (in either tier).
        """
        written = self.disk is not None and self.disk.put(key, sample)
        held = self.disk.mapped(key) if written and self.disk is not None else None
        kept = self._insert(key, held if held is not None else copied(sample))
        return kept or written

    def _insert(self, key: Key, sample: Sample) -> bool:
        """Keep ``sample`` in memory, evicting as needed; False: larger than the bound, or the
        policy's victim itself."""
        size = sample_bytes(sample)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
            self.policy.forget(key)
        if size > self.bound:
            return False
        self._entries[key] = (sample, size)
        self._bytes += size
        self.policy.used(key)
        while self._bytes > self.bound:
            victim = self.policy.victim()
            self.policy.forget(victim)
            self._bytes -= self._entries.pop(victim)[1]
            if victim == key:
                return False
            self._evictions += 1
        return True

    def counts(self) -> CacheCounts:
        disk = self.disk
        return CacheCounts(self._hits, self._misses, self._evictions, self._bytes,
                           len(self._entries), disk.hits if disk else 0,
                           disk.evictions if disk else 0, disk.bytes if disk else 0)

    def close(self) -> None:
        """Remove the disk tier's files, if any (idempotent)."""
        if self.disk is not None:
            self.disk.close()
