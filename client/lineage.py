"""Where each sample of a batch came from: its source, shard and row (``lineage=True``).

A loader knows every batch's ranges from its plan, so it can say, for each sample of a batch,
the source it came from, the shard (named as the servers' INDEX names it: relative to the
dataset root) and the row in that shard. With ``lineage=True`` a DataLoader or MixtureLoader
adds three int64 CPU tensors of shape ``(batch,)`` to every batch (:data:`FIELDS`): the source's
number, the shard's number in that source's index, the row; ``loader.lineage(batch)`` turns
them into :class:`Origin` values. Off (the default), nothing of this runs.

Samples a server left out as damaged (``--on-error skip``) are not in the batch, and the BATCH
says which they were (its ``left_out``): the lineage is of the samples the batch holds. Where a
server did not say which (the damage read otherwise when read again), shard and row are -1 for
every sample of that batch's part. In a shard the index left samples out of when it was built
(its ``skipped``), the rows after them shifted by an unrecorded amount: rows are -1 there
(:func:`renumbered`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from dataflow.errors import ConfigError

SOURCE = "lineage.source"
SHARD = "lineage.shard"
ROW = "lineage.row"
FIELDS = (SOURCE, SHARD, ROW)


class Origin(NamedTuple):
    """Where one sample came from: ``source`` (its name), ``shard`` (as the source's INDEX
    names it; ``""`` when not known) and ``row`` in that shard (-1 when not known)."""

    source: str
    shard: str
    row: int


def renumbered(skipped: Sequence[int]) -> np.ndarray | None:
    """Per shard of an index whose ``skipped`` counts are these, whether its samples are
    numbered apart from the file's rows (the index left damaged samples out, so the rows after
    them shifted, and where is not known); None: no shard."""
    flags = np.asarray(skipped, dtype=np.int64) > 0
    return flags if flags.any() else None


def sample_rows(rows: np.ndarray, *, copies: np.ndarray | None = None,
                left_out: tuple[int, ...] | None = (),
                unknown: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The shard and row of each sample a batch of ``rows`` holds, in the batch's order.

    Args:
        rows: int64 of shape ``(ranges, 3)``: ``(shard, start, stop)``, as requested.
        copies: how many times each sample the rows name is in the batch (None: once).
        left_out: positions of the samples the rows name that the server left out; None:
            some were and it is not known which (every shard and row is then -1).
        unknown: per shard, whether its rows are not the file's (:func:`renumbered`): their
            rows are -1.

    Returns:
        Two int64 arrays of shape ``(samples,)``: shard numbers and rows.
    """
    lengths = rows[:, 2] - rows[:, 1]
    shard = np.repeat(rows[:, 0], lengths)
    heads = np.cumsum(lengths) - lengths
    row = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(rows[:, 1] - heads, lengths)
    keep = np.ones(len(row), dtype=bool)
    if left_out:
        keep[list(left_out)] = False
    if copies is not None:
        copies = copies[keep]
    shard, row = shard[keep], row[keep]
    if copies is not None:
        shard, row = np.repeat(shard, copies), np.repeat(row, copies)
    if left_out is None:
        shard, row = np.full_like(shard, -1), np.full_like(row, -1)
    elif unknown is not None:
        row = np.where(unknown[shard], -1, row)
    return shard, row


def fields(source: int, shard: np.ndarray, row: np.ndarray,
           samples: int | None = None) -> dict[str, torch.Tensor]:
    """The lineage fields of one batch (or one source's part of it): int64 CPU tensors.

    Args:
        samples: the samples the part holds, when ``shard`` and ``row`` are not known (-1
            each): they are then that many.
    """
    if samples is not None and samples != len(shard):
        shard = row = np.full(samples, -1, dtype=np.int64)
    return {SOURCE: torch.full((len(shard),), source, dtype=torch.int64),
            SHARD: torch.from_numpy(np.ascontiguousarray(shard, dtype=np.int64)),
            ROW: torch.from_numpy(np.ascontiguousarray(row, dtype=np.int64))}


def attach(batch: Mapping[str, torch.Tensor],
           lineage: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with its lineage fields.

    Raises:
        ConfigError: the batch has a field of that name already (a server ``--transform``
            made one), naming it.
    """
    if SOURCE in batch or SHARD in batch or ROW in batch:
        taken = next(n for n in FIELDS if n in batch)
        raise ConfigError(f"`lineage` adds fields {list(FIELDS)}, but a batch has a field "
                          f"{taken!r} already (a server --transform made it?); rename it or "
                          "leave lineage off")
    return {**batch, **lineage}


def check_free(names: Sequence[str], what: str) -> None:
    """Refuse lineage where a field of the data already has one of its names.

    Raises:
        ConfigError: naming the field and ``what`` serves it.
    """
    taken = [n for n in names if n in FIELDS or n.startswith("lineage.")]
    if taken:
        raise ConfigError(f"`lineage` adds fields {list(FIELDS)}, but {what} serves a field "
                          f"{taken[0]!r}; rename it (a server --transform) or leave lineage off")


class Names:
    """Turns a batch's lineage fields into :class:`Origin` values.

    Args:
        sources: per source number, its name and its shards' names.
    """

    def __init__(self, sources: Sequence[tuple[str, Sequence[str]]]) -> None:
        self._sources = [(name, list(shards)) for name, shards in sources]

    def __call__(self, batch: Mapping[str, object]) -> list[Origin]:
        """The origin of every sample of ``batch``, in order.

        Raises:
            ConfigError: ``batch`` has no lineage fields (naming them): the loader was made
                without ``lineage=True``, or a ``collate_fn`` dropped them.
        """
        missing = [n for n in FIELDS if n not in batch]
        if missing:
            raise ConfigError(f"the batch has no lineage fields {missing} (make the loader "
                              f"with lineage=True; a collate_fn must keep them). It holds "
                              f"{sorted(batch)}"[:600])
        source, shard, row = (torch.as_tensor(batch[n]).tolist() for n in FIELDS)
        out = []
        for k, s, r in zip(source, shard, row, strict=True):
            name, shards = self._sources[k]
            out.append(Origin(name, shards[s] if s >= 0 else "", r))
        return out
