"""What a REQUEST may name: valid ranges, at most the session's samples, each sample once; and
every batch a plan makes (padded ones included) passes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataflow.plan import rank_batches
from dataflow.server.admission import FEW_RANGES, _ranges_problem, range_problem
from dataflow.shuffle import Shuffle

SIZES = np.array([10, 0, 7], dtype=np.int64)
NAMES = ("a.arrow", "empty.arrow", "b.arrow")


def _problem(rows: list[tuple[int, int, int]], max_samples: int = 100) -> str | None:
    return range_problem(np.array(rows, dtype=np.int64).reshape(-1, 3), SIZES, NAMES,
                         max_samples)


@pytest.mark.parametrize("rows", [
    [(0, 0, 10)],
    [(0, 0, 5), (0, 5, 10), (2, 0, 7)],  # ranges that meet do not overlap
    [(2, 3, 4), (0, 9, 10), (2, 0, 3)],
])
def test_valid_requests_pass(rows) -> None:
    assert _problem(rows) is None


@pytest.mark.parametrize("rows, match", [
    ([(0, 0, 5), (0, 4, 6)], r"ranges 0 \[0, 5\) and 1 \[4, 6\) of shard a.arrow overlap"),
    ([(2, 0, 7), (0, 0, 1), (2, 6, 7)], r"ranges 0 \[0, 7\) and 2 \[6, 7\) of shard b.arrow"),
    ([(0, 0, 4)] * 3, r"ranges 0 \[0, 4\) and 1 \[0, 4\)"),
    ([(0, 2, 3), (0, 0, 9)], r"ranges 0 \[2, 3\) and 1 \[0, 9\)"),
    ([(1, 0, 1)], "outside shard empty.arrow of 0 samples"),
    ([(3, 0, 1)], r"shard 3 not in \[0, 3\)"),
    ([(0, 0, 10), (2, 0, 7)], "17 samples exceeds this session's 12"),
])
def test_invalid_requests_are_refused_naming_the_ranges(rows, match) -> None:
    problem = _problem(rows, max_samples=12)
    assert problem is not None and re.search(match, problem), problem


@pytest.mark.parametrize("max_samples", [1, 3, 12])
def test_one_range_gets_the_answer_of_the_general_check(max_samples) -> None:
    """A request of one range is checked without numpy: the same decision and message."""
    for shard in range(-1, 4):
        for start in range(-1, 12):
            for stop in range(-1, 13):
                row = np.array([[shard, start, stop]], dtype=np.int64)
                assert range_problem(row, SIZES, NAMES, max_samples) == _ranges_problem(
                    row, SIZES, NAMES, max_samples), row


@pytest.mark.parametrize("seed", range(20))
def test_a_few_ranges_get_the_answer_of_the_general_check(seed) -> None:
    """A request of up to FEW_RANGES ranges (a run of batches) is checked without numpy: the
    same decision and message, bad shards, bad bounds, totals and overlaps alike."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n = int(rng.integers(2, FEW_RANGES + 1))
        shard = rng.integers(-1, 4, n)
        start = rng.integers(-1, 12, n)
        stop = start + rng.integers(-1, 6, n)
        rows = np.stack([shard, start, stop], axis=1).astype(np.int64)
        for max_samples in (FEW_RANGES, 12, 64):  # never fewer than the ranges
            assert range_problem(rows, SIZES, NAMES, max_samples) == _ranges_problem(
                rows, SIZES, NAMES, max_samples), rows


def test_overlap_is_found_wherever_it_hides() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(1, 8))
        starts = rng.integers(0, 9, n)
        rows = [(0, int(a), int(rng.integers(a + 1, 11))) for a in starts]
        covered = np.zeros(10, dtype=int)
        for _, a, b in rows:
            covered[a:b] += 1
        assert (_problem(rows) is None) == bool((covered <= 1).all()), rows


@pytest.mark.parametrize("world_size", [1, 3, 8])
@pytest.mark.parametrize("batch_size", [1, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", ["sample", "block", "none"])
def test_every_batch_of_a_plan_is_a_valid_request(world_size, batch_size, drop_last,
                                                  shuffle) -> None:
    sizes = np.array([5, 0, 13, 1, 9], dtype=np.int64)  # 28 samples: padded tails repeat some
    names = tuple(f"s{i}" for i in range(len(sizes)))
    for rank in range(world_size):
        for start in (0, 11, 27):
            batches = rank_batches(sizes, world_size=world_size, rank=rank, epoch=1, seed=3,
                                   batch_size=batch_size, drop_last=drop_last, start=start,
                                   shuffle=Shuffle(shuffle, block_size=2))
            for i in range(len(batches)):
                assert range_problem(batches.rows(i), sizes, names, batch_size) is None
