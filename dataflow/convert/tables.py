"""Arrow -> :mod:`dataflow.batch` conversion: vectorized, zero-copy where Arrow's layout allows.

Struct columns are flattened to ``parent.child`` leaves (a list of structs to one list per
child), the leaves :class:`~dataflow.convert.columns.ReadOptions` selects are converted by the
type rules of :mod:`dataflow.convert.arrowtypes`, and null slots are filled, with a
``<name>.valid`` mask for masked fields.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from dataflow.batch import Batch, FieldSpec, Schema
from dataflow.convert.arrowdata import dictionary_values, fill_nulls, leaf_columns, normalize_array
from dataflow.convert.arrowtypes import leaf_specs
from dataflow.convert.columns import (
    ITEMS_SUFFIX,
    VALID_SUFFIX,
    Census,
    ReadOptions,
    is_pandas_index,
    pandas_index_columns,
    with_extras,
)
from dataflow.errors import SchemaError

DEFAULT = ReadOptions()
HF_META = b"huggingface"
_Leaf = tuple[str, pa.DataType, dict, "pa.Array | None"]


def _children(name: str, t: pa.DataType, arr: pa.Array | None) -> Iterator[_Leaf] | None:
    """The leaves under a struct or list-of-struct column, or ``None`` for any other type."""
    if pa.types.is_struct(t):
        kids = arr.flatten() if arr is not None else [None] * t.num_fields
        return (leaf for i in range(t.num_fields)
                for leaf in _walk(f"{name}.{t.field(i).name}", t.field(i).type, {}, kids[i]))
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type):
        st = t.value_type
        make = pa.list_ if pa.types.is_list(t) else pa.large_list
        kinds = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        kids = arr.values.flatten() if arr is not None else [None] * st.num_fields
        mask = arr.is_null() if arr is not None and arr.null_count else None
        return (leaf for i in range(st.num_fields)
                for leaf in _walk(f"{name}.{st.field(i).name}", make(st.field(i).type), {},
                                  None if arr is None else
                                  kinds.from_arrays(arr.offsets, kids[i], mask=mask)))
    return None


def _walk(name: str, t: pa.DataType, meta: dict, arr: pa.Array | None) -> Iterator[_Leaf]:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    kids = _children(name, t, arr)
    if kids is None:
        yield name, t, meta, arr
    else:
        yield from kids


class _Column(NamedTuple):
    """A served column of an Arrow schema: ``nested`` ones (structs, lists of structs) hold
    several leaves, found by walking their data."""

    column: int
    name: str
    type: pa.DataType
    meta: dict
    nested: bool


class _SchemaKey:
    """An Arrow schema as a cache key: equal to another only with the same metadata, its
    fields' included (``pa.Schema``'s own ``==`` and hash leave fields' metadata out, which
    holds a field's served shape and kind)."""

    __slots__ = ("_hash", "schema")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._hash = hash(schema)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SchemaKey) and self.schema.equals(other.schema,
                                                                    check_metadata=True)

    def __hash__(self) -> int:
        return self._hash


def _plan(schema: pa.Schema, opts: ReadOptions) -> tuple[_Column, ...]:
    """The columns of ``schema`` holding a selected leaf, less pandas index columns."""
    return _cached_plan(_SchemaKey(schema), opts)


@functools.lru_cache(maxsize=256)
def _cached_plan(key: _SchemaKey, opts: ReadOptions) -> tuple[_Column, ...]:
    schema = key.schema
    index_names = pandas_index_columns(schema.metadata)
    explicit = set(opts.columns or ())
    out = []
    for i, f in enumerate(schema):
        if (is_pandas_index(f.name, index_names) and not opts.index_columns
                and f.name not in explicit):
            continue
        meta = dict(f.metadata or {})
        nested = _children(f.name, f.type, None) is not None
        if any(opts.wanted(leaf[0]) for leaf in _walk(f.name, f.type, meta, None)):
            out.append(_Column(i, f.name, f.type, meta, nested))
    return tuple(out)


def _leaves(schema: pa.Schema, opts: ReadOptions,
            table: pa.Table | pa.RecordBatch | None = None) -> list[_Leaf]:
    """The selected leaves of ``schema`` (with their data when ``table`` is given)."""
    out: list[_Leaf] = []
    for c in _plan(schema, opts):
        col = None if table is None else table.column(c.column)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if c.nested:
            out += [leaf for leaf in _walk(c.name, c.type, c.meta, col) if opts.wanted(leaf[0])]
        else:
            out.append((c.name, c.type, c.meta, col))
    return out


