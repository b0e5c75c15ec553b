"""A variable-length field of a batch back as Python values: ``batch[name]`` holds every
sample's values back to back and ``batch[name + ".offsets"]`` where each sample's begin
(see :class:`~dataflow.client.DataLoader`); these split them per sample."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dataflow.errors import SchemaError


def _ends(batch: Mapping[str, torch.Tensor], name: str) -> list[int]:
    """The offsets of field ``name``, checked against its values."""
    values, offsets = batch.get(name), batch.get(name + ".offsets")
    if values is None or offsets is None:
        have = sorted(k for k in batch if not k.endswith(".offsets"))
        kind = "no variable-length field" if values is not None else "no field"
        raise SchemaError(f"the batch has {kind} {name!r}; its fields: {have}")
    ends = offsets.tolist()
    if (offsets.dim() != 1 or not ends or ends[0] != 0 or ends[-1] != values.shape[0]
            or any(b < a for a, b in zip(ends, ends[1:], strict=False))):
        raise SchemaError(f"field {name!r}: its offsets do not describe its "
                          f"{values.shape[0]} values")
    return ends


def rows(batch: Mapping[str, torch.Tensor], name: str) -> list[torch.Tensor]:
    """Each sample's values of the variable-length field ``name`` (views, no copy).

    Raises:
        SchemaError: the batch has no such variable-length field (naming the fields it has),
            or its offsets do not describe its values.
    """
    ends = _ends(batch, name)
    values = batch[name]
    return [values[a:b] for a, b in zip(ends, ends[1:], strict=False)]


def byte_strings(batch: Mapping[str, torch.Tensor], name: str) -> list[bytes]:
    """Each sample's bytes of the bytes or text field ``name``.

    Raises:
        SchemaError: as :func:`rows`, or the field's values are not bytes (uint8).
    """
    ends = _ends(batch, name)
    if batch[name].dtype != torch.uint8:
        raise SchemaError(f"field {name!r} holds {batch[name].dtype} values, not bytes")
    flat = batch[name].cpu().numpy().tobytes()
    return [flat[a:b] for a, b in zip(ends, ends[1:], strict=False)]


def strings(batch: Mapping[str, torch.Tensor], name: str) -> list[str]:
    """Each sample's text of the text field ``name`` (UTF-8).

    Raises:
        SchemaError: as :func:`byte_strings`, or a value is not UTF-8 (naming the sample).
    """
    out = []
    for i, raw in enumerate(byte_strings(batch, name)):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SchemaError(f"field {name!r}, sample {i} of the batch: not UTF-8 "
                              f"({e})") from e
    return out


def string_lists(batch: Mapping[str, torch.Tensor], name: str) -> list[list[str]]:
    """Each sample's list of text of the list-of-strings field ``name`` (HF
    ``Sequence(Value("string"))``: its UTF-8 bytes back to back, the lengths of its strings
    in ``name.lengths1``).

    Raises:
        SchemaError: as :func:`strings`, or the field has no ``.lengths1`` matching its bytes.
    """
    texts = byte_strings(batch, name)
    if name + ".lengths1" not in batch:
        raise SchemaError(f"field {name!r} is not a list of strings (no {name}.lengths1)")
    out: list[list[str]] = []
    for i, (raw, lengths) in enumerate(zip(texts, rows(batch, name + ".lengths1"),
                                           strict=True)):
        sizes = lengths.tolist()
        if sum(sizes) != len(raw) or min(sizes, default=0) < 0:
            raise SchemaError(f"field {name!r}, sample {i} of the batch: string lengths "
                              f"{sizes} do not match its {len(raw)} bytes")
        at, items = 0, []
        for n in sizes:
            try:
                items.append(raw[at:at + n].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise SchemaError(f"field {name!r}, sample {i} of the batch: not UTF-8 "
                                  f"({e})") from e
            at += n
        out.append(items)
    return out
