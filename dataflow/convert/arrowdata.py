"""How a leaf's Arrow data becomes the batch fields :mod:`dataflow.convert.arrowtypes` gives it."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.batch import Column, FieldSpec, Ragged
from dataflow.convert.arrowtypes import INNER, VAR, is_text, normalize_type, primitive
from dataflow.convert.columns import ReadOptions
from dataflow.errors import SchemaError


def _zero(t: pa.DataType, fill: str | None) -> pa.Array:
    """A one-element array of type ``t``: the fill value (cast from text), or NaN for floats
    and zero/empty for every other type."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.array([[]], type=t)
    if pa.types.is_fixed_size_list(t):
        inner = _zero(t.value_type, fill).to_pylist() * t.list_size
        return pa.array([inner], type=t)
    if pa.types.is_fixed_size_binary(t):
        return pa.array([b"\0" * t.byte_width], type=t)
    if is_text(t):
        return pa.array([fill or ""]).cast(t)
    if fill is None and pa.types.is_floating(t):
        return pa.array([float("nan")]).cast(t)
    return pa.array([fill if fill is not None else "0"]).cast(t)


def fill_nulls(name: str, arr: pa.Array, fill: str | None) -> pa.Array:
    """``arr`` with its null slots holding ``fill`` (text cast to the type), else NaN (floats)
    or zero/empty.

    Raises:
        SchemaError: ``fill`` cannot be cast to the field's type.
    """
    if not arr.null_count:
        return arr
    try:
        filler = _zero(arr.type, fill)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"--fill-value {name}={fill}: not a value of type {arr.type}: "
                          f"{e}") from e
    rows = np.arange(len(arr), dtype=np.int64)
    rows[np.asarray(arr.is_null())] = len(arr)
    return pa.concat_arrays([arr, filler]).take(pa.array(rows))


def normalize_array(name: str, arr: pa.Array, opts: ReadOptions) -> pa.Array:
    """``arr`` cast to the storage type :func:`_normalize` gives its type."""
    if isinstance(arr, pa.ExtensionArray) and not isinstance(arr.type, pa.FixedShapeTensorType):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode() if opts.dictionary == "values" else _codes(name, arr, opts)
    target, _ = normalize_type(name, arr.type, opts)
    return arr if target == arr.type else arr.cast(target)


def _codes(name: str, arr: pa.DictionaryArray, opts: ReadOptions) -> pa.Array:
    """The codes of ``arr``'s values among the dataset's categories (int32; nulls stay)."""
    cats = opts.categories_of(name)
    if cats is None:
        raise SchemaError(f"field {name!r}: --dictionary codes needs the dataset's categories "
                          "(found when the index is built)")
    values = arr.dictionary_decode()
    codes = pc.index_in(values, value_set=pa.array(cats, type=values.type)).cast(pa.int32())
    if codes.null_count != values.null_count:
        raise SchemaError(f"field {name!r}: a value is not among the categories found when "
                          "the index was built (shard rewritten?)")
    return codes


def dictionary_values(name: str, arr: pa.Array) -> list:
    """The values of a dictionary column's dictionary (none for other columns)."""
    if not pa.types.is_dictionary(arr.type):
        return []
    return [v for v in arr.dictionary.to_pylist() if v is not None]


def _unnest(name: str, arr: pa.Array, opts: ReadOptions) -> tuple[list[np.ndarray], pa.Array]:
    """Per list level (text counts as one), the offsets of its lists into the next level's
    elements (int64, ``(elements + 1,)``), and the innermost values (a primitive type)."""
    offsets = []
    cur = normalize_array(name, arr, opts)
    while primitive(cur.type) is None:
        t = cur.type
        if pa.types.is_fixed_size_list(t):
            cur = fill_nulls(name, cur, None)
            offsets.append(np.arange(len(cur) + 1, dtype=np.int64) * t.list_size)
            cur = cur.flatten()
        elif pa.types.is_fixed_size_binary(t):
            offsets.append(np.arange(len(cur) + 1, dtype=np.int64) * t.byte_width)
            buf = cur.buffers()[1]
            w = t.byte_width
            data = np.frombuffer(buf, np.uint8)[cur.offset * w: (cur.offset + len(cur)) * w]
            cur = pa.array(data)
        elif is_text(t):
            col = ragged_from_binary(fill_nulls(name, cur, None), "bytes")
            offsets.append(col.offsets)
            cur = pa.array(col.values)
        else:
            lens = np.asarray(pc.list_value_length(cur).fill_null(0), dtype=np.int64)
            offs = np.zeros(len(cur) + 1, dtype=np.int64)
            np.cumsum(lens, out=offs[1:])
            offsets.append(offs)
            cur = cur.flatten()
        cur = normalize_array(name, cur, INNER)
    return offsets, cur


