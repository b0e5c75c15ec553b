"""Every Arrow type HF datasets and pandas write: how it arrives in a batch, nulls included."""

from __future__ import annotations

import datetime
import decimal
import json

import numpy as np
import pyarrow as pa
import pytest

from dataflow.batch import FieldSpec
from dataflow.convert.columns import ReadOptions
from dataflow.convert.tables import base_schema, census, from_arrow, schema_of_arrow
from dataflow.errors import SchemaError


def _convert(table: pa.Table, opts: ReadOptions | None = None) -> dict:
    opts = opts if opts is not None else ReadOptions()
    return from_arrow(table, schema_of_arrow(table.schema, opts), opts)


def test_struct_flattens_to_dotted_fields_with_parent_nulls_masked() -> None:
    image = pa.array([{"bytes": b"ab", "path": "x.png"}, None, {"bytes": b"c", "path": None}],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"image": image})
    assert census(table).nulls == {"image.bytes": 1, "image.path": 2}
    opts = ReadOptions(masked=("image.bytes", "image.path"))
    assert [f.name for f in schema_of_arrow(table.schema, opts)] == [
        "image.bytes", "image.bytes.valid", "image.path", "image.path.valid"]
    batch = _convert(table, opts)
    assert [batch["image.bytes"][i] for i in range(3)] == [b"ab", b"", b"c"]
    assert batch["image.bytes.valid"].tolist() == [True, False, True]
    assert [batch["image.path"][i] for i in range(3)] == ["x.png", "", ""]
    assert batch["image.path.valid"].tolist() == [True, False, False]


def test_nested_lists_carry_inner_lengths() -> None:
    rows = [[[1.0], [2.0, 3.0]], [], [[], [4.0]], None]
    table = pa.table({"seq": pa.array(rows, type=pa.list_(pa.list_(pa.float64())))})
    opts = ReadOptions(masked=("seq",))
    schema = schema_of_arrow(table.schema, opts)
    assert schema[0].meta_dict["levels"] == '["var", "var"]'
    assert [f.name for f in schema] == ["seq", "seq.valid", "seq.lengths1"]
    batch = _convert(table, opts)
    assert [batch["seq"][i].tolist() for i in range(4)] == [[1, 2, 3], [], [4], []]
    assert [batch["seq.lengths1"][i].tolist() for i in range(4)] == [[1, 2], [], [0, 1], []]
    assert batch["seq.valid"].tolist() == [True, True, True, False]


def test_list_of_strings_is_bytes_with_string_lengths_and_sliced_input() -> None:
    table = pa.table({"tok": pa.array([["a", "bc"], ["def"], []])}).slice(1)
    batch = _convert(table)
    assert schema_of_arrow(table.schema)[0].meta_dict["item"] == "str"
    assert batch["tok"][0].tobytes() == b"def"
    assert batch["tok.lengths1"][0].tolist() == [3]
    assert len(batch["tok"]) == 2 and batch["tok"][1].size == 0


def test_list_of_structs_becomes_one_list_per_child() -> None:
    t = pa.list_(pa.struct([("a", pa.int32()), ("b", pa.string())]))
    table = pa.table({"ents": pa.array([[{"a": 1, "b": "x"}, {"a": 2, "b": "yz"}], []], type=t)})
    batch = _convert(table)
    assert batch["ents.a"][0].tolist() == [1, 2] and batch["ents.a"][1].tolist() == []
    assert batch["ents.b"][0].tobytes() == b"xyz"
    assert batch["ents.b.lengths1"][0].tolist() == [1, 2]


def test_hf_array2d_metadata_gives_a_fixed_shape_and_checks_it() -> None:
    field = pa.field("arr", pa.list_(pa.list_(pa.float32())), metadata={
        b"ARROW:extension:name": b"datasets.features.features.Array2DExtensionType",
        b"ARROW:extension:metadata": b'[[2, 3], "float32"]'})
    good = pa.Table.from_arrays([pa.array([np.ones((2, 3)).tolist()] * 2, type=field.type)],
                                schema=pa.schema([field]))
    assert base_schema(good.schema) == (FieldSpec("arr", "float32", (2, 3)),)
    assert _convert(good)["arr"].shape == (2, 2, 3)
    bad = pa.Table.from_arrays([pa.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]],
                                         type=field.type)], schema=pa.schema([field]))
    with pytest.raises(SchemaError, match="'arr'.*shape"):
        _convert(bad)


def test_fixed_size_binary_is_bytes_of_the_field_shape_sliced_masked_or_nested() -> None:
    values = [bytes(range(i, i + 6)) for i in range(5)]
    field = pa.field("img", pa.binary(6), metadata={b"dataflow.shape": b"[2, 3]"})
    table = pa.Table.from_arrays([pa.array(values, type=pa.binary(6))],
                                 schema=pa.schema([field]))
    assert base_schema(table.schema) == (FieldSpec("img", "uint8", (2, 3)),)
    part = _convert(table.slice(2, 2))["img"]
    assert part.shape == (2, 2, 3) and part.dtype == np.uint8
    assert [row.tobytes() for row in part] == values[2:4]
    plain = pa.table({"b": pa.array([b"ab", None, b"cd"], type=pa.binary(2))}).slice(1)
    batch = _convert(plain, ReadOptions(masked=("b",)))
    assert batch["b"].tolist() == [[0, 0], [99, 100]]
    assert batch["b.valid"].tolist() == [False, True]
    nested = pa.table({"s": pa.array([{"k": b"xyz"}, {"k": b"uvw"}],
                                     type=pa.struct([("k", pa.binary(3))]))})
    assert _convert(nested.slice(1))["s.k"].tolist() == [list(b"uvw")]


