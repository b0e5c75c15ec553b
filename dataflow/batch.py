"""Columnar batches: the one in-memory form every reader produces and the wire carries.

A batch is a ``dict[str, Column]`` where a column is either

* a numpy array of shape ``(n, *shape)`` for a fixed-size field (ints, floats, tensors), or
* a :class:`Ragged` column for a variable-length field (bytes, text, variable lists),
  Arrow style: one flat ``values`` array and ``offsets`` of shape ``(n + 1,)``.

This module needs numpy only; the conversion from Arrow is :mod:`dataflow.convert.tables`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.errors import ConfigError, SchemaError

RAGGED_KINDS = ("bytes", "str", "list")


@dataclass(frozen=True)
class Ragged:
    """A variable-length column.

    Attributes:
        values: 1-D array holding every sample's items back to back (uint8 for bytes/str).
        offsets: int64 array of shape ``(n + 1,)``; sample ``i`` is
            ``values[offsets[i]:offsets[i + 1]]``; ``offsets[0] == 0``.
        kind: ``"bytes"``, ``"str"`` (UTF-8 bytes) or ``"list"`` (typed values).
    """

    values: np.ndarray
    offsets: np.ndarray
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in RAGGED_KINDS:
            raise ConfigError(f"ragged kind must be one of {RAGGED_KINDS}. Found: {self.kind!r}")
        if self.values.ndim != 1 or self.offsets.ndim != 1 or len(self.offsets) < 1:
            raise ConfigError("ragged values and offsets must be 1-D, offsets non-empty")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes | str | np.ndarray:
        """Sample ``i`` (negative counts from the end, as for a sequence).

        Raises:
            IndexError: ``i`` is outside ``[-len, len)``.
        """
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} of a ragged column of {n}")
        i %= n
        item = self.values[self.offsets[i] : self.offsets[i + 1]]
        if self.kind == "bytes":
            return item.tobytes()
        if self.kind == "str":
            return item.tobytes().decode("utf-8")
        return item

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.offsets.nbytes


Column = np.ndarray | Ragged
Batch = dict[str, Column]


@dataclass(frozen=True)
class FieldSpec:
    """The type of one field, identical for every sample of a dataset.

    Attributes:
        name: field name.
        dtype: numpy dtype name of the values (``"int64"``, ``"uint8"``, ...).
        shape: per-sample shape of a fixed-size field; ``()`` for scalars and ragged fields.
        ragged: ``None`` for fixed-size fields, else one of ``RAGGED_KINDS``.
        meta: sorted ``(key, value)`` text pairs saying what the values mean where the dtype
            does not (``unit``/``tz`` of a timestamp, ``levels`` of nested lists, ...; see
            docs/data.md).
    """

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    ragged: str | None = None
    meta: tuple[tuple[str, str], ...] = ()

    @property
    def meta_dict(self) -> dict[str, str]:
        return dict(self.meta)

    def to_json(self) -> dict:
        out: dict[str, object] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
               "ragged": self.ragged}
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_json(cls, obj: Mapping) -> FieldSpec:
        meta = obj.get("meta", {})
        return cls(str(obj["name"]), str(obj["dtype"]), tuple(int(d) for d in obj["shape"]),
                   obj["ragged"], tuple(sorted((str(k), str(v)) for k, v in meta.items())))


Schema = tuple[FieldSpec, ...]


def schema_to_json(schema: Schema) -> str:
    return json.dumps([f.to_json() for f in schema])


def schema_from_json(text: str) -> Schema:
    return tuple(FieldSpec.from_json(o) for o in json.loads(text))


def batch_len(batch: Mapping[str, Column]) -> int:
    """Number of samples in ``batch`` (0 for a batch with no fields)."""
    for col in batch.values():
        return len(col)
    return 0


def batch_nbytes(batch: Mapping[str, Column]) -> int:
    return sum(c.nbytes for c in batch.values())


def concat(batches: Sequence[Mapping[str, Column]]) -> Batch:
    """Concatenate batches with the same fields into one (copies unless there is one)."""
    if not batches:
        raise ConfigError("concat needs at least one batch")
    if len(batches) == 1:
        return dict(batches[0])
    out: Batch = {}
    for name in batches[0]:
        cols = [b[name] for b in batches]
        ragged = [c for c in cols if isinstance(c, Ragged)]
        fixed = [c for c in cols if not isinstance(c, Ragged)]
        if ragged and fixed:
            raise SchemaError(f"concat: field {name!r} is ragged in {len(ragged)} batches and "
                              f"fixed-size in {len(fixed)}")
        if ragged:
            starts = np.cumsum([0] + [len(c.values) for c in ragged[:-1]], dtype=np.int64)
            shifted = [c.offsets[1:] + s for c, s in zip(ragged, starts, strict=True)]
            offsets = np.concatenate([ragged[0].offsets[:1], *shifted])
            out[name] = Ragged(np.concatenate([c.values for c in ragged]), offsets,
                               ragged[0].kind)
        else:
            out[name] = np.concatenate(fixed)
    return out
