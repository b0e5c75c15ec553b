"""A remote tar's headers, fetched by exact ranged reads: enough to check a cached member
index (:func:`remote_problem`) and to read sample keys without fetching the tar."""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np

from dataflow.readers.tar.index import TarIndex
from dataflow.readers.tar.walk import BLOCK
from dataflow.storage.remotefile import RemoteBlob

REMOTE_VERIFY_HEADERS = 8
"""Sample headers checked when the cached index of a remote tar is loaded (a local tar's
check reads up to 64): each costs a ranged GET per shard at every start, and the index is
already tied to the shard's size and ETag or modification time."""


def remote_problem(index: TarIndex, probe: HeaderProbe) -> str | None:
    """:meth:`TarIndex.problem` for a remote tar: every field within the tar, and the headers
    of :data:`REMOTE_VERIFY_HEADERS` evenly spread samples (first and last included), fetched
    in parallel."""
    n = len(index)
    if n and (index.offsets.min() < 0 or (index.offsets + index.sizes).max() > len(probe)):
        return f"a field lies outside the tar's {len(probe)} bytes"
    picks = np.unique(np.linspace(0, max(n - 1, 0), min(n, REMOTE_VERIFY_HEADERS)).astype(
        np.int64))
    sampled = dataclasses.replace(index, offsets=index.offsets[picks],
                                  sizes=index.sizes[picks], ints=index.ints[picks],
                                  headers=index.headers[picks])
    probe.prefetch(sampled.headers)
    return sampled.problem(cast(bytes, probe))  # problem() takes only len() and slices


class HeaderProbe:
    """The length and slices of a remote tar, enough to check a cached index without
    fetching the tar: headers are fetched by exact ranged reads (from the block cache when it
    holds them)."""

    def __init__(self, blob: RemoteBlob) -> None:
        self._blob = blob
        self._got: dict[tuple[int, int], bytes] = {}

    def prefetch(self, headers: np.ndarray) -> None:
        """Fetch the tar header block at each of ``headers`` (byte offsets), in parallel."""
        spans = [(h, h + BLOCK) for h in headers.tolist()]
        got = self._blob.remote.pool.map(lambda s: self._blob.read_exact(*s), spans)
        self._got = dict(zip(spans, got, strict=True))

    def __len__(self) -> int:
        return self._blob.size

    def __getitem__(self, at: slice) -> bytes:
        start, stop, _ = at.indices(self._blob.size)
        found = self._got.get((start, stop))
        return found if found is not None else self._blob.read_exact(start, stop)
