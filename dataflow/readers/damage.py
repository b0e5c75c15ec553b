"""What a reader does with damage: the ``on_error`` policy, and the record of what it lost.

Under ``on_error="raise"`` damage raises :class:`~dataflow.errors.ShardReadError`; under
``"skip"`` the samples it loses are left out, counted in a reader's ``skipped`` and described
by a :class:`SkipRecord`. A damaged unit (a Parquet row group, an Arrow record batch) loses
every row a read asks of it: :func:`split_damaged` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dataflow.errors import ConfigError, ShardReadError

ON_ERROR = ("raise", "skip")
MAX_SKIP_LOG = 1000
"""Most :class:`SkipRecord` a reader keeps (the latest ones)."""


@dataclass(frozen=True)
class SkipRecord:
    """Samples of one shard not served because of damage (``on_error="skip"``).

    Attributes:
        shard: the shard's URL or path.
        index: the first sample of the damaged unit (a Parquet row group, an Arrow record
            batch: its row in the reader; a tar sample: its position among the tar's samples,
            dropped ones included); ``None`` if unknown (damage between tar members).
        offset: byte offset of the damage (of the decompressed tar for a gzipped one), when
            known.
        count: samples not served because of it: by one read (Parquet, Arrow), or dropped
            from the shard when it was indexed (tar). 0 when the damage lost nothing that can
            be counted (see the message).
        message: what is wrong, naming the shard and the sample and/or byte offset.
    """

    shard: str
    index: int | None
    offset: int | None
    count: int
    message: str

    @classmethod
    def of(cls, err: ShardReadError, count: int) -> SkipRecord:
        """The record of ``count`` samples lost to the damage ``err`` describes."""
        return cls(err.shard, err.index, err.offset, count, str(err))


def check_on_error(on_error: str) -> str:
    """Validate an ``on_error`` policy.

    Raises:
        ConfigError: ``on_error`` is not ``"raise"`` or ``"skip"``.
    """
    if on_error not in ON_ERROR:
        raise ConfigError(f"`on_error` must be one of {ON_ERROR}. Found: {on_error!r}")
    return on_error


def split_damaged(rows: np.ndarray, bounds: np.ndarray,
                  damaged: Mapping[int, object]) -> tuple[np.ndarray, dict[int, int]]:
    """The rows outside damaged units, and how many rows fell in each damaged unit.

    Args:
        rows: int64 of shape ``(n,)``: rows of the shard, any order, repeats allowed.
        bounds: int64 of shape ``(units + 1,)``: cumulative unit lengths with a leading 0.
        damaged: the damaged units (keys).

    Returns:
        ``rows`` without those in damaged units (order kept), and ``{unit: rows lost}`` for
        every damaged unit that held some of ``rows``.
    """
    if not damaged:
        return rows, {}
    unit = np.searchsorted(bounds, rows, side="right") - 1
    bad = np.isin(unit, np.fromiter(damaged, dtype=np.int64, count=len(damaged)))
    units, counts = np.unique(unit[bad], return_counts=True)
    return rows[~bad], dict(zip(units.tolist(), counts.tolist(), strict=True))
