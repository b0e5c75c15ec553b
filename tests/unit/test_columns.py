"""Arrow -> columnar batch conversion, concatenation and slicing; column selection."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dataflow.batch import (
    FieldSpec,
    Ragged,
    batch_len,
    concat,
    schema_from_json,
    schema_to_json,
)
from dataflow.convert.columns import (
    ReadOptions,
    hive_columns,
    hive_levels,
    hive_values,
    parse_fill,
    serving_options,
    with_extras,
    with_hive,
)
from dataflow.convert.tables import check_selection, from_arrow, schema_of_arrow
from dataflow.errors import ConfigError, SchemaError


def _table(n: int = 10) -> pa.Table:
    images = np.arange(n * 6, dtype=np.uint8).reshape(n, 2, 3)
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
        "flat": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4),
        "text": pa.array([f"t{i}" * i for i in range(n)]),
        "blob": pa.array([bytes([i]) * i for i in range(n)], type=pa.large_binary()),
        "ints": pa.array([list(range(i)) for i in range(n)], type=pa.list_(pa.int32())),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
    })


def test_schema_of_arrow_and_json_round_trip() -> None:
    schema = schema_of_arrow(_table().schema)
    assert schema == (
        FieldSpec("id", "int64"),
        FieldSpec("image", "uint8", (2, 3)),
        FieldSpec("flat", "float32", (4,)),
        FieldSpec("text", "uint8", ragged="str"),
        FieldSpec("blob", "uint8", ragged="bytes"),
        FieldSpec("ints", "int32", ragged="list"),
        FieldSpec("flag", "bool"),
    )
    assert schema_from_json(schema_to_json(schema)) == schema


@pytest.mark.parametrize("start, stop", [(0, 10), (3, 7), (9, 10), (4, 4)])
def test_from_arrow_slices_match_rows(start: int, stop: int) -> None:
    batch = from_arrow(_table().slice(start, stop - start))
    assert batch_len(batch) == stop - start
    assert batch["id"].tolist() == list(range(start, stop))
    assert batch["image"].shape == (stop - start, 2, 3)
    assert batch["image"].reshape(-1).tolist() == list(range(start * 6, stop * 6))
    assert batch["flat"].shape == (stop - start, 4)
    rows = range(stop - start)
    assert [batch["text"][i] for i in rows] == [f"t{i}" * i for i in range(start, stop)]
    assert [batch["blob"][i] for i in rows] == [bytes([i]) * i for i in range(start, stop)]
    assert [batch["ints"][i].tolist() for i in rows] == [list(range(i)) for i in range(start, stop)]
    assert batch["flag"].tolist() == [i % 2 == 0 for i in range(start, stop)]


def test_concat_of_parts_is_the_whole() -> None:
    table = _table()
    whole = from_arrow(table)
    parts = [from_arrow(table.slice(0, 3)), from_arrow(table.slice(3, 0)),
             from_arrow(table.slice(3, 7))]
    joined = concat(parts)
    for name, col in whole.items():
        if isinstance(col, Ragged):
            assert joined[name].offsets.tolist() == col.offsets.tolist()
            assert joined[name].values.tolist() == col.values.tolist()
        else:
            assert np.array_equal(joined[name], col)


def test_nulls_and_unsupported_types_name_the_field() -> None:
    with pytest.raises(SchemaError, match="'x'.*null"):
        from_arrow(pa.table({"x": pa.array([1, None])}))
    with pytest.raises(SchemaError, match="'m'.*unsupported.*--drop-columns m"):
        from_arrow(pa.table({"m": pa.array([[(1, 2)]], type=pa.map_(pa.int8(), pa.int8()))}))


def test_column_selection_by_name_or_parent_and_pandas_index_left_out() -> None:
    t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"id": [1], "image": pa.array([{"bytes": b"x", "path": "p"}], type=t),
                      "__index_level_0__": [7]})
    assert [f.name for f in schema_of_arrow(table.schema)] == ["id", "image.bytes", "image.path"]
    only = ReadOptions(columns=("image",), drop=("image.path",))
    assert list(from_arrow(table, None, only)) == ["image.bytes"]
    asked = ReadOptions(columns=("id", "__index_level_0__"))
    assert from_arrow(table, None, asked)["__index_level_0__"].tolist() == [7]
    with pytest.raises(SchemaError, match="--drop-columns 'nope'.*no such field in s.arrow"):
        check_selection(table.schema, ReadOptions(drop=("nope",)), "s.arrow")
    check_selection(table.schema, only, "s.arrow")


@pytest.mark.parametrize("kwargs, match", [
    ({"nulls": "zero"}, "`nulls`"), ({"columns": ()}, "`columns`"),
    ({"fill": (("a", "1"), ("a", "2"))}, "`fill`"), ({"decimal": "int"}, "`decimal`")])
def test_read_options_are_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReadOptions(**kwargs)


def test_parse_fill() -> None:
    assert parse_fill(["label=-1", "text="]) == (("label", "-1"), ("text", ""))
    with pytest.raises(ConfigError, match="FIELD=VALUE"):
        parse_fill(["label"])


def test_hive_levels_and_columns() -> None:
    shards = ["/d/year=2024/lang=en/a.parquet", "/d/year=2025/lang=de/b.parquet"]
    assert hive_levels(shards, "/d/") == (("year", "int64"), ("lang", "str"))
    opts = ReadOptions(hive=hive_levels(shards, "/d/"), hive_root="/d/")
    cols = hive_columns(shards[1], opts, 3)
    assert cols["year"].tolist() == [2025] * 3 and [cols["lang"][i] for i in range(3)] == ["de"] * 3
    with pytest.raises(SchemaError, match="hive partitions: /d/x.parquet is under"):
        hive_levels([shards[0], "/d/x.parquet"], "/d/")
    assert hive_levels(["/d/a.parquet"], "/d/") == ()


def test_serving_options_mask_or_refuse_nulls() -> None:
    nulls = {"a": 2, "b": 0, "c": 1, "t[]": 1}
    with pytest.raises(SchemaError, match="'t': 1 null item.*--fill-value t=VALUE"):
        serving_options(ReadOptions(), nulls)
    opts = serving_options(ReadOptions(fill=(("c", "0"), ("t", "0"))), nulls)
    assert opts.masked == ("a",)
    with pytest.raises(SchemaError, match="'a': 2 null value.*--fill-value a=VALUE"):
        serving_options(ReadOptions(nulls="fill", fill=(("t", "0"),)), nulls)


def test_server_flags_make_read_options(capsys: pytest.CaptureFixture[str]) -> None:
    from dataflow.server.flags import parse_args

    config = parse_args(["--data", "d", "--columns", "image", "id", "--drop-columns",
                         "image.path", "--fill-value", "label=-1", "--nulls", "fill",
                         "--dictionary", "codes", "--decimal", "str", "--index-columns",
                         "--split", "train"])
    assert config.read == ReadOptions(columns=("image", "id"), drop=("image.path",),
                                      nulls="fill", fill=(("label", "-1"),),
                                      dictionary="codes", decimal="str", index_columns=True)
    assert config.split == "train"
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--fill-value", "label"])
    assert "--fill-value must be FIELD=VALUE" in capsys.readouterr().err


def test_a_ragged_column_is_indexed_as_a_sequence() -> None:
    r = Ragged(np.frombuffer(b"abcdef", dtype=np.uint8), np.array([0, 1, 3, 6]), "str")
    assert [r[i] for i in range(3)] == ["a", "bc", "def"] == [r[i] for i in range(-3, 0)]
    for i in (3, -4):
        with pytest.raises(IndexError, match=f"sample {i} of a ragged column of 3"):
            r[i]


def test_hive_values_are_uri_decoded_and_null_partitions_masked_or_filled() -> None:
    shards = ["/d/city=New%20York/k=1/a.parquet",
              "/d/city=a%2Fb/k=__HIVE_DEFAULT_PARTITION__/b.parquet",
              "/d/city=__HIVE_DEFAULT_PARTITION__/k=3/c.parquet"]
    assert hive_values(shards[1], "/d/") == [("city", "a/b"), ("k", None)]
    assert hive_levels(shards, "/d/") == (("city", "str"), ("k", "int64"))
    opts = with_hive(ReadOptions(), shards, "/d/")
    assert opts.masked == ("city", "k")
    cols = hive_columns(shards[1], opts, 2)
    assert [cols["city"][i] for i in range(2)] == ["a/b"] * 2 and cols["city.valid"].all()
    assert cols["k"].tolist() == [0, 0] and not cols["k.valid"].any()
    assert [f.name for f in with_extras((), opts)] == ["city", "city.valid", "k", "k.valid"]
    filled = with_hive(ReadOptions(fill=(("k", "-1"),), drop=("city",)), shards, "/d/")
    assert filled.masked == ()
    assert {k: v.tolist() for k, v in hive_columns(shards[1], filled, 1).items()} == {"k": [-1]}
    assert serving_options(opts, {"x": 1}).masked == ("x", "city", "k")
    with pytest.raises(SchemaError, match=r"'city': /d/city=__HIVE_DEFAULT_PARTITION__/k=3/c"
                                          r"\.parquet is under a null value.*--fill-value city"):
        with_hive(ReadOptions(nulls="fill", fill=(("k", "0"),)), shards, "/d/")
    with pytest.raises(SchemaError, match="'k': its values are integers, but its fill value 'x'"):
        with_hive(ReadOptions(fill=(("k", "x"),)), shards, "/d/")
