"""Which columns a dataset serves and how: selection, nulls, dictionaries, decimals, hive.

:class:`ReadOptions` is what the user chooses (server flags) plus what the index found
(fields holding nulls, hive partition keys); every reader of a dataset is opened with the
same options, so every shard converts to the same schema.

Field names are those served: a struct column ``image`` serves ``image.bytes`` and
``image.path``. A name in ``columns`` or ``drop`` matches a served field exactly or any field
under it (``image`` matches ``image.bytes``), so selecting a parent selects its children
(:func:`is_under`; a client's column subset, :mod:`dataflow.subset`, matches names the same way).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple
from urllib.parse import unquote

import numpy as np

from dataflow.batch import Batch, FieldSpec, Ragged, Schema
from dataflow.errors import ConfigError, SchemaError

NULLS = ("mask", "fill")
DICTIONARY = ("values", "codes")
DECIMAL = ("refuse", "float64", "str")
VALID_SUFFIX = ".valid"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The directory value pyarrow (and Spark, Hive) write for a null partition value."""
ITEMS_SUFFIX = "[]"
"""Null-count key suffix for null items inside list values (``tags[]``)."""
PANDAS_META = b"pandas"


@dataclass(frozen=True)
class ReadOptions:
    """How Arrow and Parquet columns become batch fields.

    Attributes:
        columns: served fields to keep (names or parent names); ``None``: all.
        drop: served fields to leave out (names or parent names), applied after ``columns``.
        nulls: ``"mask"``: a field holding nulls gets a ``<name>.valid`` bool field, and its
            null slots hold zeros/empty values (or its fill value); ``"fill"``: null slots
            hold the field's fill value and no mask is served (a field with nulls and no
            fill value is refused when the index is built).
        fill: ``(field, value)`` pairs, the value as text cast to the field's type; a field
            with a fill value is never masked.
        dictionary: dictionary (pandas ``category``) columns as their ``"values"`` or their
            integer ``"codes"``.
        decimal: decimal columns ``"refuse"``d (naming the field), or as ``"float64"``
            (lossy above 15 significant digits) or as ``"str"`` text.
        masked: fields served with a validity mask (set from the index's null counts, and
            for hive keys with null values from the shard paths).
        hive: ``(key, dtype)`` of each hive partition level (``"int64"`` or ``"str"``),
            from the shard paths under ``hive_root``; served as constant columns.
        hive_root: the directory the partition levels are under.
        index_columns: serve pandas index columns (``__index_level_0__``, or those the
            Parquet ``pandas`` metadata names); off by default.
        categories: under ``dictionary="codes"``, per dictionary field the sorted union of its
            values over the dataset (set from the index): code ``i`` is value ``i``, the
            same in every shard whatever each shard's own dictionary.
    """

    columns: tuple[str, ...] | None = None
    drop: tuple[str, ...] = ()
    nulls: str = "mask"
    fill: tuple[tuple[str, str], ...] = ()
    dictionary: str = "values"
    decimal: str = "refuse"
    masked: tuple[str, ...] = ()
    hive: tuple[tuple[str, str], ...] = ()
    hive_root: str = ""
    index_columns: bool = False
    categories: tuple[tuple[str, tuple], ...] = ()

    def __post_init__(self) -> None:
        for name, value, allowed in (("nulls", self.nulls, NULLS),
                                     ("dictionary", self.dictionary, DICTIONARY),
                                     ("decimal", self.decimal, DECIMAL)):
            if value not in allowed:
                raise ConfigError(f"`{name}` must be one of {allowed}. Found: {value!r}")
        if self.columns is not None and not self.columns:
            raise ConfigError("`columns` must name at least one field. Found: none")
        names = [k for k, _ in self.fill]
        if len(set(names)) != len(names):
            raise ConfigError(f"`fill` names a field twice. Found: {names}")
        bad = [d for _, d in self.hive if d not in ("int64", "str")]
        if bad:
            raise ConfigError(f"hive dtypes must be 'int64' or 'str'. Found: {bad[0]!r}")

    def fill_of(self, name: str) -> str | None:
        """The fill value (text) of served field ``name``, if one was given."""
        return dict(self.fill).get(name)

    def categories_of(self, name: str) -> tuple | None:
        """The categories of dictionary field ``name`` (``dictionary="codes"`` only)."""
        return dict(self.categories).get(name)

    def wanted(self, name: str) -> bool:
        """Whether served field ``name`` passes ``columns`` and ``drop``."""
        if self.columns is not None and not any(is_under(name, c) for c in self.columns):
            return False
        return not any(is_under(name, d) for d in self.drop)


