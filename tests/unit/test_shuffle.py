"""Shuffle quality and locality of the epoch's global order (pure; no timing)."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.bench.experiments.mixing import distinct_classes, kept_pairs
from dataflow.errors import ConfigError
from dataflow.plan import Range, rank_batches
from dataflow.shuffle import Shuffle, as_shuffle, epoch_order

CLASSES, PER_CLASS, SHARDS, BATCH = 100, 400, 20, 256
SIZES = [CLASSES * PER_CLASS // SHARDS] * SHARDS  # class-sorted: shard s holds 5 classes
TOTAL = CLASSES * PER_CLASS


def _batch_ids(batches: list[list[Range]]) -> list[np.ndarray]:
    return [np.concatenate([np.arange(r.shard * SIZES[0] + r.start, r.shard * SIZES[0] + r.stop)
                            for r in batch]) for batch in batches]


def _plan_batches(epoch: int, **kw: object) -> list[np.ndarray]:
    return _batch_ids(list(rank_batches(SIZES, world_size=1, rank=0, epoch=epoch, seed=0,
                                        batch_size=BATCH, drop_last=True, **kw)))


def _numpy_batches(epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng(epoch).permutation(TOTAL)
    return list(order[: TOTAL // BATCH * BATCH].reshape(-1, BATCH))


LABELS = np.arange(TOTAL) // PER_CLASS


def _distinct_classes(batches: list[np.ndarray]) -> float:
    return distinct_classes(batches, LABELS)


def _kept_pairs(first: list[np.ndarray], second: list[np.ndarray]) -> float:
    return kept_pairs(first, second, TOTAL)


def test_default_mixes_like_a_full_shuffle() -> None:
    full = _distinct_classes(_numpy_batches(0))
    ours = _distinct_classes(_plan_batches(0))
    assert full > 85
    assert ours >= 0.9 * full
    assert _kept_pairs(_plan_batches(0), _plan_batches(1)) < 0.012
    assert _kept_pairs(_numpy_batches(0), _numpy_batches(1)) < 0.012


def test_default_mixes_like_a_full_shuffle_beyond_2_18_samples() -> None:
    """1M class-sorted samples (1,024 shards, 1,000 classes, a shard holding about one):
    the default still mixes like a full shuffle, where a 2^18-sample window falls short."""
    shards, per_shard, classes = 1024, 1024, 1000
    total = shards * per_shard
    labels = np.arange(total) * classes // total
    sizes = [per_shard] * shards

    def batches(order: np.ndarray) -> list[np.ndarray]:
        return list(order[: total // BATCH * BATCH].reshape(-1, BATCH))

    full = [batches(np.random.default_rng(e).permutation(total)) for e in (0, 1)]
    ours = [batches(epoch_order(sizes, epoch=e, seed=0)) for e in (0, 1)]
    windowed = batches(epoch_order(sizes, epoch=0, seed=0, shuffle=Shuffle(shuffle_window=1 << 18)))
    full_classes = distinct_classes(full[0][:400], labels)
    assert full_classes > 200
    assert distinct_classes(ours[0][:400], labels) >= 0.97 * full_classes
    assert distinct_classes(windowed[:400], labels) < 0.8 * full_classes
    full_kept = kept_pairs(full[0][:400], full[1], total)
    assert kept_pairs(ours[0][:400], ours[1], total) < 1.2 * full_kept


def test_default_positions_are_uniform_per_class() -> None:
    order = epoch_order(SIZES, epoch=3, seed=1)
    position = np.empty(TOTAL)
    position[order] = (np.arange(TOTAL) + 0.5) / TOTAL
    means = position.reshape(CLASSES, PER_CLASS).mean(axis=1)
    assert np.abs(means - 0.5).max() < 0.1  # a class's mean position; sd 0.0144 if uniform


def test_block_mode_quality_as_documented() -> None:
    kw = dict(shuffle=Shuffle("block", block_size=64, window=8))
    assert 3 < _distinct_classes(_plan_batches(0, **kw)) < 8
    assert _kept_pairs(_plan_batches(0, **kw), _plan_batches(1, **kw)) > 0.1


@pytest.mark.parametrize("window", [1, 7, 1000, 39999, 40000, 1 << 18])
def test_sample_mode_stays_within_its_window(window: int) -> None:
    """Each sample moves less than one window from its place in the shuffled-shard order."""
    sizes = [0, 3000, 12000, 0, 25000]
    order = epoch_order(sizes, epoch=2, seed=4, shuffle=Shuffle(shuffle_window=window))
    shard_order = np.random.Generator(np.random.PCG64([4, 2])).permutation(len(sizes))
    offsets = np.cumsum(sizes) - sizes
    unshuffled = np.concatenate([np.arange(offsets[s], offsets[s] + sizes[s])
                                 for s in shard_order])
    place = np.empty(len(order), dtype=np.int64)
    place[unshuffled] = np.arange(len(order))
    moves = np.abs(place[order] - np.arange(len(order)))
    assert moves.max() < window
    assert sorted(order.tolist()) == list(range(sum(sizes)))
    if window == 1:
        assert (order == unshuffled).all()
    else:
        assert moves.mean() > min(window, len(order)) / 10


def test_window_boundaries_move_between_epochs() -> None:
    def head(epoch: int) -> int:
        order = epoch_order([100, 100, 100], epoch=epoch, seed=0,
                            shuffle=Shuffle(shuffle_window=64))
        rng = np.random.Generator(np.random.PCG64([0, epoch]))
        shards = rng.permutation(3)
        first = np.arange(shards[0] * 100, shards[0] * 100 + 64)
        return int(np.isin(order[:64], first).sum())

    assert len({head(epoch) for epoch in range(8)}) > 1


@pytest.mark.parametrize("knobs, field", [
    (dict(block_size=0), "block_size"),
    (dict(window=0), "window"),
    (dict(shuffle_window=0), "shuffle_window"),
    (dict(shuffle_window=True), "shuffle_window"),
    (dict(block_size=2.0), "block_size"),
    (dict(mode="blocks"), "shuffle"),
])
def test_a_shuffle_is_validated_when_made_naming_the_knob(knobs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"`{field}`.*Found"):
        Shuffle(**knobs)


def test_a_shuffle_is_one_value_with_the_state_s_names_and_plain_scalars() -> None:
    how = Shuffle(True, shuffle_window=np.int64(64), block_size=4, window=2)
    assert how == Shuffle("sample", 64, 4, 2) and how.mode == "sample"
    assert how.fields() == {"shuffle": "sample", "shuffle_window": 64, "block_size": 4,
                            "window": 2}
    assert all(type(v) in (str, int) for v in how.fields().values())
    assert as_shuffle(False) == Shuffle("none") and as_shuffle(how) is how
    assert hash(how) == hash(Shuffle("sample", 64, 4, 2))  # frozen: a dict key, a set member
