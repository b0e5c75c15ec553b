"""A shard none of whose samples can be served, under ``on_error="skip"``."""

from __future__ import annotations

import numpy as np

from dataflow.batch import Batch, Schema
from dataflow.errors import ShardReadError
from dataflow.readers.base import ShardReader, empty_batch


class LostShard(ShardReader):
    """A shard that serves no sample, standing in for one that cannot be read as indexed.

    Two cases: a zero-byte file (``samples=0`` and no fields: a failed write, recorded as
    damage when the shard is opened), and a shard changed since the dataset index was built
    (the index's sample count and schema: every sample a read asks for is counted in
    ``skipped``, as damage found by a read is).
    """

    def __init__(self, url: str, schema: Schema, samples: int, err: ShardReadError) -> None:
        """Stand in for ``url``, lost to ``err`` (logged and recorded, with count 0)."""
        super().__init__(url, "skip")
        self.schema = schema
        self._samples = samples
        self._err = err
        self._damaged(err)

    def __len__(self) -> int:
        return self._samples

    def _read(self, start: int, stop: int) -> Batch:
        self._lose({0: stop - start}, {0: self._err})
        return empty_batch(self.schema)

    def _read_many(self, starts: np.ndarray, stops: np.ndarray) -> Batch:
        self._lose({0: int((stops - starts).sum())}, {0: self._err})
        return empty_batch(self.schema)

    def close(self) -> None:
        self.closed = True
