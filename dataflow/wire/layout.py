"""The one layout of a BATCH's arrays in a receive buffer, shared by encoder and receivers.

An array travels in pieces: the whole array, or for a BATCH with ``parts`` sent ``apart``, each
batch's rows of it (a ragged field's offsets: each batch's own ``n + 1``; its values stay one
piece, their bounds known only from the offsets). A piece of ``nbytes`` bytes travels in
``ceil(nbytes / MAX_FRAME_BYTES)`` frames (one empty frame when ``nbytes == 0``), so no frame
exceeds 24 MiB, and a receiver can view each batch's piece where it arrived. A receiver lands
all arrays of one BATCH in one uint8 buffer of :attr:`BatchLayout.nbytes` bytes, each array
starting at a multiple of :data:`ALIGN`. Every receiver of a BATCH
(:func:`dataflow.wire.decode` and each of the client's sinks, whether its frames stay ZeroMQ
messages or are received with ``recv_into`` at their :attr:`BatchLayout.frames` slots) checks
them with the one :meth:`BatchLayout.check_frames`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from dataflow.errors import ProtocolError
from dataflow.wire.fields import check_sizes
from dataflow.wire.messages import ITEMSIZE, OFFSETS_SUFFIX, ArraySpec, BatchMsg

ALIGN = 64
# A client with CPU tensors views an array that travelled in one frame in place and copies one
# split over several: 24 MiB keeps a 19 MB batch of 128 3x224x224 uint8 images in one frame
# (the receiving client's copy of it was its largest cost per batch, bench/RESULTS.md,
# "Receive path"), below glibc's largest mmap threshold (32 MiB), from which messages were
# ~3x slower as each one's memory went back to the OS.
MAX_FRAME_BYTES = 24 * 1024 * 1024
LAYOUTS = 64  # layouts remembered (:meth:`BatchLayout.of`)


def chunk_sizes(nbytes: int) -> list[int]:
    """Sizes of the frames an array of ``nbytes`` bytes travels in (each <= 24 MiB)."""
    if nbytes == 0:
        return [0]
    full, rest = divmod(nbytes, MAX_FRAME_BYTES)
    return [MAX_FRAME_BYTES] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class BatchLayout:
    """Where the arrays of one BATCH lie in one receive buffer.

    Attributes:
        nbytes: size in bytes of a buffer holding every array, each starting at a multiple of
            :data:`ALIGN`.
        offsets: byte offset of each array of ``msg.arrays`` in that buffer.
        frames: ``(start, size)`` in the buffer of each buffer frame after the header, in frame
            order.
        sizes: the size of each of those frames, in frame order.
        counts: how many of those frames each array travels in, in array order.
        pieces: ``(rows, frames)`` of each piece each array travels in, in array order: its
            first-dimension length and how many frames it travels in. One piece of
            ``shape[0]`` rows; each batch's rows (``n + 1`` for ragged offsets) for a BATCH
            with ``parts`` sent ``apart``.
    """

    nbytes: int
    offsets: tuple[int, ...]
    frames: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    pieces: tuple[tuple[tuple[int, int], ...], ...]

    @classmethod
    def of(cls, msg: BatchMsg) -> BatchLayout:
        """The layout of ``msg``'s arrays (a header-only message is enough); computed once
        per distinct ``arrays`` (and ``parts``, sent ``apart``) of the latest :data:`LAYOUTS`
        (the batches of a stream of fixed-size samples share theirs: the client asks once per
        batch or more)."""
        if msg.apart:
            return _layout(tuple(msg.arrays), msg.parts, tuple(n for n, _ in msg.ragged))
        return _layout(tuple(msg.arrays), (), ())

    def check_frames(self, msg: BatchMsg, sizes: Sequence[int],
                     frames: Sequence[Any]) -> dict[str, tuple[int, ...]]:
        """The one check of a BATCH's buffer frames, run by every receiver of one.

        Args:
            msg: the BATCH (its header is enough); this layout is ``BatchLayout.of(msg)``.
            sizes: the size in bytes of every frame that followed the header, in order.
            frames: the contents of the first ``len(self.frames)`` of them, where they landed
                (anything with the buffer protocol); only the ragged offsets are read, and
                only once every size is right.

        Returns:
            For a BATCH with ``parts``, each ragged field's values bounds: where each batch's
            values start, and the end (``len(parts) + 1`` numbers); else nothing.

        Raises:
            ProtocolError: a frame missing or in excess, a frame of another size than
                announced, or a ragged field's offsets that do not start at 0, decrease or do
                not end at its number of values (each batch's, for ``parts``); naming the
                request and the frame or field.
        """
        if tuple(sizes) != self.sizes:  # on the hot path: the message only when it fails
            check_sizes(f"BATCH {msg.req_id}", self.sizes, sizes)
        bounds: dict[str, tuple[int, ...]] = {}
        if not msg.ragged:
            return bounds
        index = {s.name: k for k, s in enumerate(msg.arrays)}
        for name, _ in msg.ragged:
            k = index[name + OFFSETS_SUFFIX]
            first = sum(self.counts[:k])
            parts = [np.frombuffer(f, dtype=np.uint8)
                     for f in frames[first : first + self.counts[k]]]
            offsets = (parts[0] if len(parts) == 1 else np.concatenate(parts)).view(np.int64)
            n_values = msg.arrays[index[name]].shape[0]
            if not msg.parts:
                if offsets[0] != 0 or offsets[-1] != n_values or (np.diff(offsets) < 0).any():
                    raise ProtocolError(f"BATCH {msg.req_id} ragged field {name!r}: offsets "
                                        f"must start at 0, never decrease and end at "
                                        f"{n_values} values")
                continue
            bounds[name] = _part_bounds(msg, name, offsets, n_values)
        return bounds

    def arrays(self, msg: BatchMsg, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Typed views (no copy) of ``msg``'s arrays in ``buf``, by name, in frame order.

        Raises:
            ProtocolError: ``buf`` is not uint8 of at least :attr:`nbytes` bytes.
        """
        if buf.dtype != np.uint8 or buf.ndim != 1 or buf.nbytes < self.nbytes:
            raise ProtocolError(f"BATCH {msg.req_id}: receive buffer must be uint8 of at least "
                                f"{self.nbytes} bytes. Found: {buf.dtype} {buf.shape}")
        return {s.name: buf[off : off + s.nbytes].view(s.dtype).reshape(s.shape)
                for s, off in zip(msg.arrays, self.offsets, strict=True)}


def piece_bytes(spec: ArraySpec, rows: int) -> int:
    """Bytes of ``rows`` rows (first-dimension entries) of an array of ``spec``."""
    return rows * math.prod(spec.shape[1:]) * ITEMSIZE[spec.dtype]


@lru_cache(maxsize=LAYOUTS)
def _layout(arrays: tuple[ArraySpec, ...], parts: tuple[int, ...],
            ragged: tuple[str, ...]) -> BatchLayout:
    """:meth:`BatchLayout.of` a BATCH whose ``arrays`` these are, sent apart by ``parts`` (a
    ragged field's values, named by ``ragged``, whole) or whole (no ``parts``); immutable:
    shared."""
    offsets: list[int] = []
    frames: list[tuple[int, int]] = []
    sizes: list[int] = []
    counts: list[int] = []
    pieces: list[tuple[tuple[int, int], ...]] = []
    pos = 0
    for spec in arrays:
        offsets.append(pos)
        start = pos
        own = []
        for rows in _piece_rows(spec, parts, ragged):
            chunks = chunk_sizes(piece_bytes(spec, rows))
            own.append((rows, len(chunks)))
            sizes += chunks
            for n in chunks:
                frames.append((start, n))
                start += n
        pieces.append(tuple(own))
        counts.append(sum(n for _, n in own))
        pos += -(-spec.nbytes // ALIGN) * ALIGN
    return BatchLayout(pos, tuple(offsets), tuple(frames), tuple(sizes), tuple(counts),
                       tuple(pieces))


def _piece_rows(spec: ArraySpec, parts: tuple[int, ...],
                ragged: tuple[str, ...]) -> tuple[int, ...]:
    """The rows of each piece an array of ``spec`` travels in (see the module docstring)."""
    if not parts or spec.name in ragged:
        return (spec.shape[0],)
    if spec.name.endswith(OFFSETS_SUFFIX) and spec.name[: -len(OFFSETS_SUFFIX)] in ragged:
        return tuple(n + 1 for n in parts)
    return parts


def _part_bounds(msg: BatchMsg, name: str, offsets: np.ndarray,
                 n_values: int) -> tuple[int, ...]:
    """Where each batch's values of ragged field ``name`` start in a BATCH with ``parts``, and
    the end; each batch's ``offsets`` (its own ``n + 1``) checked."""
    starts = [0]
    row = 0
    for n in msg.parts:
        own = offsets[row : row + n + 1]
        if own[0] != 0 or (np.diff(own) < 0).any():
            raise ProtocolError(f"BATCH {msg.req_id} ragged field {name!r}: each batch's "
                                "offsets must start at 0 and never decrease")
        starts.append(starts[-1] + int(own[-1]))
        row += n + 1
    if starts[-1] != n_values:
        raise ProtocolError(f"BATCH {msg.req_id} ragged field {name!r}: the batches' values "
                            f"add up to {starts[-1]}, not its {n_values} values")
    return tuple(starts)
