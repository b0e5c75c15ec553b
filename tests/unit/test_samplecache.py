"""The readers' decoded-sample cache: split/assemble round trips, the byte bound, LRU order."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.batch import Ragged
from dataflow.errors import ConfigError, TransformError
from dataflow.server.samplecache import (
    ENTRY_OVERHEAD,
    FIELD_OVERHEAD,
    CacheCounts,
    SampleCache,
    assemble,
    sample_bytes,
    split,
)


def _batch(n: int, first: int = 0) -> dict:
    ids = np.arange(first, first + n, dtype=np.int64)
    lengths = (ids % 4).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return {"id": ids, "img": np.repeat(ids, 6).astype(np.uint8).reshape(n, 2, 3),
            "txt": Ragged(np.arange(offsets[-1], dtype=np.uint8), offsets, "bytes")}


def _equal(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for name, col in a.items():
        other = b[name]
        if isinstance(col, Ragged):
            if not (isinstance(other, Ragged) and col.kind == other.kind
                    and np.array_equal(col.values, other.values)
                    and np.array_equal(col.offsets, other.offsets)):
                return False
        elif not (col.dtype == other.dtype and np.array_equal(col, other)):
            return False
    return True


@pytest.mark.parametrize("n", [1, 2, 7])
def test_split_then_assemble_gives_the_batch_back_in_any_grouping(n: int) -> None:
    batch = _batch(n)
    samples = split(batch)
    assert len(samples) == n
    assert _equal(assemble(samples, "t"), batch)
    # Samples of two batches, interleaved, assemble to the batch of that order.
    other = split(_batch(3, 100))
    mixed = [other[0], *samples, other[2]]
    ids = assemble(mixed, "t")["id"].tolist()
    assert ids == [100, *range(n), 102]


def test_entries_are_copies_that_do_not_keep_the_batch_alive() -> None:
    batch = _batch(4)
    sample = split(batch)[1]
    batch["img"][:] = 0
    assert int(sample[1][1].sum()) == 6
    assert all(values.base is None for _, values, _ in sample)


def test_the_cache_keeps_copies_of_samples_that_view_their_batch() -> None:
    batch = _batch(4)
    views = split(batch, copy=False)
    assert all(np.shares_memory(values, batch["img"]) for _, values, _ in views[1][1:2])
    cache = SampleCache(1 << 20)
    for row, sample in enumerate(views):
        assert cache.put((0, row), sample)
    batch["img"][:] = 0
    batch["txt"].values[:] = 0
    held = [cache.get((0, row)) for row in range(4)]
    assert all(sample is not None for sample in held)
    assert _equal(assemble(held, "t"), _batch(4))


def test_an_entry_counts_its_arrays_bytes_and_fixed_allowances() -> None:
    sample = split(_batch(4))[3]
    assert sample_bytes(sample) == ENTRY_OVERHEAD + 3 * FIELD_OVERHEAD + 8 + 6 + 3


def test_samples_that_disagree_are_a_transform_error_naming_the_place() -> None:
    a = split({"x": np.zeros((1, 2), np.float32)})[0]
    b = split({"x": np.zeros((1, 3), np.float32)})[0]
    c = split({"x": np.zeros((1, 2), np.float64)})[0]
    d = split({"y": np.zeros((1, 2), np.float32)})[0]
    for other in (b, c, d):
        with pytest.raises(TransformError, match=r"^decode on batch 3: the decode stage gave "
                                                 r"samples of different .*padding"):
            assemble([a, other], "decode on batch 3")


def _sample(nbytes: int) -> tuple:
    return (("x", np.zeros(nbytes, np.uint8), "bytes"),)


def test_the_bound_holds_evicting_the_least_recently_used_first() -> None:
    one = sample_bytes(_sample(100))
    cache = SampleCache(3 * one)
    for row in range(3):
        assert cache.put((0, row), _sample(100))
    assert cache.get((0, 0)) is not None  # row 0 is now the most recently used
    assert cache.put((0, 3), _sample(100))
    assert cache.get((0, 1)) is None and cache.get((0, 0)) is not None
    assert cache.counts() == CacheCounts(hits=2, misses=1, evictions=1, bytes=3 * one,
                                         entries=3)


def test_an_entry_larger_than_the_bound_is_not_cached_and_evicts_nothing() -> None:
    cache = SampleCache(sample_bytes(_sample(100)))
    assert cache.put((0, 0), _sample(100))
    assert not cache.put((0, 1), _sample(101))
    assert len(cache) == 1 and cache.counts().evictions == 0


def test_putting_a_key_again_replaces_its_entry_and_its_bytes() -> None:
    cache = SampleCache(10_000)
    cache.put((1, 5), _sample(100))
    cache.put((1, 5), _sample(300))
    assert cache.counts().bytes == sample_bytes(_sample(300)) and len(cache) == 1


def test_a_stress_of_random_sizes_never_passes_the_bound() -> None:
    rng = np.random.default_rng(0)
    cache = SampleCache(50_000)
    for _ in range(3000):
        key = (int(rng.integers(0, 4)), int(rng.integers(0, 200)))
        if cache.get(key) is None:
            cache.put(key, _sample(int(rng.integers(0, 20_000))))
        counts = cache.counts()
        assert counts.bytes <= 50_000
    assert counts.evictions > 0 and counts.hits > 0


@pytest.mark.parametrize("bound", [0, -1, 1.5])
def test_the_bound_must_be_positive_bytes(bound: object) -> None:
    with pytest.raises(ConfigError, match="`cache_memory` must be a positive number of bytes"):
        SampleCache(bound)  # type: ignore[arg-type]
