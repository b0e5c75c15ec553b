"""BATCH messages: array-spec validators, the payload codec, and Batch <-> message."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dataflow.batch import RAGGED_KINDS, Batch, Ragged, batch_len
from dataflow.errors import FieldError, ProtocolError
from dataflow.wire.fields import (
    INT64_MAX,
    MAX_APART_PIECES,
    MAX_ARRAYS,
    MAX_MESSAGE_BYTES,
    MAX_NAME,
    MAX_NDIM,
    BodyCodec,
    check_sizes,
    frame_sizes,
)
from dataflow.wire.layout import BatchLayout, chunk_sizes, piece_bytes
from dataflow.wire.messages import DTYPES, OFFSETS_SUFFIX, ArraySpec, BatchMsg, Buffer

ZERO_COPY_MIN_BYTES = 64 * 1024


def _array_spec(item: Any) -> ArraySpec:
    # ``type(x) is`` checks: JSON values are exactly str / int / list (bool is not an int here).
    if type(item) is not list or len(item) != 3:
        raise FieldError("entries must be [name, dtype, shape]")
    name, dtype, shape = item
    if type(name) is not str or not 0 < len(name) <= MAX_NAME:
        raise FieldError(f"array names must be non-empty strings of at most {MAX_NAME} "
                         "characters")
    if type(dtype) is not str or dtype not in DTYPES:
        raise FieldError(f"array {name!r}: dtype must be one of {sorted(DTYPES)}")
    if type(shape) is not list or not 1 <= len(shape) <= MAX_NDIM:
        raise FieldError(f"array {name!r}: shape must be 1 to {MAX_NDIM} non-negative integers")
    for d in shape:
        if type(d) is not int or not 0 <= d <= INT64_MAX:
            raise FieldError(f"array {name!r}: shape must be 1 to {MAX_NDIM} non-negative "
                             "integers")
    return ArraySpec(name, dtype, tuple(shape))


def array_specs(v: Any) -> tuple[ArraySpec, ...]:
    """Validator of BATCH ``arrays``: unique ``[name, dtype, shape]`` specs, 2 GiB at most."""
    if not isinstance(v, list) or len(v) > MAX_ARRAYS:
        raise FieldError(f"must be a list of at most {MAX_ARRAYS} specs")
    specs = tuple(_array_spec(a) for a in v)
    if len({s.name for s in specs}) != len(specs):
        raise FieldError("array names must be unique")
    total = 0
    for s in specs:
        total += s.nbytes
        if total > MAX_MESSAGE_BYTES:
            raise FieldError(f"declares more than {MAX_MESSAGE_BYTES} bytes of arrays")
    return specs


def ragged_fields(v: Any) -> tuple[tuple[str, str], ...]:
    """Validator of BATCH ``ragged``: unique ``[name, kind]`` pairs."""
    if not isinstance(v, list) or len(v) > MAX_ARRAYS:
        raise FieldError(f"must be a list of at most {MAX_ARRAYS} pairs")
    out = []
    for item in v:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or item[1] not in RAGGED_KINDS):
            raise FieldError(f"entries must be [name, kind] with kind in {RAGGED_KINDS}")
        out.append((item[0], item[1]))
    if len({n for n, _ in out}) != len(out):
        raise FieldError("ragged field names must be unique")
    return tuple(out)


def check_batch(msg: BatchMsg) -> None:
    """Rules between BATCH fields: ragged fields have values and offsets, others ``size`` rows.

    Raises:
        ProtocolError: naming the field (``ragged`` or ``arrays``) that breaks a rule.
    """
    if msg.parts and (len(msg.parts) < 2 or sum(msg.parts) != msg.size):
        raise ProtocolError(f"BATCH header field `parts`: 2 or more batches adding up to "
                            f"`size` {msg.size}. Found: {list(msg.parts)}"[:400])
    if msg.apart and not msg.parts:
        raise ProtocolError("BATCH header field `apart`: only a BATCH with `parts` is sent "
                            "apart")
    if msg.apart and len(msg.arrays) * len(msg.parts) > MAX_APART_PIECES:
        raise ProtocolError(f"BATCH header field `apart`: a BATCH sent apart has at most "
                            f"{MAX_APART_PIECES} pieces (arrays x parts). Found: "
                            f"{len(msg.arrays)} x {len(msg.parts)}")
    runs = msg.left_out
    if runs and (sum(runs[1::2]) - sum(runs[::2]) != msg.skipped
                 or runs[-1] > msg.size + msg.skipped):
        raise ProtocolError(f"BATCH header field `left_out`: runs of the request's "
                            f"{msg.size + msg.skipped} samples adding up to `skipped` "
                            f"{msg.skipped}. Found: {list(runs)}"[:400])
    by_name = {s.name: s for s in msg.arrays}
    paired: set[str] = set()
    for name, _ in msg.ragged:
        values, offsets = by_name.get(name), by_name.get(name + OFFSETS_SUFFIX)
        if values is None or offsets is None:
            raise ProtocolError(f"BATCH header field `ragged`: field {name!r} needs arrays "
                                f"{name!r} and {name + OFFSETS_SUFFIX!r}"[:400])
        if len(values.shape) != 1:
            raise ProtocolError(f"BATCH header field `ragged`: field {name!r}: values must be "
                                f"1-D. Found shape {values.shape}")
        rows = msg.size + max(len(msg.parts), 1)
        if offsets.dtype != "int64" or offsets.shape != (rows,):
            raise ProtocolError(f"BATCH header field `ragged`: field {name!r}: offsets must be "
                                f"int64 of shape ({rows},). Found: {offsets.dtype} "
                                f"{offsets.shape}")
        if {name, name + OFFSETS_SUFFIX} & paired:
            raise ProtocolError(f"BATCH header field `ragged`: field {name!r}: its arrays "
                                f"are another ragged field's"[:400])
        paired.update((name, name + OFFSETS_SUFFIX))
    for s in msg.arrays:
        if s.name not in paired and s.shape[0] != msg.size:
            raise ProtocolError(f"BATCH header field `arrays`: array {s.name!r}: first "
                                f"dimension must be the batch size {msg.size}. Found shape "
                                f"{s.shape}")
    if msg.shm is not None and msg.shm.nbytes != BatchLayout.of(msg).nbytes:
        raise ProtocolError(f"BATCH header field `shm`: the arrays take "
                            f"{BatchLayout.of(msg).nbytes} bytes laid out. Found: "
                            f"{msg.shm.nbytes}")


def array_pieces(msg: BatchMsg, layout: BatchLayout) -> list[list[np.ndarray]]:
    """The pieces each of ``msg``'s arrays travels in (``layout``: ``BatchLayout.of(msg)``),
    as flat uint8 arrays: an array given whole is cut (views), one given in pieces is taken
    as it is.

    Raises:
        ProtocolError: an array's data does not have the bytes its spec and the layout say
            (naming it).
    """
    out = []
    for spec, arr, rows in zip(msg.arrays, msg.data, layout.pieces, strict=True):
        given = [arr] if isinstance(arr, np.ndarray) else list(arr)
        flats = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in given]
        wanted = [piece_bytes(spec, n) for n, _ in rows]
        if len(flats) == 1 < len(wanted) and flats[0].nbytes == spec.nbytes:
            bounds = np.cumsum([0, *wanted]).tolist()
            flats = [flats[0][a:b] for a, b in itertools.pairwise(bounds)]
        if [f.nbytes for f in flats] != wanted:
            raise ProtocolError(f"BATCH {msg.req_id} array {spec.name!r}: data in pieces of "
                                f"{[f.nbytes for f in flats]} bytes; its spec and layout say "
                                f"{wanted}"[:400])
        out.append(flats)
    return out


def _piece_frames(flat: np.ndarray) -> list[Buffer]:
    out: list[Buffer] = []
    pos = 0
    for n in chunk_sizes(flat.nbytes):
        part = flat[pos : pos + n]
        out.append(part.data if n >= ZERO_COPY_MIN_BYTES else part.tobytes())
        pos += n
    return out


class ArraysBody(BodyCodec):
    """A BATCH's arrays: raw frames laid out by :class:`BatchLayout`; none when the header's
    ``shm`` says they lie in the client's shared memory (the receiver reads them there)."""

    attr = "data"
    empty = ()

    def encode(self, msg: BatchMsg) -> tuple[dict[str, Any], list[Any]]:
        if msg.shm is not None:
            return {}, []
        if len(msg.data) != len(msg.arrays):
            raise ProtocolError(f"BATCH has {len(msg.arrays)} array specs but "
                                f"{len(msg.data)} arrays")
        total = sum(s.nbytes for s in msg.arrays)
        if total > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"BATCH of {total} bytes exceeds {MAX_MESSAGE_BYTES}")
        return {}, [f for pieces in array_pieces(msg, BatchLayout.of(msg))
                    for piece in pieces for f in _piece_frames(piece)]

    def decode(self, head: BatchMsg, described: dict[str, Any],
               frames: Sequence[Any]) -> BatchMsg:
        if head.shm is not None:
            check_sizes(f"BATCH {head.req_id}", [], frame_sizes(frames))
            return head
        layout = BatchLayout.of(head)
        layout.check_frames(head, frame_sizes(frames), frames)
        buf = np.empty(layout.nbytes, dtype=np.uint8)
        for (start, n), f in zip(layout.frames, frames, strict=True):
            buf[start : start + n] = np.frombuffer(f, dtype=np.uint8)
        return replace(head, data=tuple(layout.arrays(head, buf).values()))


