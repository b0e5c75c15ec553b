"""A BATCH that carries several batches (a REQUEST's ``parts``) cut into one per batch.

Every batch is a set of views of the message's tensors (no copy, on the CPU as on a device).
From whole arrays (:func:`split`): fixed fields by rows, ragged values by the bounds
:meth:`dataflow.wire.BatchLayout.check_frames` read from the host's copy of the offsets (so a
device batch needs no synchronization), and ragged offsets by each batch's own ``n + 1`` (they
start at 0 on the wire); the batches share the message's memory, its device copy and its
event. From the pieces a BATCH sent ``apart`` travelled in (:func:`split_pieces`): each
batch's own piece of every array, ragged values by the bounds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from dataflow import wire
from dataflow.wire import OFFSETS_SUFFIX

if TYPE_CHECKING:
    from dataflow.client.buffers import Received


def split(ready: Received, msg: wire.BatchMsg,
          bounds: dict[str, tuple[int, ...]]) -> list[Received]:
    """The batches of ``ready`` (received from ``msg``, its arrays whole), in order:
    ``ready`` itself when ``msg`` carries one.

    Args:
        ready: the whole message's tensors, by array name.
        msg: its BATCH header.
        bounds: each ragged field's values bounds (``BatchLayout.check_frames``).
    """
    if not msg.parts:
        return [ready]
    return [replace(ready, tensors=t) for t in _cut(ready.tensors, msg, bounds)]


def split_pieces(pieces: list[list[torch.Tensor]], msg: wire.BatchMsg,
                 bounds: dict[str, tuple[int, ...]]) -> list[dict[str, torch.Tensor]]:
    """The tensors of each batch of ``msg`` (one, or one per ``parts`` entry), in order, from
    the pieces its arrays travelled in (``BatchLayout.pieces``, in array order): whole arrays
    cut as :func:`split` cuts them, arrays sent ``apart`` taken piece by piece.

    Args:
        pieces: each array's pieces, as :func:`dataflow.client.buffers.frame_views` makes them.
        msg: the BATCH header.
        bounds: each ragged field's values bounds (``BatchLayout.check_frames``).
    """
    names = [s.name for s in msg.arrays]
    if msg.apart:
        return [{name: t[0][bounds[name][j] : bounds[name][j + 1]] if name in bounds else t[j]
                 for name, t in zip(names, pieces, strict=True)}
                for j in range(len(msg.parts))]
    whole = {name: p[0] for name, p in zip(names, pieces, strict=True)}
    return _cut(whole, msg, bounds) if msg.parts else [whole]


def _cut(tensors: dict[str, torch.Tensor], msg: wire.BatchMsg,
         bounds: dict[str, tuple[int, ...]]) -> list[dict[str, torch.Tensor]]:
    """Each batch's views of the whole arrays of a BATCH with ``parts``."""
    offsets = {name + OFFSETS_SUFFIX for name, _ in msg.ragged}
    out = []
    row = 0
    for j, n in enumerate(msg.parts):
        part = {}
        for name, t in tensors.items():
            if name in bounds:
                part[name] = t[bounds[name][j] : bounds[name][j + 1]]
            elif name in offsets:
                part[name] = t[row + j : row + j + n + 1]
            else:
                part[name] = t[row : row + n]
        out.append(part)
        row += n
    return out