def test_tables_of_other_schemas_in_turn_each_convert_by_their_own() -> None:
    ints = pa.table({"x": pa.array([1, 2], type=pa.int32())})
    texts = pa.table({"x": pa.array(["a", "bc"])})
    shaped = pa.Table.from_arrays(
        [pa.array([b"abcd"], type=pa.binary(4))],
        schema=pa.schema([pa.field("x", pa.binary(4), metadata={b"dataflow.shape": b"[2, 2]"})]))
    flat = pa.table({"x": pa.array([b"abcd"], type=pa.binary(4))})
    for _ in range(2):
        assert _convert(ints)["x"].dtype == np.int32
        assert [_convert(texts)["x"][i] for i in range(2)] == ["a", "bc"]
        assert _convert(shaped)["x"].shape == (1, 2, 2)
        assert _convert(flat)["x"].shape == (1, 4)
        assert list(_convert(ints, ReadOptions(masked=("x",)))) == ["x", "x.valid"]
        assert list(_convert(ints)) == ["x"]


def test_temporal_types_are_ints_with_unit_and_tz_in_metadata() -> None:
    ts = pa.array([datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)],
                  type=pa.timestamp("ms", tz="UTC"))
    table = pa.table({"ts": ts, "d": pa.array([datetime.date(1970, 1, 3)]),
                      "dur": pa.array([datetime.timedelta(seconds=2)], type=pa.duration("s")),
                      "t": pa.array([datetime.time(0, 0, 1)], type=pa.time32("s"))})
    schema = {f.name: f for f in schema_of_arrow(table.schema)}
    assert schema["ts"].dtype == "int64" and schema["ts"].meta_dict["unit"] == "ms"
    assert schema["ts"].meta_dict["tz"] == "UTC"
    assert schema["d"].dtype == "int32" and schema["d"].meta_dict["unit"] == "day"
    batch = _convert(table)
    assert batch["ts"].tolist() == [1704067200000]
    assert batch["d"].tolist() == [2] and batch["dur"].tolist() == [2]
    assert batch["t"].tolist() == [1]


def test_dictionary_values_or_codes_among_the_dataset_categories() -> None:
    table = pa.table({"c": pa.array(["b", "a", None, "b"]).dictionary_encode()})
    batch = _convert(table, ReadOptions(masked=("c",)))
    assert [batch["c"][i] for i in range(4)] == ["b", "a", "", "b"]
    assert batch["c.valid"].tolist() == [True, True, False, True]
    opts = ReadOptions(dictionary="codes", masked=("c",))
    assert census(table, opts).categories == {"c": {"a", "b"}}
    with pytest.raises(SchemaError, match="'c'.*categories"):
        _convert(table, opts)
    # Another shard's dictionary knew "z" too: codes follow the dataset's sorted categories.
    opts = ReadOptions(dictionary="codes", categories=(("c", ("a", "b", "z")),),
                       fill=(("c", "-1"),))
    assert _convert(table, opts)["c"].tolist() == [1, 0, -1, 1]
    assert json.loads(schema_of_arrow(table.schema, opts)[0].meta_dict["categories"]) == [
        "a", "b", "z"]
    with pytest.raises(SchemaError, match="'c'.*not among the categories"):
        _convert(table, ReadOptions(dictionary="codes", categories=(("c", ("a",)),),
                                    fill=(("c", "-1"),)))


def test_decimal_refused_with_a_way_out_or_served_as_chosen() -> None:
    table = pa.table({"price": pa.array([decimal.Decimal("1.25")])})
    with pytest.raises(SchemaError, match="'price'.*--decimal float64.*--drop-columns price"):
        schema_of_arrow(table.schema)
    assert _convert(table, ReadOptions(decimal="float64"))["price"].tolist() == [1.25]
    assert _convert(table, ReadOptions(decimal="str"))["price"][0] == "1.25"


def test_large_and_view_types() -> None:
    table = pa.table({"ls": pa.array(["x"], type=pa.large_string()),
                      "sv": pa.array(["yz"], type=pa.string_view()),
                      "ll": pa.array([[1, 2]], type=pa.large_list(pa.int16())),
                      "h": pa.array(np.array([1.5], dtype=np.float16))})
    batch = _convert(table)
    assert batch["ls"][0] == "x" and batch["sv"][0] == "yz"
    assert batch["ll"][0].tolist() == [1, 2] and batch["h"].dtype == np.float16


