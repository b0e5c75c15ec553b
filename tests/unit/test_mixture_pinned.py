"""Digests of a few mixture plans, pinned.

A mixture's plan is a compatibility promise, as a single dataset's order is
(tests/unit/test_plan_pinned.py): the same seed gives the same plan in every version, and a
mixture is elastic, so a job saved by one version resumes in another, on any world size,
from a few scalars (its start in the epoch's slots). Every value of the plan is pinned: which
samples each batch holds and in what parts, their copies, the runs a request may carry, the
counts per source. So a rewrite of :mod:`dataflow.mixture` (these were pinned before its
rewrite for memory, and hold after it), of the plan helpers it uses, or a numpy whose
``Generator`` draws differently must fail loudly here. A change here is never fixed by
repinning alone: it needs a way for saved jobs to keep their plans.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dataflow.mixture import MixtureBatches, Weights, mixture_batches
from dataflow.shuffle import Shuffle

BIG = [1031 + (i * 7919) % 977 for i in range(23)]  # 34,197 samples, 23 shards
MID = [(i * 37) % 101 for i in range(40)]  # 1,994 samples, 40 shards (one empty)
TINY = [5, 0, 12, 3]  # 20 samples: whole passes repeat, a batch names a sample twice

CASES = [
    ("3 sources 0.7/0.2/0.1, one rank", [BIG, MID, TINY], [0.7, 0.2, 0.1],
     dict(samples_per_epoch=12_000, world_size=1, epoch=2, seed=11, batch_size=256),
     "c2571d5a0f068bda4e1531b9f9e546b5"),
    ("3 sources 0.7/0.2/0.1, 4 ranks, resumed", [BIG, MID, TINY], [0.7, 0.2, 0.1],
     dict(samples_per_epoch=12_000, world_size=4, epoch=1, seed=3, batch_size=64,
          start=3 * 64 * 5 + 64),
     "3ec5b8c52039471b7f31393e7d486cbc"),
    ("2 sources 1:3, 4 ranks, block, drop_last", [MID, BIG], [1, 3],
     dict(samples_per_epoch=5_003, world_size=4, epoch=1, seed=0, batch_size=100,
          drop_last=True, shuffle=Shuffle("block", block_size=16, window=4)),
     "a5a8ac76b30da4222feb850d5f95e39e"),
    ("3 sources 5/3/1, one rank, window, padded", [TINY, MID, BIG], [5, 3, 1],
     dict(samples_per_epoch=3_001, world_size=1, epoch=7, seed=2**40 + 5, batch_size=48,
          shuffle=Shuffle(shuffle_window=300)),
     "d5f93abe1a53be43ec380801f535bc2c"),
    ("2 sources 0.9/0.1, 4 ranks, none, resumed padded", [MID, TINY], [0.9, 0.1],
     dict(samples_per_epoch=2_500, world_size=4, epoch=3, seed=1, batch_size=30,
          start=1_320, shuffle="none"),
     "b049df31a7168a53739c05fee5aa4ddd"),
]


def _arrays(plan: MixtureBatches) -> list[np.ndarray]:
    """Every value of ``plan``, source by source."""
    out = [plan.counts, np.asarray([plan.first, plan.stride])]
    for k in range(plan.sources):
        out += [plan.parts[k].table, plan.parts[k].bounds, plan.index[k], plan.runs[k]]
        for i in sorted(plan.copies[k]):
            out += [np.asarray([i]), plan.copies[k][i]]
    return out


def _digest(sources: list[list[int]], weights: list, kw: dict) -> str:
    """SHA-256 (first 32 hex digits) of ranks 0 and last's plans: every array as
    little-endian int64 after its shape."""
    h = hashlib.sha256()
    for rank in sorted({0, kw["world_size"] - 1}):
        for a in _arrays(mixture_batches(sources, Weights.of(weights), rank=rank, **kw)):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("name, sources, weights, kw, pinned", CASES, ids=[c[0] for c in CASES])
def test_the_plans_of_a_few_mixtures_are_pinned(name: str, sources: list[list[int]],
                                                weights: list, kw: dict, pinned: str) -> None:
    assert _digest(sources, weights, kw) == pinned, f"the plan of {name!r} changed"
