"""Data written by HF datasets and pandas, served by a real server: exactly once, every field.

The HF DatasetDict holds Image(), ClassLabel with missing labels, nested sequences, Array2D and
a struct; the pandas Parquet is hive-partitioned and holds timestamps with a time zone,
categories, nullable Int64 and a named index.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from srvtools import ragged_rows

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable
from dataflow.index import DatasetIndex
from dataflow.plan import epoch_size

WORLD = 2
BATCH = 8
N_HF = 45
N_PD = 40
# hive partition values pyarrow writes URI-encoded (city=New%20York), and a null one
# (city=__HIVE_DEFAULT_PARTITION__)
CITIES = ["New York", "a/b", "São Paulo", "x%y", None]


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (2, 3), i).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    features = datasets.Features({
        "id": datasets.Value("int64"), "image": datasets.Image(),
        "label": datasets.ClassLabel(names=["cat", "dog"]),
        "boxes": datasets.Sequence(datasets.Sequence(datasets.Value("float32"))),
        "grid": datasets.Array2D((2, 3), "int32"),
        "meta": {"source": datasets.Value("string"), "score": datasets.Value("float64")},
    })
    rows = {
        "id": list(range(N_HF)),
        "image": [{"bytes": _png(i), "path": None} for i in range(N_HF)],
        "label": [None if i % 5 == 0 else i % 2 for i in range(N_HF)],
        "boxes": [[[float(i)] * (j + 1) for j in range(i % 3)] for i in range(N_HF)],
        "grid": [np.full((2, 3), i, dtype=np.int32) for i in range(N_HF)],
        "meta": [{"source": f"s{i}", "score": i / 2} for i in range(N_HF)],
    }
    root = tmp_path_factory.mktemp("hf") / "dd"
    train = datasets.Dataset.from_dict(rows, features=features)
    test = train.select(range(5))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(
        str(root), num_shards={"train": 3, "test": 1})
    return root


@pytest.fixture(scope="module")
def pandas_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pd") / "table"
    df = pd.DataFrame({
        "id": np.arange(N_PD),
        "ts": pd.date_range("2024-03-01", periods=N_PD, freq="min", tz="Europe/Paris"),
        "kind": pd.Categorical([["a", "b", None][i % 3] for i in range(N_PD)]),
        "count": pd.array([None if i % 4 == 0 else i for i in range(N_PD)], dtype="Int64"),
        "lang": ["en" if i % 2 else "fr" for i in range(N_PD)],
        "city": [CITIES[i % len(CITIES)] for i in range(N_PD)],
    }, index=pd.Index(np.arange(N_PD) * 10, name="row"))
    df.to_parquet(root, partition_cols=["lang", "city"])
    return root


def _serve_all(endpoint: str) -> list[dict]:
    """Every batch of one epoch for each of WORLD ranks, as numpy; checks equal batch counts."""
    batches = []
    counts = set()
    for rank in range(WORLD):
        with DataLoader([endpoint], batch_size=BATCH, rank=rank, world_size=WORLD,
                        timeout=30, seed=3, pin_memory=False) as dl:
            n = 0
            for batch in dl:
                batches.append({k: v.numpy() for k, v in batch.items()})
                n += 1
            counts.add(n)
    assert len(counts) == 1
    return batches


def _check_once(seen: Counter[int], total: int) -> None:
    """Every sample served; repeated only as the plan pads ranks to equal batch counts."""
    size = epoch_size(total, world_size=WORLD, batch_size=BATCH, drop_last=False)
    assert set(seen) == set(range(total))
    assert sum(seen.values()) - total == size.repeated and max(seen.values()) <= 2


@pytest.mark.timeout(120)
def test_hf_dataset_dict_served_exactly_once(hf_root: Path, servers) -> None:
    with pytest.raises(ServerUnavailable, match=r"splits \['train', 'test'\].*--split"):
        servers([str(hf_root)])
    handle = servers([str(hf_root)], extra_args=["--split", "train", "--drop-columns",
                                                 "image.path"])
    batches = _serve_all(handle.endpoint)
    seen: Counter[int] = Counter()
    for b in batches:
        ids = b["id"].tolist()
        seen.update(ids)
        images = ragged_rows(b, "image.bytes")
        boxes, box_lengths = ragged_rows(b, "boxes"), ragged_rows(b, "boxes.lengths1")
        sources = ragged_rows(b, "meta.source")
        assert "image.path" not in b
        for k, i in enumerate(ids):
            assert Image.open(io.BytesIO(images[k].tobytes())).getpixel((0, 0)) == i
            assert bool(b["label.valid"][k]) == (i % 5 != 0)
            assert b["label"][k] == (i % 2 if i % 5 else 0)
            assert box_lengths[k].tolist() == [j + 1 for j in range(i % 3)]
            assert boxes[k].tolist() == [float(i)] * sum(j + 1 for j in range(i % 3))
            assert (b["grid"][k] == i).all() and b["grid"].shape[1:] == (2, 3)
            assert sources[k].tobytes() == f"s{i}".encode() and b["meta.score"][k] == i / 2
    _check_once(seen, N_HF)


@pytest.mark.timeout(120)
def test_pandas_hive_parquet_served_exactly_once(pandas_root: Path, servers) -> None:
    handle = servers([str(pandas_root)])
    batches = _serve_all(handle.endpoint)
    seen: Counter[int] = Counter()
    start = pd.Timestamp("2024-03-01", tz="Europe/Paris").value // 1000
    for b in batches:
        assert "row" not in b and "__index_level_0__" not in b
        kinds = ragged_rows(b, "kind")
        langs = ragged_rows(b, "lang")
        cities = ragged_rows(b, "city")
        for k, i in enumerate(b["id"].tolist()):
            seen[i] += 1
            assert b["ts"][k] == start + i * 60_000_000
            assert kinds[k].tobytes() == [b"a", b"b", b""][i % 3]
            assert bool(b["kind.valid"][k]) == (i % 3 != 2)
            assert bool(b["count.valid"][k]) == (i % 4 != 0)
            assert b["count"][k] == (i if i % 4 else 0)
            assert langs[k].tobytes() == (b"en" if i % 2 else b"fr")
            city = CITIES[i % len(CITIES)]
            assert cities[k].tobytes().decode() == (city or "")
            assert bool(b["city.valid"][k]) == (city is not None)
    _check_once(seen, N_PD)


@pytest.mark.timeout(60)
def test_index_exposes_types_and_codes_option(pandas_root: Path, servers, raw_client) -> None:
    handle = servers([str(pandas_root)], extra_args=["--dictionary", "codes", "--columns",
                                                     "id", "ts", "kind", "row", "lang"])
    reply = raw_client(handle.endpoint).call(wire.Hello(1, "types"))
    assert isinstance(reply, wire.Index)
    index = DatasetIndex.from_json(reply.index_json)
    fields = {f.name: f for f in index.schema}
    assert sorted(fields) == ["id", "kind", "kind.valid", "lang", "row", "ts"]
    assert fields["ts"].meta_dict["tz"] == "Europe/Paris" and fields["ts"].meta_dict["unit"] == "us"
    assert json.loads(fields["kind"].meta_dict["categories"]) == ["a", "b"]
    assert fields["kind"].dtype == "int32"
