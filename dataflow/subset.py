"""A client's column subset: which fields of a batch it keeps.

A HELLO may name ``columns``: served field names or parent names, matched as the server's
``--columns`` matches them (:func:`dataflow.convert.columns.is_under`): ``image`` keeps
``image.bytes`` and ``image.path``. What goes with a field is named under it, so it is kept
with it: a nullable field's ``.valid`` mask, a nested list's ``.lengths<j>``, and, in a
client's batch, a ragged field's ``.offsets`` (a server's batch holds those inside the field's
:class:`~dataflow.batch.Ragged`). The server keeps a session's subset of every batch after its
transform ran, so the transform sees every served field.

Pure functions of field names and batch dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from dataflow.convert.columns import is_under
from dataflow.errors import SchemaError

T = TypeVar("T")


def unmatched(columns: Iterable[str], names: Iterable[str]) -> list[str]:
    """The names of ``columns`` that are neither one of ``names`` nor a parent of one, in
    ``columns`` order."""
    fields = list(names)
    return [c for c in columns if not any(is_under(f, c) for f in fields)]


def select(batch: Mapping[str, T], columns: Sequence[str]) -> dict[str, T]:
    """The fields of ``batch`` that ``columns`` names or is a parent of, in ``batch`` order.

    Args:
        batch: field name -> column (a server's arrays and ``Ragged`` columns, or a client's
            tensors with their ``.offsets``).
        columns: field names or parent names, at least one.

    Raises:
        SchemaError: a name of ``columns`` matches no field of ``batch`` (naming it and the
            batch's fields).
    """
    missing = unmatched(columns, batch)
    if missing:
        raise SchemaError(f"column(s) {missing} asked for match no field of the batch; it "
                          f"holds {list(batch)}")
    return {name: col for name, col in batch.items()
            if any(is_under(name, c) for c in columns)}
