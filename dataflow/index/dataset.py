"""The dataset index: every shard, its sample count, and the one schema they share.

Pure data (JSON in and out); building one from shards is :mod:`dataflow.index.scan`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dataflow.batch import FieldSpec, Schema
from dataflow.checks import check_int
from dataflow.convert.columns import ReadOptions
from dataflow.errors import ConfigError, SchemaMismatchError


def dataset_root(shards: Sequence[str]) -> str:
    """The longest common prefix of ``shards`` that ends with ``/`` (``""`` when none)."""
    prefix = os.path.commonprefix(list(shards))
    return prefix[: prefix.rfind("/") + 1]


@dataclass(frozen=True)
class DatasetIndex:
    """Shards of one dataset with their sample counts, identities and shared schema.

    Attributes:
        shards: shard URLs/paths in dataset order.
        sizes: samples per shard, same order.
        schema: the fields every shard has.
        identities: per shard, what its file system says of its content, same order: byte
            size and mtime (local files) or ETag/modification stamp (object stores), as
            :func:`dataflow.storage.cache.identity` gives it.
        nulls: per shard, ``(field, null count)`` for its fields holding nulls (``name[]``:
            null items inside the field's lists); empty: none anywhere.
        read: how every reader of the dataset converts its columns (user options completed
            with the masked fields and hive levels the index found).
        skipped: per shard, samples left out as damaged when the index was built (under
            ``on_error="skip"``, or tar samples lacking a field under
            ``missing_field="skip"``): not in ``sizes``, so missing from every epoch; empty:
            none anywhere. Samples lost past damage whose extent cannot be known (the rest of
            a shard cut short) are not in it; only the servers' log names that damage.
    """

    shards: tuple[str, ...]
    sizes: tuple[int, ...]
    schema: Schema
    identities: tuple[str, ...]
    nulls: tuple[tuple[tuple[str, int], ...], ...] = ()
    read: ReadOptions = ReadOptions()
    skipped: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name, items in (("sizes", self.sizes), ("identities", self.identities)):
            if len(items) != len(self.shards):
                raise ConfigError(
                    f"`{name}` must have one entry per shard ({len(self.shards)}). "
                    f"Found: {len(items)}"
                )
        for name in ("sizes", "skipped"):
            counts = tuple(check_int(f"{name}[{i}]", s, 0)
                           for i, s in enumerate(getattr(self, name)))
            object.__setattr__(self, name, counts)
        if self.skipped and len(self.skipped) != len(self.shards):
            raise ConfigError(f"`skipped` must have one entry per shard ({len(self.shards)}) "
                              f"or none. Found: {len(self.skipped)}")
        odd = [i for i in self.identities if not isinstance(i, str)]
        if odd:
            raise ConfigError(f"`identities` must be strings. Found: {odd[0]!r}")
        if self.nulls and len(self.nulls) != len(self.shards):
            raise ConfigError(f"`nulls` must have one entry per shard ({len(self.shards)}) or "
                              f"none. Found: {len(self.nulls)}")

    def null_totals(self) -> dict[str, int]:
        """Null count per field over the whole dataset (fields with nulls only)."""
        out: dict[str, int] = {}
        for shard in self.nulls:
            for name, n in shard:
                out[name] = out.get(name, 0) + n
        return out

    @property
    def total(self) -> int:
        """Samples in the whole dataset."""
        return sum(self.sizes)

    @property
    def lost(self) -> int:
        """Samples left out as damaged when the index was built, over all shards."""
        return sum(self.skipped)

    @property
    def root(self) -> str:
        """The dataset root: the longest common prefix of the shards that ends with ``/``
        (``""`` when they share none)."""
        return dataset_root(self.shards)

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the dataset's content identity.

        Hashed per shard: its name relative to :attr:`root`, its sample count and its
        identity; then the schema. Where the dataset lives does not count: the same files
        copied elsewhere with their mtimes (``shutil.copy2``, ``cp -p``, ``rsync -t``) give the
        same fingerprint, while a shard rewritten in place gives a new one even with the same
        sample count. Computed from the index alone, so a client gets the server's value.
        """
        root = len(self.root)
        text = json.dumps(
            {"shards": [[url[root:], size, ident] for url, size, ident
                        in zip(self.shards, self.sizes, self.identities, strict=True)],
             "schema": [f.to_json() for f in self.schema]},
            sort_keys=True,
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps({"shards": list(self.shards), "sizes": list(self.sizes),
                           "schema": [f.to_json() for f in self.schema],
                           "identities": list(self.identities),
                           "nulls": [dict(n) for n in self.nulls],
                           "read": asdict(self.read), "skipped": list(self.skipped)})

    @classmethod
    def from_json(cls, text: str) -> DatasetIndex:
        """Parse :meth:`to_json` output (that of a version without ``skipped`` too: none).

        Raises:
            ConfigError: the text is not a valid index.
        """
        try:
            obj = json.loads(text)
            read = obj.get("read", {})
            return cls(
                tuple(str(s) for s in obj["shards"]),
                tuple(obj["sizes"]),
                tuple(FieldSpec.from_json(f) for f in obj["schema"]),
                tuple(obj["identities"]),
                tuple(tuple(sorted((str(k), int(v)) for k, v in n.items()))
                      for n in obj.get("nulls", [])),
                ReadOptions(**{k: _tuples(v) for k, v in read.items()}),
                tuple(obj.get("skipped", [])),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"not a dataset index: {e}") from e


def _tuples(v: Any) -> Any:
    """JSON lists back to the tuples :class:`ReadOptions` holds."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _first_difference(a: Schema, b: Schema) -> tuple[str, str] | None:
    """``(field, detail)`` of the first difference between two schemas, else ``None``."""
    fa, fb = {f.name: f for f in a}, {f.name: f for f in b}
    for name in fa:
        if name not in fb:
            return name, "missing in the second shard"
    for name in fb:
        if name not in fa:
            return name, "missing in the first shard"
    for name, x in fa.items():
        y = fb[name]
        if x != y:
            return name, (f"dtype {x.dtype} shape {x.shape} ragged {x.ragged} vs "
                          f"dtype {y.dtype} shape {y.shape} ragged {y.ragged}")
    return None


def check_schemas(shards: Sequence[str], schemas: Sequence[Schema],
                  sizes: Sequence[int]) -> Schema:
    """The schema all shards share (field order of the first shard that has one).

    An empty shard without fields (a zero-byte tar, or a tar with no member) agrees with any
    schema.

    Raises:
        SchemaMismatchError: naming the reference shard, the first disagreeing one, and the
            field.
    """
    typed = [i for i in range(len(shards)) if schemas[i] or sizes[i]]
    if not typed:
        return ()
    ref = typed[0]
    for i in typed[1:]:
        diff = _first_difference(schemas[ref], schemas[i])
        if diff is not None:
            raise SchemaMismatchError(shards[ref], shards[i], diff[0], diff[1])
    return schemas[ref]