def _native(name: str, arr: Any) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise ProtocolError(f"field {name!r}: expected a numpy array or Ragged column. "
                            f"Found: {type(arr).__name__}")
    if arr.dtype.name not in DTYPES:
        raise ProtocolError(f"field {name!r}: dtype must be one of {sorted(DTYPES)}. "
                            f"Found: {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr)


def batch_to_message(req_id: int, batch: Batch, skipped: int = 0) -> BatchMsg:
    """The BATCH message carrying ``batch`` as the reply to request ``req_id``, of which
    ``skipped`` samples were not served (damaged, ``--on-error skip``).

    Raises:
        ProtocolError: a column has an unsupported type or dtype, or columns disagree on length.
    """
    size = batch_len(batch)
    specs: list[ArraySpec] = []
    data: list[np.ndarray] = []
    ragged: list[tuple[str, str]] = []
    for name, col in batch.items():
        if isinstance(col, Ragged):
            values = _native(name, col.values)
            offsets = np.ascontiguousarray(col.offsets, dtype=np.int64)
            parts = [(name, values), (name + OFFSETS_SUFFIX, offsets)]
            ragged.append((name, col.kind))
        else:
            arr = _native(name, col)
            if arr.ndim == 0:
                raise ProtocolError(f"field {name!r}: a column needs a batch dimension")
            parts = [(name, arr)]
        if len(col) != size:
            raise ProtocolError(f"field {name!r} has {len(col)} samples; expected {size}")
        for n, a in parts:
            specs.append(ArraySpec(n, a.dtype.name, tuple(a.shape)))
            data.append(a)
    return BatchMsg(req_id, size, tuple(specs), tuple(ragged), tuple(data), skipped)


def batches_to_message(req_id: int, batches: Sequence[Batch], skipped: int = 0, *,
                       apart: bool = False) -> BatchMsg:
    """The BATCH message carrying ``batches`` (2 or more) as the reply to request ``req_id``
    with as many ``parts``: each field's arrays one after the other, a ragged field's offsets
    each batch's own (see :class:`BatchMsg`). With ``apart`` the batches' arrays are not
    joined (but a ragged field's values): each travels in frames of its own, unless that
    makes more than :data:`~dataflow.wire.fields.MAX_APART_PIECES` pieces (then joined).

    Raises:
        ProtocolError: the batches do not have the same fields, of the same kinds, dtypes and
            sample shapes (naming the first batch that differs), or what
            :func:`batch_to_message` raises.
    """
    if len(batches) < 2:
        raise ProtocolError(f"a BATCH with parts carries 2 or more batches. Found: "
                            f"{len(batches)}")
    msgs = [batch_to_message(req_id, b) for b in batches]
    first = msgs[0]
    for j, msg in enumerate(msgs[1:], 1):
        if msg.ragged != first.ragged or _fields(msg) != _fields(first):
            raise ProtocolError(f"batch {j} of request {req_id} does not have the fields of "
                                f"batch 0 (names, kinds, dtypes, sample shapes): "
                                f"{_fields(msg)} vs {_fields(first)}"[:1000])
    values = {name for name, _ in first.ragged}
    apart = apart and len(first.arrays) * len(msgs) <= MAX_APART_PIECES
    wholes = [_whole(m) for m in msgs]
    data: list[np.ndarray | tuple[np.ndarray, ...]] = []
    specs = []
    for k, spec in enumerate(first.arrays):
        pieces = tuple(arrays[k] for arrays in wholes)
        rows = sum(len(p) for p in pieces)
        specs.append(ArraySpec(spec.name, spec.dtype, (rows, *spec.shape[1:])))
        data.append(pieces if apart and spec.name not in values else np.concatenate(pieces))
    sizes = tuple(m.size for m in msgs)
    return BatchMsg(req_id, sum(sizes), tuple(specs), first.ragged, tuple(data), skipped,
                    parts=sizes, apart=apart)


def parts_to_message(req_id: int, batch: Batch, sizes: Sequence[int]) -> BatchMsg:
    """The BATCH message carrying ``batch`` as the batches of its consecutive ``sizes``
    samples (2 or more), the reply to request ``req_id`` with as many ``parts``: the arrays
    as they are, but a ragged field's offsets each batch's own, from 0 (see
    :class:`BatchMsg`).

    Raises:
        ProtocolError: ``sizes`` are fewer than 2 or do not add up to the batch's samples, or
            what :func:`batch_to_message` raises.
    """
    msg = batch_to_message(req_id, batch)
    if len(sizes) < 2 or sum(sizes) != msg.size:
        raise ProtocolError(f"a BATCH with parts carries 2 or more batches adding up to its "
                            f"{msg.size} samples. Found: {list(sizes)}"[:400])
    starts = np.cumsum([0, *sizes])
    offsets = {name + OFFSETS_SUFFIX for name, _ in msg.ragged}
    data = []
    for spec, arr in zip(msg.arrays, _whole(msg), strict=True):
        if spec.name in offsets:
            arr = np.concatenate([arr[a : b + 1] - arr[a]
                                  for a, b in zip(starts[:-1], starts[1:], strict=True)])
        data.append(arr)
    specs = tuple(ArraySpec(s.name, s.dtype, tuple(a.shape))
                  for s, a in zip(msg.arrays, data, strict=True))
    return replace(msg, arrays=specs, data=tuple(data), parts=tuple(int(n) for n in sizes))


def _whole(msg: BatchMsg) -> list[np.ndarray]:
    """``msg``'s arrays, each whole (as :func:`batch_to_message` and a decode make them).

    Raises:
        ProtocolError: an array is given in pieces.
    """
    out = []
    for spec, arr in zip(msg.arrays, msg.data, strict=True):
        if not isinstance(arr, np.ndarray):
            raise ProtocolError(f"BATCH {msg.req_id} array {spec.name!r} is given in pieces; "
                                "expected it whole")
        out.append(arr)
    return out


def _fields(msg: BatchMsg) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(s.name, s.dtype, s.shape[1:]) for s in msg.arrays]