def test_fill_values_and_null_items() -> None:
    table = pa.table({"label": pa.array([1, None, 3]), "tags": pa.array([[1, None], None, [2]])})
    assert census(table).nulls == {"label": 1, "tags": 1, "tags[]": 1}
    opts = ReadOptions(fill=(("label", "-1"), ("tags", "0")))
    batch = _convert(table, opts)
    assert batch["label"].tolist() == [1, -1, 3] and "label.valid" not in batch
    assert [batch["tags"][i].tolist() for i in range(3)] == [[1, 0], [], [2]]
    with pytest.raises(SchemaError, match="'tags'.*null item"):
        _convert(table, ReadOptions(fill=(("label", "-1"),), masked=("tags",)))
    with pytest.raises(SchemaError, match="--fill-value label=abc"):
        _convert(table, ReadOptions(fill=(("label", "abc"), ("tags", "0"))))


def test_a_masked_null_is_nan_in_float_fields_and_zero_or_empty_elsewhere() -> None:
    table = pa.table({
        "f64": pa.array([1.5, None]), "f32": pa.array([None, 2.0], type=pa.float32()),
        "f16": pa.array(np.array([1.0, 0.0], dtype=np.float16), mask=np.array([False, True])),
        "vec": pa.array([[1.0, 2.0], None], type=pa.list_(pa.float32(), 2)),
        "i": pa.array([None, 7]), "b": pa.array([True, None]), "s": pa.array(["a", None]),
        "ts": pa.array([None, 5], type=pa.timestamp("ms")),
    })
    opts = ReadOptions(masked=tuple(table.column_names))
    batch = _convert(table, opts)
    assert np.isnan(batch["f64"][1]) and np.isnan(batch["f32"][0]) and np.isnan(batch["f16"][1])
    assert np.isnan(batch["vec"][1]).all() and batch["vec"][0].tolist() == [1.0, 2.0]
    assert batch["i"][0] == 0 and not batch["b"][1] and batch["s"][1] == ""
    assert batch["ts"][0] == 0
    assert all(batch[f"{n}.valid"].tolist().count(False) == 1 for n in table.column_names)
    filled = _convert(table.select(["f64"]), ReadOptions(fill=(("f64", "0"),)))
    assert filled["f64"].tolist() == [1.5, 0.0]


def test_unmasked_unfilled_nulls_and_null_type_are_refused_naming_the_field() -> None:
    with pytest.raises(SchemaError, match="'x'.*null value"):
        from_arrow(pa.table({"x": pa.array([1, None])}))
    with pytest.raises(SchemaError, match="'empty'.*every value is null.*--drop-columns"):
        schema_of_arrow(pa.table({"empty": pa.array([None, None])}).schema)


def test_hf_class_label_names_in_metadata() -> None:
    features = {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}
    schema = pa.schema([("label", pa.int64())],
                       metadata={b"huggingface": json.dumps({"info": {"features": features}})})
    assert json.loads(base_schema(schema)[0].meta_dict["class_names"]) == ["cat", "dog"]


@pytest.mark.parametrize("stats", [True, False])
def test_parquet_null_census_with_or_without_statistics(tmp_path, stats: bool) -> None:
    import pyarrow.parquet as pq

    from dataflow.readers import open_shard

    table = pa.table({"a": pa.array([1, None, 3, None]), "b": pa.array(["x", "y", "z", "w"]),
                      "s": pa.array([{"k": 1}, None, {"k": None}, {"k": 4}])})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=2, write_statistics=stats)
    with open_shard(path) as r:
        assert r.census().nulls == {"a": 2, "s.k": 2}
    opts = ReadOptions(masked=("a", "s.k"), columns=("a", "s"))
    with open_shard(path, options=opts) as r:
        batch = r.read(1, 4)
    assert list(batch) == ["a", "a.valid", "s.k", "s.k.valid"]
    assert batch["a"].tolist() == [0, 3, 0] and batch["s.k.valid"].tolist() == [False, False, True]


def test_parquet_census_meets_damage_as_reads_do(tmp_path) -> None:
    import pyarrow.parquet as pq

    from dataflow.errors import ShardReadError
    from dataflow.readers import open_shard

    path = str(tmp_path / "d.parquet")
    x = pa.array([None if i % 10 == 0 else i for i in range(40)], type=pa.int64())
    pq.write_table(pa.table({"x": x}), path, row_group_size=10, compression="none",
                   use_dictionary=False, write_page_checksum=True, write_statistics=False)
    col = pq.ParquetFile(path).metadata.row_group(2).column(0)
    with open(path, "r+b") as f:
        f.seek(col.data_page_offset + col.total_compressed_size - 8)
        f.write(b"\x63")
    with open_shard(path) as r, pytest.raises(ShardReadError, match=r"row group 2 .*nulls"):
        r.census()
    with open_shard(path, on_error="skip", options=ReadOptions(masked=("x",))) as r:
        assert r.census().nulls == {"x": 3}
        batch = r.read(0, 40)
        assert len(batch["x"]) == 30 and r.skipped == 10
        assert batch["x.valid"].tolist().count(False) == 3
