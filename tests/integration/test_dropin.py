"""What a torch user reaches for, end to end with a real server over real Parquet: a
``collate_fn`` run in the trainer, text and lists of strings back as Python values, the
loader pickled and re-created from its configuration."""

from __future__ import annotations

import pickle
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dataflow.client import DataLoader
from dataflow.client.values import string_lists, strings

TOTAL = 37


def _words(i: int) -> list[str]:
    return [f"w{i}-{j}é" for j in range(i % 4)]


@pytest.fixture
def served(tmp_path, servers) -> str:
    ids = list(range(TOTAL))
    table = pa.table({"id": ids, "title": [f"title {i} ✓" for i in ids],
                      "words": pa.array([_words(i) for i in ids], type=pa.list_(pa.string()))})
    pq.write_table(table.slice(0, 20), tmp_path / "a.parquet")
    pq.write_table(table.slice(20), tmp_path / "b.parquet")
    return servers([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]).endpoint


def as_python(batch: dict[str, torch.Tensor]) -> list[tuple[int, str, list[str]]]:
    """A collate_fn: the batch as one tuple of Python values per sample."""
    return list(zip(batch["id"].tolist(), strings(batch, "title"),
                    string_lists(batch, "words"), strict=True))


class FailsOnce:
    """A collate_fn that raises on its second batch, after noting the batch's ids."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, batch: dict[str, torch.Tensor]) -> list[int]:
        ids = batch["id"].tolist()
        self.batches.append(ids)
        if len(self.batches) == 2:
            raise ValueError("a bad batch")
        return ids


@pytest.mark.timeout(60)
def test_collate_fn_gives_python_values_of_every_sample_once(served) -> None:
    with DataLoader(served, batch_size=5, rank=0, world_size=1, drop_last=True, timeout=30,
                    collate_fn=as_python) as dl:
        assert (dl.batch_size, dl.drop_last) == (5, True)
        got = [sample for batch in dl for sample in batch]
    assert len(got) == TOTAL - TOTAL % 5
    assert all(title == f"title {i} ✓" and words == _words(i) for i, title, words in got)
    assert len({i for i, _, _ in got}) == len(got)


@pytest.mark.timeout(60)
def test_an_error_in_collate_fn_costs_its_batch_only(served) -> None:
    collate = FailsOnce()
    returned: list[int] = []
    errors = 0
    with DataLoader(served, batch_size=4, rank=0, world_size=1, timeout=30,
                    collate_fn=collate) as dl:
        it = iter(dl)
        while True:
            try:
                returned += next(it)
            except StopIteration:
                break
            except ValueError:
                errors += 1
        assert len(collate.batches) == len(dl)
    assert errors == 1
    assert Counter(i for ids in collate.batches for i in ids) == Counter(range(TOTAL))
    assert returned == [i for n, ids in enumerate(collate.batches) if n != 1 for i in ids]


@pytest.mark.timeout(60)
def test_a_pickled_loader_is_recreated_from_its_configuration(served) -> None:
    with DataLoader(served, batch_size=6, rank=0, world_size=1, seed=5, timeout=30,
                    collate_fn=as_python) as dl:
        first = [i for batch in dl for i, _, _ in batch]
        copy = pickle.loads(pickle.dumps(dl))
    with copy:
        assert copy.config == dl.config
        again = [i for batch in copy for i, _, _ in batch]
    assert again == first and sorted(set(first)) == list(range(TOTAL))
