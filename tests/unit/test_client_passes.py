"""Planning a DataLoader pass: this rank's batches of the epoch and their transform tags."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dataflow.client.config import LoaderConfig
from dataflow.client.cursor import Pass
from dataflow.client.discovery import parse_servers
from dataflow.client.passes import PassIterator, PassPlan, after, plan_pass
from dataflow.plan import Batches, epoch_order, epoch_size
from dataflow.transform import global_batch_index
from dataflow.wire import NO_TAG, BatchTag

SIZES = (7, 0, 13, 5)


def _cfg(world: int, rank: int, drop_last: bool) -> LoaderConfig:
    return LoaderConfig(servers=parse_servers("tcp://127.0.0.1:1"), batch_size=4, rank=rank,
                        world_size=world, seed=9, drop_last=drop_last)


@pytest.mark.parametrize("world, drop_last, start", list(itertools.product(
    (1, 2, 3), (False, True), (0, 8))))
def test_the_ranks_plans_cover_the_rest_of_the_epoch_with_their_global_tags(
        world: int, drop_last: bool, start: int) -> None:
    size = epoch_size(sum(SIZES), world_size=world, batch_size=4, drop_last=drop_last,
                      start=start)
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    seen: list[int] = []
    for rank in range(world):
        planned = plan_pass(_cfg(world, rank, drop_last), SIZES, Pass(3, start))
        assert len(planned) == size.batches_per_rank and planned.span == Pass(3, start)
        for i in range(len(planned)):
            g = start // 4 + i * world + rank
            assert planned.tag(i) == BatchTag(9, 3, g)
            rows = planned.rows(i)
            seen += [int(offsets[s]) + j for s, a, b in rows.tolist() for j in range(a, b)]
    order = epoch_order(SIZES, epoch=3, seed=9).tolist()
    rest = order[start:len(order) - size.dropped]
    padding = order[:size.repeated]  # the epoch's first samples
    assert sorted(seen) == sorted(rest + padding)


def test_the_pass_after_a_completed_one_is_the_next_epoch_from_its_start() -> None:
    assert after(Pass(4, 12)) == Pass(5, 0)
    a = plan_pass(_cfg(1, 0, False), SIZES, Pass(0, 0))
    b = plan_pass(_cfg(1, 0, False), SIZES, after(Pass(0, 0)))
    assert not all(np.array_equal(a.rows(i), b.rows(i)) for i in range(len(a)))


@pytest.mark.parametrize("world, start", [(1, 0), (3, 0), (2, 12)])
def test_tags_give_each_rank_its_global_batches(world: int, start: int) -> None:
    none = Batches.of([])
    plans = [PassPlan(Pass(4, start), none, 9, global_batch_index(
        start=start, batch_size=4, world_size=world, rank=r, index=0), world)
        for r in range(world)]
    got = sorted(p.tag(j) for p in plans for j in range(5))
    assert got == [BatchTag(9, 4, start // 4 + g) for g in range(5 * world)]
    assert PassPlan(Pass(0, 0), none).tag(7) == BatchTag(0, 0, 7) != NO_TAG


def test_a_pass_iterator_that_raised_raises_again_and_one_that_ended_stays_ended() -> None:
    def failing():
        yield 1
        raise RuntimeError("bad batch")

    it = PassIterator(failing())
    assert next(it) == 1
    for _ in range(2):
        with pytest.raises(RuntimeError, match="bad batch"):
            next(it)
    done = PassIterator(iter([1, 2]))
    assert list(done) == [1, 2] and list(done) == []
