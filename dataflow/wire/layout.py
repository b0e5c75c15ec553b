"""The one layout of a BATCH's arrays in a receive buffer, shared by encoder and receivers.

An array of ``nbytes`` bytes travels in ``ceil(nbytes / MAX_FRAME_BYTES)`` frames (one empty
frame when ``nbytes == 0``), so no frame exceeds 8 MiB. A receiver lands all arrays of one
BATCH in one uint8 buffer of :attr:`BatchLayout.nbytes` bytes, each array starting at a
multiple of :data:`ALIGN`; :func:`dataflow.wire.decode` and the client's zero-copy receiver
(``recv_into`` each frame at its :attr:`BatchLayout.frames` slot) run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.errors import ProtocolError
from dataflow.wire.messages import OFFSETS_SUFFIX, BatchMsg

ALIGN = 64
MAX_FRAME_BYTES = 8 * 1024 * 1024


def chunk_sizes(nbytes: int) -> list[int]:
    """Sizes of the frames an array of ``nbytes`` bytes travels in (each <= 8 MiB)."""
    if nbytes == 0:
        return [0]
    full, rest = divmod(nbytes, MAX_FRAME_BYTES)
    return [MAX_FRAME_BYTES] * full + ([rest] if rest else [])


def check_offsets(name: str, offsets: np.ndarray, n_values: int) -> None:
    """Check ragged ``offsets`` (int64, (batch + 1,)) against ``n_values`` values.

    Raises:
        ProtocolError: ``offsets[0] != 0``, offsets decrease, or ``offsets[-1] != n_values``.
    """
    if offsets[0] != 0 or offsets[-1] != n_values or (np.diff(offsets) < 0).any():
        raise ProtocolError(f"BATCH ragged field {name!r}: offsets must start at 0, never "
                            f"decrease and end at {n_values} values")


def check_ragged(msg: BatchMsg, raw: dict[str, np.ndarray]) -> None:
    """Validate the ragged offsets of ``msg`` given its offsets arrays by name (their bytes as
    uint8, or int64).

    Raises:
        ProtocolError: a ragged field's offsets do not start at 0, decrease or do not end at
            its number of values (the message names the field).
    """
    specs = {s.name: s for s in msg.arrays}
    for name, _ in msg.ragged:
        check_offsets(name, raw[name + OFFSETS_SUFFIX].view(np.int64), specs[name].shape[0])


@dataclass(frozen=True)
class BatchLayout:
    """Where the arrays of one BATCH lie in one receive buffer.

    Attributes:
        nbytes: size in bytes of a buffer holding every array, each starting at a multiple of
            :data:`ALIGN`.
        offsets: byte offset of each array of ``msg.arrays`` in that buffer.
        frames: ``(start, size)`` in the buffer of each buffer frame after the header, in frame
            order.
        counts: how many of those frames each array travels in, in array order.
    """

    nbytes: int
    offsets: tuple[int, ...]
    frames: tuple[tuple[int, int], ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, msg: BatchMsg) -> BatchLayout:
        """The layout of ``msg``'s arrays (a header-only message is enough)."""
        offsets: list[int] = []
        frames: list[tuple[int, int]] = []
        counts: list[int] = []
        pos = 0
        for spec in msg.arrays:
            offsets.append(pos)
            start = pos
            nbytes = spec.nbytes
            sizes = chunk_sizes(nbytes)
            counts.append(len(sizes))
            for n in sizes:
                frames.append((start, n))
                start += n
            pos += -(-nbytes // ALIGN) * ALIGN
        return cls(pos, tuple(offsets), tuple(frames), tuple(counts))

    def _raw(self, msg: BatchMsg, buf: np.ndarray) -> dict[str, np.ndarray]:
        if buf.dtype != np.uint8 or buf.ndim != 1 or buf.nbytes < self.nbytes:
            raise ProtocolError(f"BATCH {msg.req_id}: receive buffer must be uint8 of at least "
                                f"{self.nbytes} bytes. Found: {buf.dtype} {buf.shape}")
        return {s.name: buf[off : off + s.nbytes]
                for s, off in zip(msg.arrays, self.offsets, strict=True)}

    def check(self, msg: BatchMsg, buf: np.ndarray) -> None:
        """Validate the ragged offsets of ``msg`` received into ``buf``.

        Raises:
            ProtocolError: ``buf`` is too small, or a ragged field's offsets do not start at 0,
                decrease or do not end at its number of values (the message names the field).
        """
        check_ragged(msg, self._raw(msg, buf))

    def arrays(self, msg: BatchMsg, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Typed views (no copy) of ``msg``'s arrays in ``buf``, by name, in frame order."""
        raw = self._raw(msg, buf)
        return {s.name: raw[s.name].view(s.dtype).reshape(s.shape) for s in msg.arrays}