def _data_leaves(table: pa.Table | pa.RecordBatch,
                 opts: ReadOptions) -> list[tuple[str, pa.DataType, dict, pa.Array]]:
    """:func:`_leaves` of ``table``, each with its data."""
    return [(n, t, m, a) for n, t, m, a in _leaves(table.schema, opts, table) if a is not None]


def check_selection(schema: pa.Schema, opts: ReadOptions, shard: str) -> None:
    """Every name in ``columns``/``drop``/``fill`` must match a leaf of ``schema``.

    Raises:
        SchemaError: naming the flag, the name, the shard and its fields.
    """
    every = [leaf[0] for leaf in _leaves(schema, ReadOptions(index_columns=True))]
    every += [key for key, _ in opts.hive]
    for flag, names in (("--columns", opts.columns or ()), ("--drop-columns", opts.drop),
                        ("--fill-value", [k for k, _ in opts.fill])):
        for n in names:
            if not any(s == n or s.startswith(n + ".") for s in every):
                raise SchemaError(f"{flag} {n!r}: no such field in {shard}; its fields are "
                                  f"{every}")


def wanted_columns(schema: pa.Schema, opts: ReadOptions) -> list[str]:
    """The top-level columns holding at least one selected leaf (what to read)."""
    tops = {leaf[0] for leaf in _leaves(schema, opts)}
    return [f.name for f in schema
            if any(n == f.name or n.startswith(f.name + ".") for n in tops)]


def base_schema(schema: pa.Schema, opts: ReadOptions = DEFAULT) -> Schema:
    """The fields the selected leaves of ``schema`` convert to (no masks, no hive fields).

    Raises:
        SchemaError: a type cannot be served, or two fields get the same name.
    """
    out: list[FieldSpec] = []
    labels = _class_names(schema)
    for name, t, meta, _ in _leaves(schema, opts):
        specs = leaf_specs(name, t, meta, opts)
        if name in labels:
            extra = (("class_names", labels[name]),)
            specs[0] = dataclasses.replace(specs[0], meta=tuple(sorted(specs[0].meta + extra)))
        out += specs
    names = [f.name for f in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise SchemaError(f"field {dup!r}: two columns are served under this name (a "
                          "struct child and a column named with a dot?); drop one with "
                          "--drop-columns")
    return tuple(out)


def _class_names(schema: pa.Schema) -> dict[str, str]:
    """``{column: JSON list of names}`` of the HF ``ClassLabel`` top-level columns."""
    raw = (schema.metadata or {}).get(HF_META)
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
        return {name: json.dumps(f["names"]) for name, f in features.items()
                if isinstance(f, dict) and f.get("_type") == "ClassLabel"}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}  # not HF's metadata: no class names to add


def schema_of_arrow(schema: pa.Schema, opts: ReadOptions = DEFAULT) -> Schema:
    """The served schema: :func:`base_schema` plus masks and hive fields."""
    return with_extras(base_schema(schema, opts), opts)


def census(table: pa.Table | pa.RecordBatch, opts: ReadOptions = DEFAULT) -> Census:
    """The :class:`Census` of ``table``'s selected leaves."""
    out = Census({}, {})
    for name, _, _, arr in _data_leaves(table, opts):
        if opts.dictionary == "codes" and pa.types.is_dictionary(arr.type):
            out.categories.setdefault(name, set()).update(dictionary_values(name, arr))
        counts = out.nulls
        if arr.null_count:
            counts[name] = arr.null_count
        items = arr
        while hasattr(items, "flatten") and not pa.types.is_struct(items.type):
            items = items.flatten()
        if items is not arr and items.null_count:
            counts[name + ITEMS_SUFFIX] = items.null_count
    return out


class _FlatLeaf(NamedTuple):
    """A served column that is one leaf (not a struct), with what converting it needs, found
    once per schema: its fields (:func:`leaf_specs`), which of them are served, its fill value
    and whether it is masked."""

    column: int
    name: str
    fields: list[FieldSpec]
    served: tuple[bool, ...]
    fill: str | None
    masked: bool


class _Conversion(NamedTuple):
    """How :func:`from_arrow` converts tables of one Arrow schema to one served schema:
    ``steps`` in column order, a flat leaf or a nested column (whose leaves are found by
    walking its data), and the served field names, in order and as a set."""

    steps: tuple[_FlatLeaf | _Column, ...]
    names: tuple[str, ...]
    served: frozenset[str]