def leaf_columns(specs: list[FieldSpec], arr: pa.Array, opts: ReadOptions) -> list[Column]:
    """Convert one leaf's data to the fields :func:`leaf_specs` gave (same order).

    Top-level nulls must already be filled (:func:`fill_nulls`); null items inside lists are
    filled with the field's fill value, else raise.
    """
    spec = specs[0]
    n = len(arr)
    if isinstance(arr, pa.ExtensionArray) and isinstance(arr.type, pa.FixedShapeTensorType):
        arr = arr.storage
    arr = normalize_array(spec.name, arr, opts)
    if spec.ragged in ("str", "bytes"):
        return [ragged_from_binary(arr, spec.ragged)]
    t = arr.type
    if spec.ragged is None and primitive(t) is not None:
        return [_values(spec.name, arr, opts)]
    fast = _fast(spec, arr, opts)
    if fast is not None:
        return [fast]
    offsets, values = _unnest(spec.name, arr, opts)
    flat = _values(spec.name, values, opts)
    if spec.ragged is None:
        dims = spec.shape if len(offsets) == len(spec.shape) else (None,) * len(offsets)
        if len(flat) != n * int(np.prod(spec.shape)) or any(
                len(o) > 1 and not (np.diff(o) == (d if d is not None else o[1] - o[0])).all()
                for o, d in zip(offsets, dims, strict=True)):
            raise SchemaError(f"field {spec.name!r}: lists do not all have the shape "
                              f"{list(spec.shape)} its type declares")
        return [flat.reshape((n, *spec.shape))]
    out: list[Column] = []
    composed = offsets[0]
    lengths: list[Column] = []
    for off in offsets[1:]:
        lengths.append(Ragged(np.diff(off)[composed[0]:composed[-1]], composed - composed[0],
                              "list"))
        composed = off[composed]
    out.append(Ragged(flat[composed[0]:composed[-1]], composed - composed[0], "list"))
    levels = json.loads(spec.meta_dict.get("levels", "[]"))
    out += [c for j, c in enumerate(lengths, start=1) if levels[j] == VAR]
    return out


def _fast(spec: FieldSpec, arr: pa.Array, opts: ReadOptions) -> Column | None:
    """The common cases without nulls, zero-copy: a list of numbers, nested fixed-size lists
    of numbers, or fixed-size binary values (bytes of the field's shape); ``None`` for
    anything else."""
    if arr.null_count:
        return None
    t = arr.type
    if (spec.ragged is None and pa.types.is_fixed_size_binary(t)
            and math.prod(spec.shape) == t.byte_width):
        w = t.byte_width
        data = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * w:
                                                         (arr.offset + len(arr)) * w]
        return data.reshape((len(arr), *spec.shape))
    if spec.ragged == "list" and (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
            primitive(t.value_type) is not None):
        wide = np.int64 if pa.types.is_large_list(t) else np.int32
        offs = np.frombuffer(arr.buffers()[1], wide)[arr.offset : arr.offset + len(arr) + 1]
        values = arr.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
        return Ragged(_values(spec.name, values, opts), (offs - offs[0]).astype(np.int64),
                      "list")
    if spec.ragged is None and pa.types.is_fixed_size_list(t):
        values = arr
        while pa.types.is_fixed_size_list(values.type) and not values.null_count:
            values = values.flatten()
        if primitive(values.type) is not None and not values.null_count:
            return values.to_numpy(zero_copy_only=False).reshape((len(arr), *spec.shape))
    return None


def _values(name: str, arr: pa.Array, opts: ReadOptions) -> np.ndarray:
    if arr.null_count:
        fill = opts.fill_of(name)
        if fill is None:
            raise SchemaError(f"field {name!r}: {arr.null_count} null item(s) inside its "
                              f"lists; give --fill-value {name}=VALUE or --drop-columns {name}")
        arr = fill_nulls(name, arr, fill)
    return arr.to_numpy(zero_copy_only=False)


def ragged_from_binary(arr: pa.Array, kind: str) -> Ragged:
    """A (large) string/binary array without nulls as a ragged column, zero-copy."""
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    _, offs_buf, data_buf = arr.buffers()
    offs = np.frombuffer(offs_buf, dtype=np.int64 if wide else np.int32)
    offs = offs[arr.offset : arr.offset + len(arr) + 1]
    if data_buf is None:
        values = np.zeros(0, dtype=np.uint8)
    else:
        values = np.frombuffer(data_buf, dtype=np.uint8)[offs[0] : offs[-1]]
    return Ragged(values, (offs - offs[0]).astype(np.int64, copy=False), kind)
