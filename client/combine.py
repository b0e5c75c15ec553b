"""Batches of tensors put together: a mixture's parts into one batch, and a part's samples
repeated. Both copy (on the batches' device); the field rules are the DataLoader's: a field
``x`` with an ``x.offsets`` is ragged (values back to back, offsets ``(n + 1,)`` from 0), any
other field has the samples along its first dimension.

CPU tensors are copied by numpy, in the calling thread: ``torch.cat`` spreads a copy of a few
MiB over torch's intra-op threads, which on a busy 2-core machine took 25-37 ms where numpy's
one memcpy took 0.7 ms (256 3x64x64 images; bench/RESULTS.md, "Mixtures and lineage").
Pinned parts make a pinned batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dataflow.errors import SchemaMismatchError
from dataflow.wire import OFFSETS_SUFFIX

Tensors = Mapping[str, torch.Tensor]


def samples(batch: Tensors) -> int:
    """The samples a batch holds (from a ragged field's offsets, else any field's rows; 0 for
    a batch of no field)."""
    for name, t in batch.items():
        if name.endswith(OFFSETS_SUFFIX):
            return len(t) - 1
    return next((len(t) for t in batch.values()), 0)


def _cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors one after the other along the first dimension (a new tensor)."""
    if any(t.device.type != "cpu" for t in tensors):
        return torch.cat(list(tensors))
    first = tensors[0]
    out = torch.empty((sum(len(t) for t in tensors), *first.shape[1:]), dtype=first.dtype,
                      pin_memory=first.is_pinned())
    np.concatenate([t.numpy() for t in tensors], out=out.numpy())
    return out


def _take(t: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Rows ``index`` (int64) of ``t`` (a new tensor)."""
    if t.device.type != "cpu":
        return t.index_select(0, torch.from_numpy(index).to(t.device))
    return torch.from_numpy(np.take(t.numpy(), index, axis=0))


def _ragged(batch: Tensors) -> set[str]:
    return {n for n in batch if n + OFFSETS_SUFFIX in batch}


def signature(batch: Tensors) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """Each field's dtype and per-sample shape (None for a ragged field's values)."""
    ragged = _ragged(batch)
    return {n: (str(t.dtype).removeprefix("torch."), None if n in ragged else tuple(t.shape[1:]))
            for n, t in batch.items()}


def repeat(batch: Tensors, index: np.ndarray) -> dict[str, torch.Tensor]:
    """The samples ``index`` names (int64), in that order, repeats included: a new batch on
    the batch's device (a device batch's ragged offsets are read back to the host)."""
    ragged = _ragged(batch)
    out: dict[str, torch.Tensor] = {}
    for name, t in batch.items():
        if name.endswith(OFFSETS_SUFFIX) and name.removesuffix(OFFSETS_SUFFIX) in ragged:
            continue
        if name not in ragged:
            out[name] = _take(t, index)
            continue
        offsets = batch[name + OFFSETS_SUFFIX]
        host = offsets.cpu().numpy()
        starts, lengths = host[:-1][index], np.diff(host)[index]
        new = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new[1:])
        values = np.repeat(starts - new[:-1], lengths) + np.arange(new[-1], dtype=np.int64)
        out[name] = _take(t, values)
        out[name + OFFSETS_SUFFIX] = torch.from_numpy(new).to(offsets.device)
    return out


def concat(parts: Sequence[tuple[str, Tensors]]) -> dict[str, torch.Tensor]:
    """One batch of the parts' samples, part after part (a new batch; one part: itself).

    Args:
        parts: ``(source name, batch)`` pairs, every batch with the same fields of the same
            dtypes and per-sample shapes.

    Raises:
        SchemaMismatchError: two parts' fields differ, naming both sources and the field.
    """
    if len(parts) == 1:
        return dict(parts[0][1])
    first_name, first = parts[0]
    want = signature(first)
    for name, batch in parts[1:]:
        got = signature(batch)
        if got != want:
            field = next(f for f in sorted(set(want) | set(got)) if want.get(f) != got.get(f))
            raise SchemaMismatchError(
                f"source {first_name!r}", f"source {name!r}", field,
                f"{_kind(want.get(field))} vs {_kind(got.get(field))}; give each Source "
                "`columns` naming the fields they share (of the same types), or use "
                "combine='sources'")
    ragged = _ragged(first)
    out: dict[str, torch.Tensor] = {}
    for name in first:
        if name.endswith(OFFSETS_SUFFIX) and name.removesuffix(OFFSETS_SUFFIX) in ragged:
            offsets = [p[name] for _, p in parts]
            shifted = [offsets[0]]
            base = offsets[0][-1:]
            for o in offsets[1:]:
                shifted.append(o[1:] + base)
                base = base + o[-1:]
            out[name] = torch.cat(shifted)
        else:
            out[name] = _cat([p[name] for _, p in parts])
    return out


def _kind(sig: tuple[str, tuple[int, ...] | None] | None) -> str:
    if sig is None:
        return "missing"
    dtype, shape = sig
    return f"ragged {dtype}" if shape is None else f"{dtype} {list(shape)}"