def message_to_batch(msg: BatchMsg) -> Batch:
    """The :data:`~dataflow.batch.Batch` carried by a decoded BATCH message of one batch (no
    ``parts``: see :func:`message_to_batches`)."""
    if msg.parts:
        raise ProtocolError(f"BATCH {msg.req_id} carries {len(msg.parts)} batches")
    return _batch_of(msg, dict(zip((s.name for s in msg.arrays), _whole(msg), strict=True)))


def message_to_batches(msg: BatchMsg) -> list[Batch]:
    """Every batch a decoded BATCH message carries, in order: one, or one per ``parts``
    entry (views of the message's arrays)."""
    if not msg.parts:
        return [message_to_batch(msg)]
    arrays = dict(zip((s.name for s in msg.arrays), _whole(msg), strict=True))
    ragged = {name for name, _ in msg.ragged}
    out = []
    row = 0
    starts = dict.fromkeys(ragged, 0)
    for j, n in enumerate(msg.parts):
        part: dict[str, np.ndarray] = {}
        for name, arr in arrays.items():
            if name in ragged:
                offsets = arrays[name + OFFSETS_SUFFIX][row + j : row + j + n + 1]
                part[name] = arr[starts[name] : starts[name] + int(offsets[-1])]
                part[name + OFFSETS_SUFFIX] = offsets
                starts[name] += int(offsets[-1])
            elif not (name.endswith(OFFSETS_SUFFIX) and name[: -len(OFFSETS_SUFFIX)] in ragged):
                part[name] = arr[row : row + n]
        out.append(_batch_of(msg, part))
        row += n
    return out


def _batch_of(msg: BatchMsg, arrays: dict[str, np.ndarray]) -> Batch:
    kinds = dict(msg.ragged)
    out: Batch = {}
    for name, arr in arrays.items():
        if name in kinds:
            out[name] = Ragged(arr, arrays[name + OFFSETS_SUFFIX], kinds[name])
        elif not (name.endswith(OFFSETS_SUFFIX) and name[: -len(OFFSETS_SUFFIX)] in kinds):
            out[name] = arr
    return out
