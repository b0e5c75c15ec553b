"""Digests of a few epoch plans, pinned.

An epoch's order is a compatibility promise: the same seed gives the same order in every
version, and a job saved by one version resumes in another from a few scalars (its start in
the order). So any change of order must fail loudly here, whatever its cause: a rewrite of
:mod:`dataflow.plan` or :mod:`dataflow.shuffle` (these were pinned before their rewrite for
memory, and hold after it), or a numpy whose ``Generator`` draws differently (NEP 19 lets
its methods change between versions). A change here is never fixed by repinning alone: it
needs a way for saved jobs to keep their order.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dataflow.plan import rank_batches
from dataflow.shuffle import Shuffle

SMALL = [(i * 37) % 101 for i in range(40)]  # 1,994 samples, 40 shards (one empty)
LARGE = [1031 + (i * 7919) % 977 for i in range(97)]  # 144,810 samples, 97 shards

CASES = [
    ("sample, one rank", SMALL, dict(world_size=1, epoch=0, seed=0, batch_size=32),
     "7fa6a1a6b897ecf1b9ec3b9dc09ac325"),
    ("sample, 8 ranks", LARGE, dict(world_size=8, epoch=3, seed=1234, batch_size=256),
     "af2a2127ea4438c5211f8499bfa12ddc"),
    ("sample window 1000, resumed", LARGE,
     dict(world_size=5, epoch=0, seed=9, batch_size=64, start=12345,
          shuffle=Shuffle(shuffle_window=1000)),
     "45fe9e67ef5a66b3eedc5c43cb5cb811"),
    ("block, drop_last", SMALL,
     dict(world_size=3, epoch=1, seed=7, batch_size=16, drop_last=True,
          shuffle=Shuffle("block", block_size=16, window=4)),
     "cf5ebab42688f08735e9d86db25701c7"),
    ("none, padded", SMALL, dict(world_size=4, epoch=2, seed=5, batch_size=10, shuffle="none"),
     "4edced12d7cf588247941aca21487258"),
]


def _digest(sizes: list[int], kw: dict) -> str:
    """SHA-256 (first 32 hex digits) of every rank's table and bounds, as little-endian
    int64, rank by rank."""
    h = hashlib.sha256()
    for rank in range(kw["world_size"]):
        batches = rank_batches(sizes, rank=rank, **kw)
        h.update(np.ascontiguousarray(batches.table, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(batches.bounds, dtype="<i8").tobytes())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("name, sizes, kw, pinned", CASES, ids=[c[0] for c in CASES])
def test_the_plans_of_a_few_jobs_are_pinned(name: str, sizes: list[int], kw: dict,
                                            pinned: str) -> None:
    assert _digest(sizes, kw) == pinned, f"the order of {name!r} changed"
