"""How each Arrow type becomes batch fields: the type rules of :mod:`dataflow.convert.tables`.

A *leaf* is a column after structs are flattened (``image`` -> ``image.bytes``,
``image.path``). :func:`leaf_specs` gives a leaf's fields from its type alone (the schema);
:func:`dataflow.convert.arrowdata.leaf_columns` converts its data to exactly those fields.

Nested lists travel as one ragged field holding each sample's innermost values back to back,
plus, for each inner variable-length level ``j``, a ragged int64 field ``<name>.lengths<j>``
holding the lengths of that level's lists; fixed-size levels need no field. The field's
metadata ``levels`` lists the levels outermost first (``"var"`` or the fixed size).

The conversion of the data itself is :mod:`dataflow.convert.arrowdata`.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pyarrow as pa

from dataflow.batch import FieldSpec
from dataflow.convert.columns import ReadOptions
from dataflow.errors import SchemaError

EXT_NAME = b"ARROW:extension:name"
EXT_META = b"ARROW:extension:metadata"
SHAPE_KEY = b"dataflow.shape"
LENGTHS = ".lengths"
VAR = "var"
INNER = ReadOptions()
"""Options for values inside lists: dictionaries there are decoded to their values."""


def is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


@functools.lru_cache(maxsize=1024)
def primitive(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype())
    return None


def _hf_shape(meta: dict[bytes, bytes]) -> tuple[int, ...] | None:
    """The fixed shape of an HF ``Array2D``..``Array5D`` field, from its extension metadata."""
    if not meta.get(EXT_NAME, b"").startswith(b"datasets.features.features.Array"):
        return None
    try:
        shape = json.loads(meta[EXT_META])[0]
    except (KeyError, ValueError, IndexError, TypeError):
        return None
    if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
        return tuple(shape)
    return None


def _stored_shape(name: str, field_meta: dict[bytes, bytes],
                  shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape``, or the ``dataflow.shape`` field metadata (a JSON list: Parquet has no tensor
    type) when present.

    Raises:
        SchemaError: the metadata is not a JSON list of ints matching the stored size.
    """
    if SHAPE_KEY not in field_meta:
        return shape
    try:
        stored = tuple(int(d) for d in json.loads(field_meta[SHAPE_KEY]))
    except (ValueError, TypeError) as e:
        raise SchemaError(f"field {name!r}: bad {SHAPE_KEY!r} metadata: {e}") from e
    if math.prod(stored) != math.prod(shape):
        raise SchemaError(f"field {name!r}: {SHAPE_KEY!r} metadata {list(stored)} does not "
                          f"match the stored size {math.prod(shape)}")
    return stored


def normalize_type(name: str, t: pa.DataType, opts: ReadOptions) -> tuple[pa.DataType, dict]:
    """The storage type a leaf converts through, and the metadata it adds."""
    meta: dict[str, str] = {}
    if isinstance(t, pa.ExtensionType) and not isinstance(t, pa.FixedShapeTensorType):
        t = t.storage_type
    if pa.types.is_dictionary(t):
        meta["dictionary"] = opts.dictionary
        t = t.value_type if opts.dictionary == "values" else pa.int32()
    if pa.types.is_decimal(t):
        if opts.decimal == "refuse":
            raise SchemaError(f"field {name!r}: decimal type {t} is not served as is; give "
                              f"--decimal float64 or --decimal str, or --drop-columns {name}")
        meta["decimal"] = str(t)
        t = pa.float64() if opts.decimal == "float64" else pa.string()
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time(t):
        meta["unit"] = t.unit
        if pa.types.is_timestamp(t) and t.tz:
            meta["tz"] = t.tz
        meta["arrow"] = str(t)
        t = pa.int64() if t.bit_width == 64 else pa.int32()
    elif pa.types.is_date32(t) or pa.types.is_date64(t):
        meta["unit"] = "day" if pa.types.is_date32(t) else "ms"
        meta["arrow"] = str(t)
        t = pa.int32() if pa.types.is_date32(t) else pa.int64()
    if pa.types.is_string_view(t):
        t = pa.large_string()
    elif pa.types.is_binary_view(t):
        t = pa.large_binary()
    return t, meta


def _levels(name: str, t: pa.DataType, opts: ReadOptions) -> tuple[list, np.dtype, str | None]:
    """The list levels of ``t`` (outermost first), its innermost dtype, and ``"str"``/
    ``"bytes"`` when the innermost level is text."""
    levels: list = []
    while True:
        if pa.types.is_fixed_size_list(t):
            levels.append(t.list_size)
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            levels.append(VAR)
        else:
            break
        t, _ = normalize_type(name, t.value_type, INNER)
    dt = primitive(t)
    if dt is not None:
        return levels, dt, None
    if pa.types.is_fixed_size_binary(t):
        return [*levels, t.byte_width], np.dtype("uint8"), "bytes"
    if is_text(t):
        text = "str" if pa.types.is_string(t) or pa.types.is_large_string(t) else "bytes"
        return [*levels, VAR], np.dtype("uint8"), text
    how = (f"drop it with --drop-columns {name}" if not pa.types.is_null(t)
           else f"every value is null; drop it with --drop-columns {name}")
    raise SchemaError(f"field {name!r}: unsupported Arrow type {t}; {how}")


def leaf_specs(name: str, t: pa.DataType, field_meta: dict[bytes, bytes],
               opts: ReadOptions) -> list[FieldSpec]:
    """The fields a leaf of type ``t`` is served as (the first one named ``name``).

    Raises:
        SchemaError: the type cannot be served, naming the field and a way out.
    """
    return list(_cached_specs(name, t, tuple(sorted(field_meta.items())), opts))


@functools.lru_cache(maxsize=1024)
def _cached_specs(name: str, t: pa.DataType, meta_items: tuple[tuple[bytes, bytes], ...],
                  opts: ReadOptions) -> tuple[FieldSpec, ...]:
    return tuple(_specs(name, t, dict(meta_items), opts))


def _specs(name: str, t: pa.DataType, field_meta: dict[bytes, bytes],
           opts: ReadOptions) -> list[FieldSpec]:
    if isinstance(t, pa.FixedShapeTensorType):
        dt = primitive(t.value_type)
        if dt is not None:
            return [FieldSpec(name, dt.name, tuple(t.shape))]
    t, meta = normalize_type(name, t, opts)
    levels, dt, text = _levels(name, t, opts)
    shape = _hf_shape(field_meta)
    if shape is not None and len(shape) == len(levels):
        return [FieldSpec(name, dt.name, shape, meta=tuple(sorted(meta.items())))]
    if text is not None and levels == [VAR]:
        return [FieldSpec(name, "uint8", ragged=text, meta=tuple(sorted(meta.items())))]
    if VAR not in levels:
        shape = _stored_shape(name, field_meta, tuple(levels))
        return [FieldSpec(name, dt.name, shape, meta=tuple(sorted(meta.items())))]
    if text is not None:
        meta["item"] = text
    if levels == [VAR]:
        return [FieldSpec(name, dt.name, ragged="list", meta=tuple(sorted(meta.items())))]
    meta["levels"] = json.dumps(levels)
    out = [FieldSpec(name, dt.name, ragged="list", meta=tuple(sorted(meta.items())))]
    out += [FieldSpec(f"{name}{LENGTHS}{j}", "int64", ragged="list")
            for j, lvl in enumerate(levels) if j and lvl == VAR]
    return out