def _conversion(arrow: pa.Schema, schema: Schema | None, opts: ReadOptions) -> _Conversion:
    """The :class:`_Conversion` of ``arrow`` to ``schema`` (None: derived) under ``opts``.

    Raises:
        SchemaError: ``schema`` is None and a type cannot be served.
    """
    return _cached_conversion(_SchemaKey(arrow), schema, opts)


@functools.lru_cache(maxsize=256)
def _cached_conversion(key: _SchemaKey, schema: Schema | None,
                       opts: ReadOptions) -> _Conversion:
    arrow = key.schema
    specs = schema if schema is not None else with_extras(base_schema(arrow, opts), opts)
    names = tuple(s.name for s in specs)
    served = frozenset(names)
    steps: list[_FlatLeaf | _Column] = []
    for c in _plan(arrow, opts):
        if c.nested:
            steps.append(c)
            continue
        fields = leaf_specs(c.name, c.type, c.meta, opts)
        steps.append(_FlatLeaf(c.column, c.name, fields, tuple(f.name in served for f in fields),
                               opts.fill_of(c.name), c.name in opts.masked))
    return _Conversion(tuple(steps), names, served)


class _Latest:
    """The latest conversion looked up, found again without hashing the schemas (a reader
    converts batch after batch of one schema; hashing a wide Arrow schema costs tens of µs).
    One tuple, replaced whole: safe to share between threads."""

    def __init__(self) -> None:
        self._last: tuple[pa.Schema, Schema | None, ReadOptions, _Conversion] | None = None

    def get(self, arrow: pa.Schema, schema: Schema | None, opts: ReadOptions) -> _Conversion:
        """:func:`_conversion` of the arguments."""
        last = self._last
        if (last is not None and (last[1] is schema or last[1] == schema)
                and (last[2] is opts or last[2] == opts)
                and last[0].equals(arrow, check_metadata=True)):
            return last[3]
        plan = _conversion(arrow, schema, opts)
        self._last = (arrow, schema, opts, plan)
        return plan


_LATEST = _Latest()


def from_arrow(table: pa.Table | pa.RecordBatch, schema: Schema | None = None,
               opts: ReadOptions = DEFAULT) -> Batch:
    """Convert an Arrow table or record batch to a :class:`Batch` without per-sample loops.

    ``schema`` (default: derived from ``table``) must be what :func:`schema_of_arrow` gives
    for ``table``'s schema under ``opts``, less hive fields (the reader adds those). What
    depends only on the schemas is worked out once per (Arrow schema, ``schema``, ``opts``)
    (:func:`_conversion`); each call converts the data.

    Raises:
        SchemaError: a field holds nulls that ``opts`` neither masks nor fills.
    """
    plan = _LATEST.get(table.schema, schema, opts)
    out: Batch = {}
    for step in plan.steps:
        col = table.column(step.column)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if isinstance(step, _FlatLeaf):
            _convert(out, step.name, col, step.fields, step.served, step.fill, step.masked,
                     opts)
            continue
        for name, t, meta, arr in _walk(step.name, step.type, step.meta, col):
            if arr is None or not opts.wanted(name):
                continue
            fields = leaf_specs(name, t, meta, opts)
            _convert(out, name, arr, fields, tuple(f.name in plan.served for f in fields),
                     opts.fill_of(name), name in opts.masked, opts)
    return {s: out[s] for s in plan.names if s in out}


def _convert(out: Batch, name: str, arr: pa.Array, fields: list[FieldSpec],
             served: tuple[bool, ...], fill: str | None, masked: bool,
             opts: ReadOptions) -> None:
    """Put the ``served`` ones of leaf ``name``'s ``fields`` (and its mask when ``masked``)
    into ``out``.

    Raises:
        SchemaError: it holds nulls that ``opts`` neither masks nor fills.
    """
    if arr.null_count:
        arr = normalize_array(name, arr, opts)
        if masked:
            out[name + VALID_SUFFIX] = np.asarray(arr.is_valid(), dtype=bool)
        elif fill is None:
            raise SchemaError(f"field {name!r}: {arr.null_count} null value(s), not "
                              "counted when the index was built (shard rewritten?)")
        arr = fill_nulls(name, arr, fill)
    elif masked:
        out[name + VALID_SUFFIX] = np.ones(len(arr), dtype=bool)
    for spec, keep, col in zip(fields, served, leaf_columns(fields, arr, opts), strict=True):
        if keep:
            out[spec.name] = col
