"""A client's column subset: which fields of a batch it keeps (server and client batches)."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.batch import Ragged
from dataflow.convert.columns import ReadOptions, is_under
from dataflow.errors import SchemaError
from dataflow.subset import select, unmatched

N = 3


def _ragged(kind: str = "bytes") -> Ragged:
    return Ragged(np.arange(6, dtype=np.uint8), np.array([0, 1, 3, 6], dtype=np.int64), kind)


SERVER_BATCH = {  # a reader's batch: ragged offsets live inside each Ragged
    "id": np.arange(N, dtype=np.int64),
    "image.bytes": _ragged(),
    "image.path": _ragged("str"),
    "images": np.zeros((N, 2), dtype=np.uint8),
    "label": np.arange(N, dtype=np.int64),
    "label.valid": np.array([True, False, True]),
    "boxes": _ragged("list"),
    "boxes.lengths1": _ragged("list"),
}
CLIENT_BATCH = {  # a DataLoader's batch: a ragged field is two entries
    "id": np.arange(N, dtype=np.int64),
    "text": np.arange(5, dtype=np.uint8),
    "text.offsets": np.array([0, 1, 3, 5], dtype=np.int64),
    "meta.source": np.arange(4, dtype=np.uint8),
    "meta.source.offsets": np.array([0, 0, 2, 4], dtype=np.int64),
    "meta.source.valid": np.array([False, True, True]),
    "meta.score": np.ones(N),
    "count": np.arange(N, dtype=np.int64),
    "count.valid": np.ones(N, dtype=bool),
}


@pytest.mark.parametrize("batch, columns, kept", [
    (SERVER_BATCH, ["id"], ["id"]),
    (SERVER_BATCH, ["image"], ["image.bytes", "image.path"]),
    (SERVER_BATCH, ["image.path", "id"], ["id", "image.path"]),
    (SERVER_BATCH, ["images"], ["images"]),
    (SERVER_BATCH, ["label"], ["label", "label.valid"]),
    (SERVER_BATCH, ["label.valid"], ["label.valid"]),
    (SERVER_BATCH, ["boxes"], ["boxes", "boxes.lengths1"]),
    (SERVER_BATCH, ["label", "label.valid", "image"],
     ["image.bytes", "image.path", "label", "label.valid"]),
    (SERVER_BATCH, list(SERVER_BATCH), list(SERVER_BATCH)),
    (CLIENT_BATCH, ["text"], ["text", "text.offsets"]),
    (CLIENT_BATCH, ["meta"], ["meta.source", "meta.source.offsets", "meta.source.valid",
                              "meta.score"]),
    (CLIENT_BATCH, ["meta.score", "id"], ["id", "meta.score"]),
    (CLIENT_BATCH, ["count"], ["count", "count.valid"]),
], ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_select_keeps_the_named_fields_with_what_goes_with_them(batch: dict, columns: list[str],
                                                                 kept: list[str]) -> None:
    out = select(batch, columns)
    assert list(out) == kept  # in batch order, whatever the order of `columns`
    assert all(out[k] is batch[k] for k in kept)  # the columns themselves, never copies


@pytest.mark.parametrize("columns, missing", [
    (["nope"], ["nope"]),
    (["id", "imag", "label.mask"], ["imag", "label.mask"]),
    (["image.bytes.x"], ["image.bytes.x"]),
    (["boxes.lengths"], ["boxes.lengths"]),
])
def test_unknown_names_are_an_error_naming_them(columns: list[str], missing: list[str]) -> None:
    assert unmatched(columns, SERVER_BATCH) == missing
    with pytest.raises(SchemaError, match="column") as info:
        select(SERVER_BATCH, columns)
    assert str(missing) in str(info.value) and "'image.bytes'" in str(info.value)


def test_matching_is_the_servers_column_selection() -> None:
    assert is_under("image.bytes", "image") and is_under("image", "image")
    assert not is_under("images", "image") and not is_under("image", "image.bytes")
    options = ReadOptions(columns=("image", "label"))
    for name in SERVER_BATCH:
        assert options.wanted(name) == (name in select(SERVER_BATCH, ["image", "label"]))
    assert unmatched(["a"], []) == ["a"] and unmatched([], ["a"]) == []
