"""A BATCH that carries several batches (a REQUEST's ``parts``) cut into one per batch.

Every batch is a set of views of the message's tensors (no copy, on the CPU as on a device):
fixed fields by rows, ragged values by the bounds :meth:`dataflow.wire.BatchLayout.
check_frames` read from the host's copy of the offsets (so a device batch needs no
synchronization), and ragged offsets by each batch's own ``n + 1`` (they start at 0 on the
wire). The batches share the message's memory, its device copy and its event.
"""

from __future__ import annotations

from dataclasses import replace

from dataflow import wire
from dataflow.client.buffers import Received
from dataflow.wire import OFFSETS_SUFFIX


def split(ready: Received, msg: wire.BatchMsg,
          bounds: dict[str, tuple[int, ...]]) -> list[Received]:
    """The batches of ``ready`` (received from ``msg``), in order: ``ready`` itself when
    ``msg`` carries one.

    Args:
        ready: the whole message's tensors, by array name.
        msg: its BATCH header.
        bounds: each ragged field's values bounds (``BatchLayout.check_frames``).
    """
    if not msg.parts:
        return [ready]
    offsets = {name + OFFSETS_SUFFIX: name for name, _ in msg.ragged}
    out = []
    row = 0
    for j, n in enumerate(msg.parts):
        tensors = {}
        for name, t in ready.tensors.items():
            if name in bounds:
                tensors[name] = t[bounds[name][j] : bounds[name][j + 1]]
            elif name in offsets:
                tensors[name] = t[row + j : row + j + n + 1]
            else:
                tensors[name] = t[row : row + n]
        out.append(replace(ready, tensors=tensors))
        row += n
    return out
