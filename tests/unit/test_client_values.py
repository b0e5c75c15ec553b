"""Variable-length fields back as Python values (dataflow.client.values), and torch's
DataLoader arguments refused naming dataflow's equivalent (dataflow.client.compat)."""

from __future__ import annotations

import pytest
import torch

from dataflow.client import DataLoader
from dataflow.client.compat import EQUIVALENTS
from dataflow.client.values import byte_strings, rows, string_lists, strings
from dataflow.errors import ConfigError, SchemaError


def _ragged(items: list[bytes]) -> dict[str, torch.Tensor]:
    flat = b"".join(items)
    ends = [0]
    for item in items:
        ends.append(ends[-1] + len(item))
    return {"text": torch.frombuffer(bytearray(flat), dtype=torch.uint8) if flat
            else torch.zeros(0, dtype=torch.uint8),
            "text.offsets": torch.tensor(ends, dtype=torch.int64)}


def test_text_and_bytes_come_back_per_sample() -> None:
    batch = _ragged(["héllo".encode(), b"", b"x"])
    assert strings(batch, "text") == ["héllo", "", "x"]
    assert byte_strings(batch, "text") == ["héllo".encode(), b"", b"x"]
    assert [r.tolist() for r in rows(batch, "text")] == [list("héllo".encode()), [], [120]]


def test_a_list_of_strings_comes_back_per_sample() -> None:
    batch = _ragged([b"abc", b"", b"def"])
    batch["text.lengths1"] = torch.tensor([1, 2, 0, 3], dtype=torch.int64)
    batch["text.lengths1.offsets"] = torch.tensor([0, 2, 3, 4], dtype=torch.int64)
    assert string_lists(batch, "text") == [["a", "bc"], [""], ["def"]]


def test_bad_fields_are_named() -> None:
    batch = _ragged([b"ab", b"c"])
    batch["label"] = torch.tensor([1, 2])
    with pytest.raises(SchemaError, match=r"no field 'nope'; its fields: \['label', 'text'\]"):
        strings(batch, "nope")
    with pytest.raises(SchemaError, match="no variable-length field 'label'"):
        rows(batch, "label")
    with pytest.raises(SchemaError, match="'text' is not a list of strings"):
        string_lists(batch, "text")
    bad = dict(batch, **{"text.offsets": torch.tensor([0, 3, 2])})
    with pytest.raises(SchemaError, match="offsets do not describe its 3 values"):
        rows(bad, "text")
    with pytest.raises(SchemaError, match="sample 1 of the batch: not UTF-8"):
        strings(_ragged([b"ok", b"\xff"]), "text")
    floats = {"x": torch.zeros(2), "x.offsets": torch.tensor([0, 1, 2])}
    with pytest.raises(SchemaError, match="holds torch.float32 values, not bytes"):
        byte_strings(floats, "x")


@pytest.mark.parametrize("name", sorted(EQUIVALENTS))
def test_torch_only_arguments_name_dataflows_equivalent(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"`{name}` is an argument of torch's DataLoader, "
                                          r"not of dataflow's: use "):
        DataLoader("tcp://127.0.0.1:1", batch_size=4, **{name: 2})


def test_an_unknown_argument_is_a_type_error_and_collate_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        DataLoader("tcp://127.0.0.1:1", batch_size=4, batchsize=2)
    with pytest.raises(ConfigError, match="`collate_fn` must be a function of a batch"):
        DataLoader("tcp://127.0.0.1:1", batch_size=4, collate_fn="stack")
