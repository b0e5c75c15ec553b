"""Rows of a shard: ranges as row indices, the chunks a range overlaps, and rows gathered by
index out of a shard's chunks (Arrow record batches, decoded row groups)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from dataflow.batch import Batch, Ragged, Schema
from dataflow.errors import InternalError
from dataflow.readers.sink import BatchSink


def take_rows(
    schema: Schema, chunk: Callable[[int], Batch], bounds: np.ndarray, rows: np.ndarray,
    sink: BatchSink | None = None,
) -> Batch:
    """The rows ``rows`` of a shard held in chunks, copied into one new batch.

    Rows are grouped by chunk (sorted, stably; nothing to do for ascending rows, the usual
    case); each fixed-size column is then filled with one ``np.take`` per touched chunk, and
    each ragged column with one ``np.concatenate`` of per-row views. Unsorted rows cost one
    more copy of the fixed-size columns, to put them back in order.

    Args:
        schema: the columns to gather.
        chunk: chunk ``i`` as a batch of ``schema`` (views are fine); called once per touched
            chunk, never for the others.
        bounds: int64 of shape ``(chunks + 1,)``: cumulative chunk lengths with a leading 0.
        rows: int64 of shape ``(n,)``, ``n > 0``: row indices in ``[0, bounds[-1])``, in any
            order, repeats allowed.
        sink: where the fixed-size columns go (rows ``[sink.at, sink.at + n)``), or None.

    Returns:
        A batch of ``n`` rows in the order of ``rows``; every array owns its memory (the
        fixed-size ones are ``sink``'s rows when there is a sink).
    """
    n = len(rows)
    ascending = bool((rows[1:] >= rows[:-1]).all())
    order = None if ascending else np.argsort(rows, kind="stable")
    grouped = rows if order is None else rows[order]
    which = np.searchsorted(bounds, grouped, side="right") - 1
    local = grouped - bounds[which]
    touched, firsts = np.unique(which, return_index=True)
    runs = [(int(i), int(lo), int(hi))
            for i, lo, hi in zip(touched, firsts, [*firsts[1:], n], strict=True)]
    parts = {i: chunk(i) for i, _, _ in runs}
    back = None
    if order is not None:
        back = np.empty(n, dtype=np.int64)
        back[order] = np.arange(n)
    out: Batch = {}
    for spec in schema:
        if spec.ragged is None:
            place = None if sink is None else sink.rows(spec.name, np.dtype(spec.dtype),
                                                         spec.shape, n)
            fixed = (place if place is not None and back is None
                     else np.empty((n, *spec.shape), dtype=spec.dtype))
            for i, lo, hi in runs:
                col = parts[i][spec.name]
                if isinstance(col, Ragged):
                    raise InternalError(f"field {spec.name!r}: chunk {i} is a ragged column")
                # Indices are in range by construction; mode="raise" would buffer ``out``.
                np.take(col, local[lo:hi], axis=0, out=fixed[lo:hi], mode="clip")
            if back is None:
                out[spec.name] = fixed
            elif place is None:
                out[spec.name] = fixed[back]
            else:
                out[spec.name] = np.take(fixed, back, axis=0, out=place)
        else:
            out[spec.name] = _ragged(spec.name, spec.ragged, parts, runs, local, back)
    return out


def _ragged(name: str, kind: str, parts: dict[int, Batch], runs: list[tuple[int, int, int]],
            local: np.ndarray, back: np.ndarray | None) -> Ragged:
    """Column ``name`` of rows ``local`` (grouped in ``runs`` of one chunk each), copied in
    the order ``back`` gives (``None``: as grouped)."""
    pieces = []
    for i, lo, hi in runs:
        col = parts[i][name]
        if not isinstance(col, Ragged):
            raise InternalError(f"field {name!r}: chunk {i} is not a ragged column")
        idx = local[lo:hi]
        starts, stops = col.offsets[idx].tolist(), col.offsets[idx + 1].tolist()
        pieces += [col.values[a:b] for a, b in zip(starts, stops, strict=True)]
    if back is not None:
        pieces = [pieces[k] for k in back.tolist()]
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return Ragged(np.concatenate(pieces), offsets, kind)


def range_rows(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The rows of ranges ``[starts[i], stops[i])`` back to back: int64 of shape
    ``(sum(stops - starts),)``, without a loop over the ranges."""
    lengths = stops - starts
    if (lengths == 1).all():  # a sample-level shuffle's ranges: one sample each
        return np.asarray(starts, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(
        starts - (ends - lengths), lengths
    )


def overlapping(bounds: Sequence[int], start: int, stop: int) -> range:
    """Indices of the chunks that overlap rows ``[start, stop)``.

    Args:
        bounds: cumulative chunk lengths with a leading 0, shape ``(chunks + 1,)``.
        start: first row.
        stop: one past the last row; ``stop > start``.
    """
    first = bisect.bisect_right(bounds, start) - 1
    last = bisect.bisect_left(bounds, stop) - 1
    return range(first, last + 1)
