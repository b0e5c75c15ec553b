"""Arrow -> :mod:`dataflow.batch` conversion: vectorized, zero-copy where Arrow's layout allows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dataflow.batch import Batch, Column, FieldSpec, Ragged, Schema
from dataflow.errors import DataflowError


def _primitive_dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype())
    return None


def field_spec(field: pa.Field) -> FieldSpec:
    """The :class:`FieldSpec` of an Arrow field; raises for types dataflow cannot batch."""
    t = field.type
    if isinstance(t, pa.FixedShapeTensorType):
        dt = _primitive_dtype(t.value_type)
        if dt is not None:
            return FieldSpec(field.name, dt.name, tuple(t.shape))
    if isinstance(t, pa.ExtensionType):
        return field_spec(pa.field(field.name, t.storage_type))
    dt = _primitive_dtype(t)
    if dt is not None:
        return FieldSpec(field.name, dt.name)
    shape: list[int] = []
    inner = t
    while pa.types.is_fixed_size_list(inner):
        shape.append(inner.list_size)
        inner = inner.value_type
    inner_dt = _primitive_dtype(inner)
    if shape and inner_dt is not None:
        return FieldSpec(field.name, inner_dt.name, tuple(shape))
    if pa.types.is_fixed_size_binary(t):
        return FieldSpec(field.name, "uint8", (t.byte_width,))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return FieldSpec(field.name, "uint8", ragged="bytes")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return FieldSpec(field.name, "uint8", ragged="str")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item_dt = _primitive_dtype(t.value_type)
        if item_dt is not None:
            return FieldSpec(field.name, item_dt.name, ragged="list")
    raise DataflowError(f"field {field.name!r}: unsupported Arrow type {t}")


def schema_of_arrow(schema: pa.Schema) -> Schema:
    return tuple(field_spec(f) for f in schema)


def _no_nulls(name: str, arr: pa.Array) -> None:
    if arr.null_count:
        raise DataflowError(
            f"field {name!r}: {arr.null_count} null value(s); nulls are not supported"
        )


def _ragged_from_binary(arr: pa.Array, kind: str) -> Ragged:
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    _, offs_buf, data_buf = arr.buffers()
    offs = np.frombuffer(offs_buf, dtype=np.int64 if wide else np.int32)
    offs = offs[arr.offset : arr.offset + len(arr) + 1]
    if data_buf is None:
        values = np.zeros(0, dtype=np.uint8)
    else:
        values = np.frombuffer(data_buf, dtype=np.uint8)[offs[0] : offs[-1]]
    return Ragged(values, (offs - offs[0]).astype(np.int64, copy=False), kind)


def column_from_arrow(spec: FieldSpec, arr: pa.Array | pa.ChunkedArray) -> Column:
    """Convert one Arrow column to a :class:`Column` of ``spec``'s type."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    _no_nulls(spec.name, arr)
    n = len(arr)
    if spec.ragged in ("bytes", "str"):
        return _ragged_from_binary(arr, spec.ragged)
    if spec.ragged == "list":
        offs = arr.offsets.to_numpy()
        values = arr.flatten()
        _no_nulls(spec.name, values)
        return Ragged(values.to_numpy(zero_copy_only=False), (offs - offs[0]).astype(np.int64),
                      "list")
    if pa.types.is_fixed_size_binary(arr.type):
        buf = arr.buffers()[1]
        w = arr.type.byte_width
        flat = np.frombuffer(buf, dtype=np.uint8)[arr.offset * w : (arr.offset + n) * w]
        return flat.reshape(n, w)
    values = arr
    while pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    _no_nulls(spec.name, values)
    flat = values.to_numpy(zero_copy_only=False)
    return flat.reshape((n, *spec.shape))


def from_arrow(table: pa.Table | pa.RecordBatch, schema: Schema | None = None) -> Batch:
    """Convert an Arrow table or record batch to a :class:`Batch` without per-sample loops."""
    specs = schema if schema is not None else schema_of_arrow(table.schema)
    return {s.name: column_from_arrow(s, table.column(s.name)) for s in specs}
