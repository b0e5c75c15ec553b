"""The dataset index: every shard, its sample count, and the one schema they share."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dataflow.columns import FieldSpec, Schema
from dataflow.errors import ConfigError, SchemaMismatchError
from dataflow.readers import open_shard
from dataflow.readers.base import check_on_error
from dataflow.sources import resolve

log = logging.getLogger(__name__)

MAX_OPEN_WORKERS = 8


@dataclass(frozen=True)
class DatasetIndex:
    """Shards of one dataset with their sample counts and shared schema.

    Attributes:
        shards: shard URLs/paths in dataset order.
        sizes: samples per shard, same order.
        schema: the fields every shard has.
    """

    shards: tuple[str, ...]
    sizes: tuple[int, ...]
    schema: Schema

    def __post_init__(self) -> None:
        if len(self.shards) != len(self.sizes):
            raise ConfigError(
                f"`sizes` must have one entry per shard ({len(self.shards)}). "
                f"Found: {len(self.sizes)}"
            )
        bad = [s for s in self.sizes if not isinstance(s, int) or s < 0]
        if bad:
            raise ConfigError(f"`sizes` must be non-negative ints. Found: {bad[0]!r}")

    @property
    def total(self) -> int:
        """Samples in the whole dataset."""
        return sum(self.sizes)

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the shards, sizes and schema."""
        text = json.dumps(
            {"shards": list(self.shards), "sizes": list(self.sizes),
             "schema": [f.to_json() for f in self.schema]},
            sort_keys=True,
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps({"shards": list(self.shards), "sizes": list(self.sizes),
                           "schema": [f.to_json() for f in self.schema]})

    @classmethod
    def from_json(cls, text: str) -> DatasetIndex:
        """Parse :meth:`to_json` output.

        Raises:
            ConfigError: the text is not a valid index.
        """
        try:
            obj = json.loads(text)
            return cls(
                tuple(str(s) for s in obj["shards"]),
                tuple(obj["sizes"]),
                tuple(FieldSpec.from_json(f) for f in obj["schema"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"not a dataset index: {e}") from e


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

    An empty shard without fields (a tar with no member) agrees with any schema.

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


def _count(url: str, cache_dir: str | None, on_error: str) -> tuple[int, Schema, int]:
    with open_shard(url, cache_dir=cache_dir, on_error=on_error) as r:
        return len(r), r.schema, r.skipped


def build_index(
    specs: str | Sequence[str],
    *,
    cache_dir: str | None = None,
    on_error: str = "raise",
    max_workers: int = MAX_OPEN_WORKERS,
) -> DatasetIndex:
    """Resolve specs, open every shard (in a bounded thread pool), count and check schemas.

    Args:
        specs: dataset spec(s), see :func:`dataflow.sources.resolve`.
        cache_dir: passed to :func:`dataflow.readers.open_shard`.
        on_error: passed to :func:`dataflow.readers.open_shard`; skipped samples are logged.
        max_workers: most shards opened at once.

    Raises:
        SpecError: a spec matches nothing.
        ShardReadError: a shard cannot be read.
        SchemaMismatchError: two shards disagree on a field.
        ConfigError: ``on_error`` or ``max_workers`` is invalid.
    """
    check_on_error(on_error)
    if max_workers < 1:
        raise ConfigError(f"`max_workers` must be at least 1. Found: {max_workers}")
    shards = resolve(specs)
    with ThreadPoolExecutor(min(max_workers, len(shards))) as pool:
        results = list(pool.map(lambda u: _count(u, cache_dir, on_error), shards))
    skipped = sum(r[2] for r in results)
    if skipped:
        log.warning("%d bad sample(s) skipped across %d shard(s)", skipped, len(shards))
    sizes = tuple(r[0] for r in results)
    schema = check_schemas(shards, [r[1] for r in results], sizes)
    return DatasetIndex(tuple(shards), sizes, schema)
