"""Hugging Face save_to_disk layouts: DatasetDict splits and state.json shard order."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from dataflow.errors import SpecError
from dataflow.index import DatasetIndex
from dataflow.index.scan import build_index
from dataflow.index.splits import dataset_shards


@pytest.fixture(scope="module")
def dataset_dict(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf") / "dd"
    train = datasets.Dataset.from_dict({"id": list(range(30)), "label": [1, None, 0] * 10})
    test = datasets.Dataset.from_dict({"id": list(range(100, 105)), "label": [0] * 5})
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(
        str(root), num_shards={"train": 3, "test": 1})
    return root


def test_a_dataset_dict_root_needs_a_split(dataset_dict: Path) -> None:
    with pytest.raises(SpecError, match=r"DatasetDict with splits \['train', 'test'\].*--split"):
        dataset_shards(str(dataset_dict))
    with pytest.raises(SpecError, match=r"no split 'dev'; its splits are \['train', 'test'\]"):
        dataset_shards(str(dataset_dict), "dev")
    with pytest.raises(SpecError, match="no spec is a Hugging Face DatasetDict"):
        dataset_shards(str(dataset_dict / "train"), "train")


def test_split_by_flag_or_path_gives_the_state_json_shards(dataset_dict: Path) -> None:
    by_flag, root = dataset_shards(str(dataset_dict), "train")
    by_path, _ = dataset_shards(str(dataset_dict / "train"))
    assert by_flag == by_path and root == str(dataset_dict / "train") + "/"
    assert [Path(s).name for s in by_flag] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    index = build_index(str(dataset_dict), split="test")
    assert index.total == 5


def test_state_json_order_wins_over_names_and_stray_files_are_left_out(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"id": list(range(6))}).save_to_disk(str(tmp_path), num_shards=2)
    state = json.loads((tmp_path / "state.json").read_text())
    state["_data_files"].reverse()
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "stray.arrow").write_bytes(b"not a shard")
    shards, _ = dataset_shards(str(tmp_path))
    assert [Path(s).name for s in shards] == ["data-00001-of-00002.arrow",
                                              "data-00000-of-00002.arrow"]
    (tmp_path / "state.json").write_text('{"_data_files": "x"}')
    with pytest.raises(SpecError, match="state.json: `_data_files`"):
        dataset_shards(str(tmp_path))


def test_the_index_counts_nulls_per_shard_and_round_trips(dataset_dict: Path) -> None:
    index = build_index(str(dataset_dict), split="train")
    assert index.null_totals() == {"label": 10}
    assert index.read.masked == ("label",)
    assert [f.name for f in index.schema] == ["id", "label", "label.valid"]
    assert DatasetIndex.from_json(index.to_json()) == index
