"""Reading the ``(shard, start, stop)`` ranges of one request into one batch.

A sample-level shuffle asks for hundreds of one-sample ranges per batch, from as many shards.
:func:`read_ranges` hands every run of consecutive ranges of one shard to that shard's
:meth:`~dataflow.readers.ShardReader.read_many`, which gathers them in one pass, instead of
reading range by range. A batch of a few rows from each of many shards is gathered row by
row across them in one pass (:mod:`dataflow.readers.across`), paying per shard only the
checks that it did not change; any other batch spanning several shards is read shard by
shard, each writing its rows straight into the batch's columns (:mod:`dataflow.readers.sink`),
so every row is copied once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dataflow.batch import Batch, batch_len
from dataflow.errors import ConfigError, DataflowError, InternalError
from dataflow.readers.across import read_across
from dataflow.readers.base import ShardReader
from dataflow.readers.sink import BatchSink

if TYPE_CHECKING:
    from dataflow.readers.book import AddressBook

MAX_NAMED_RANGES = 4


def describe_ranges(starts: np.ndarray, stops: np.ndarray) -> str:
    """``"samples [a, b), [c, d) and 254 more ranges"``: the first few ranges, for messages."""
    named = ", ".join(
        f"[{a}, {b})" for a, b in zip(starts[:MAX_NAMED_RANGES].tolist(),
                                      stops[:MAX_NAMED_RANGES].tolist(), strict=True)
    )
    more = len(starts) - MAX_NAMED_RANGES
    return f"samples {named}" + (f" and {more} more ranges" if more > 0 else "")


def joined_ranges(ranges: np.ndarray) -> np.ndarray:
    """``ranges`` (int64 ``(shard, start, stop)`` rows) with every run of rows that continue one
    another (the same shard, each starting where the one before stops, none of them reversed)
    as one row: the same rows of the same shards in the same order, fewer ranges. The runs of
    batches a request carries (``parts``) are then one read: a slice of a shard's map where one
    record batch holds them, instead of a gather copying each row.
    """
    if len(ranges) < 2:
        return ranges
    shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    forward = start <= stop
    joins = ((shard[1:] == shard[:-1]) & (start[1:] == stop[:-1])
             & forward[1:] & forward[:-1])
    if not joins.any():
        return ranges
    firsts = np.flatnonzero(np.concatenate(([True], ~joins)))
    lasts = np.append(firsts[1:], len(ranges)) - 1
    return np.stack([shard[firsts], start[firsts], stop[lasts]], axis=1)


def read_ranges(get_reader: Callable[[int], ShardReader], ranges: np.ndarray,
                get_many: Callable[[list[int]], list[ShardReader]] | None = None,
                book: AddressBook | None = None) -> Batch:
    """Read rows ``(shard, start, stop)`` of ``ranges`` into one batch.

    The result equals concatenating ``get_reader(shard).read(start, stop)`` over the rows of
    ``ranges`` in order. A request of a few rows from each of many shards is gathered across
    them (:func:`~dataflow.readers.across.read_across`) where its readers take part;
    otherwise each run of consecutive rows naming the same shard is one
    :meth:`~dataflow.readers.ShardReader.read_many` call, so requests sorted by shard read
    each shard once.

    Args:
        get_reader: the open reader of a shard, by shard number.
        ranges: int64 of shape ``(n, 3)``, ``n > 0``: ``(shard, start, stop)`` per row.
        get_many: the open readers of a list of distinct shards, in order, for a gather
            across shards (see :func:`~dataflow.readers.across.read_across`), where that is
            cheaper than one call of ``get_reader`` each.
        book: the standing addresses of the shards, for that gather (see
            :func:`~dataflow.readers.across.read_across`).

    Raises:
        ConfigError: ``ranges`` is empty or not of shape ``(n, 3)``.
        InternalError: a reader raised anything but a ``DataflowError`` (a bug: a reader
            raises damage as ``ShardReadError``), naming the shard and its ranges; the
            readers' own errors pass through.
    """
    ranges = np.asarray(ranges, dtype=np.int64)
    if ranges.ndim != 2 or ranges.shape[1] != 3 or len(ranges) == 0:
        raise ConfigError(f"ranges must be a non-empty (n, 3) array. Found: shape "
                          f"{ranges.shape}")
    if len(ranges) == 1:
        return _read_run(get_reader, ranges, None)
    shards = ranges[:, 0]
    cuts = [0, *(np.flatnonzero(shards[1:] != shards[:-1]) + 1).tolist(), len(ranges)]
    if len(cuts) == 2:
        return _read_run(get_reader, ranges, None)
    across = read_across(get_reader, ranges, get_many, book)
    if across is not None:
        return across
    sink = BatchSink(int(np.maximum(ranges[:, 2] - ranges[:, 1], 0).sum()))
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        part = _read_run(get_reader, ranges[lo:hi], sink)
        sink.advance(batch_len(part))
        parts.append(part)
    return sink.batch(parts)


def _read_run(get_reader: Callable[[int], ShardReader], ranges: np.ndarray,
              sink: BatchSink | None) -> Batch:
    """The rows of ``ranges`` (all of one shard) with one ``read_many`` (see
    :func:`read_ranges`)."""
    reader = get_reader(int(ranges[0, 0]))
    starts, stops = ranges[:, 1], ranges[:, 2]
    try:
        return reader.read_many(starts, stops, sink)
    except DataflowError:
        raise
    except Exception as e:
        raise InternalError(f"{reader.url}: reading {describe_ranges(starts, stops)} "
                            f"failed: {type(e).__name__}: {e}") from e