def is_under(name: str, parent: str) -> bool:
    """Whether field ``name`` is ``parent`` or a field under it.

    ``is_under("image.bytes", "image")`` and ``is_under("label.valid", "label")`` are true (a
    struct's children, a field's null mask, offsets or inner lengths go with the field);
    ``is_under("images", "image")`` is not.
    """
    return name == parent or name.startswith(parent + ".")


def parse_fill(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["label=-1", "text="]`` -> ``(("label", "-1"), ("text", ""))``.

    Raises:
        ConfigError: an item has no ``=`` or an empty field name.
    """
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--fill-value must be FIELD=VALUE. Found: {item!r}")
        out.append((name, value))
    return tuple(out)


def pandas_index_columns(metadata: Mapping[bytes, bytes] | None) -> frozenset[str]:
    """The pandas index columns a schema's ``pandas`` metadata names (plus the default
    ``__index_level_0__`` style names, which pandas writes even without metadata)."""
    names: set[str] = set()
    raw = (metadata or {}).get(PANDAS_META)
    if raw:
        try:
            meta = json.loads(raw)
            names |= {c for c in meta.get("index_columns", []) if isinstance(c, str)}
        except (ValueError, AttributeError):
            pass  # not pandas' metadata: only the default names below apply
    return frozenset(names)


def is_pandas_index(name: str, index_names: frozenset[str]) -> bool:
    return name in index_names or (name.startswith("__index_level_") and name.endswith("__"))


def with_extras(schema: Schema, options: ReadOptions) -> Schema:
    """``schema`` with a ``<name>.valid`` field after each masked field and the hive
    partition fields appended."""
    out: list[FieldSpec] = []
    for f in schema:
        cats = options.categories_of(f.name)
        if cats is not None:
            f = replace(f, meta=tuple(sorted((*f.meta, ("categories", json.dumps(list(cats)))))))
        out.append(f)
        if f.name in options.masked:
            out.append(FieldSpec(f.name + VALID_SUFFIX, "bool"))
    for key, dtype in options.hive:
        if options.wanted(key):
            out.append(FieldSpec(key, "int64") if dtype == "int64" else
                       FieldSpec(key, "uint8", ragged="str"))
            if key in options.masked:
                out.append(FieldSpec(key + VALID_SUFFIX, "bool"))
    names = [f.name for f in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise SchemaError(f"field {dup!r}: a mask or hive partition field has the name of a "
                          "column; drop one with --drop-columns")
    return tuple(out)


def hive_levels(shards: Sequence[str], root: str) -> tuple[tuple[str, str], ...]:
    """The hive partition keys (``key=value`` directories under ``root``) every shard has,
    with ``"int64"`` where every value but nulls parses as an integer, else ``"str"``.

    Raises:
        SchemaError: shards disagree on the keys (naming two of them).
    """
    return _levels(shards, [hive_values(s, root) for s in shards])


def _levels(shards: Sequence[str],
            parsed: Sequence[list[tuple[str, str | None]]]) -> tuple[tuple[str, str], ...]:
    """:func:`hive_levels` of ``shards`` whose :func:`hive_values` are ``parsed``."""
    keys = [tuple(k for k, _ in p) for p in parsed]
    if not keys or not keys[0]:
        if any(keys):
            first = next(i for i, k in enumerate(keys) if k)
            raise SchemaError(f"hive partitions: {shards[first]} is under {list(keys[first])} "
                              f"but {shards[0]} is under none")
        return ()
    for s, k in zip(shards, keys, strict=True):
        if k != keys[0]:
            raise SchemaError(f"hive partitions: {s} is under {list(k)} but {shards[0]} is "
                              f"under {list(keys[0])}")
    out = []
    for j, key in enumerate(keys[0]):
        values = [v for p in parsed if (v := p[j][1]) is not None]
        out.append((key, "int64" if values and all(_is_int(v) for v in values) else "str"))
    return tuple(out)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def hive_values(shard: str, root: str) -> list[tuple[str, str | None]]:
    """``[(key, value), ...]`` of the ``key=value`` directories between ``root`` and the
    shard's file name, URI-decoded as pyarrow reads them (``city=New%20York`` is
    ``"New York"``); the value None for :data:`HIVE_NULL`."""
    rel = shard[len(root):] if shard.startswith(root) else shard
    parts = rel.split("/")[:-1]
    return [(unquote(k), None if v == HIVE_NULL else unquote(v))
            for k, sep, v in (p.partition("=") for p in parts) if sep and k]


def hive_columns(shard: str, options: ReadOptions, n: int) -> Batch:
    """The hive partition fields of ``n`` rows of ``shard``: constant columns."""
    out: Batch = {}
    values = dict(hive_values(shard, options.hive_root))
    for key, dtype in options.hive:
        if not options.wanted(key):
            continue
        if key not in values:
            raise SchemaError(f"{shard}: not under a {key}=... directory, unlike the other "
                              "shards")
        value = values[key]
        if key in options.masked:
            out[key + VALID_SUFFIX] = np.full(n, value is not None, dtype=bool)
        if value is None:
            value = options.fill_of(key) or ("0" if dtype == "int64" else "")
        if dtype == "int64":
            out[key] = np.full(n, int(value), dtype=np.int64)
        else:
            raw = np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
            out[key] = Ragged(np.tile(raw, n), np.arange(n + 1, dtype=np.int64) * len(raw), "str")
    return out


def with_hive(options: ReadOptions, shards: Sequence[str], root: str) -> ReadOptions:
    """``options`` with the hive levels of ``shards`` under ``root`` (before the scan, so
    readers serve them and ``--columns`` may name them). A key with null values (a shard
    under :data:`HIVE_NULL`) is served with its fill value there, else masked (its
    ``<key>.valid`` false there) under ``nulls="mask"``.

    Raises:
        SchemaError: such a key has no fill value under ``nulls="fill"``, or an integer key's
            fill value is not an integer (naming the key, a shard and the ways out).
    """
    parsed = [hive_values(s, root) for s in shards]
    levels = _levels(shards, parsed)
    masked = list(options.masked)
    for j, (key, dtype) in enumerate(levels):
        shard = next((s for s, p in zip(shards, parsed, strict=True) if p[j][1] is None), None)
        if shard is None or not options.wanted(key):
            continue
        fill = options.fill_of(key)
        if fill is None and options.nulls == "fill":
            raise SchemaError(f"hive partition {key!r}: {shard} is under a null value "
                              f"({HIVE_NULL}) and there is no fill value; give --fill-value "
                              f"{key}=VALUE, --nulls mask or --drop-columns {key}")
        if fill is not None and dtype == "int64" and not _is_int(fill):
            raise SchemaError(f"hive partition {key!r}: its values are integers, but its fill "
                              f"value {fill!r} is not one (its null value: {shard}); give an "
                              f"integer --fill-value {key}=VALUE, or --nulls mask without one")
        if fill is None:
            masked.append(key)
    return replace(options, hive=levels, hive_root=root, masked=tuple(masked))


def serving_options(options: ReadOptions, nulls: Mapping[str, int],
                    categories: Mapping[str, Iterable] | None = None) -> ReadOptions:
    """``options`` completed from an index: the masked fields and the categories of
    dictionary fields.

    Args:
        options: what the user chose (with the hive levels).
        nulls: null count per field over the dataset (``name[]`` for null list items).
        categories: per dictionary field, every value its shards' dictionaries hold.

    Raises:
        SchemaError: a field holds nulls the options cannot serve, naming it, its count and
            the ways out.
    """
    masked = []
    for name, count in sorted(nulls.items()):
        if not count or options.fill_of(name.removesuffix(ITEMS_SUFFIX)) is not None:
            continue
        if name.endswith(ITEMS_SUFFIX):
            base = name.removesuffix(ITEMS_SUFFIX)
            raise SchemaError(f"field {base!r}: {count} null item(s) inside its lists; give "
                              f"--fill-value {base}=VALUE or --drop-columns {base}")
        if options.nulls == "fill":
            raise SchemaError(f"field {name!r}: {count} null value(s) and no fill value; give "
                              f"--fill-value {name}=VALUE, --nulls mask or --drop-columns "
                              f"{name}")
        masked.append(name)
    cats = tuple((k, tuple(sorted(set(v)))) for k, v in sorted((categories or {}).items()))
    hive = [k for k in options.masked if k in dict(options.hive)]  # masked by with_hive
    return replace(options, masked=tuple(masked + hive), categories=cats)


class Census(NamedTuple):
    """What a shard holds that the schema does not say.

    Attributes:
        nulls: null slots per selected leaf (``name``) and null items inside its lists
            (``name[]``), for the leaves that have any.
        categories: under ``dictionary="codes"``, per dictionary leaf the values of its
            dictionaries.
    """

    nulls: dict[str, int]
    categories: dict[str, set]

    def add(self, other: Census) -> None:
        """Count ``other`` in too."""
        for name, n in other.nulls.items():
            self.nulls[name] = self.nulls.get(name, 0) + n
        for name, values in other.categories.items():
            self.categories.setdefault(name, set()).update(values)
