"""A request per reader: of the credits a server grants, the scheduler sends it ``prefetch``
requests at once, or one per reader when it has more readers, never more than it granted,
within the bytes of ``prefetch`` requests of 32 MiB (known from the first batch); where
requests carry several batches, those bytes are spread over them. Pure, with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow import wire
from dataflow.client.cursor import Pass
from dataflow.client.inbox import batch_bytes
from dataflow.client.passes import PassPlan
from dataflow.client.scheduler import CONTROL, Scheduler
from dataflow.client.stream import Demand
from dataflow.plan import Batches, Range


def _sched(grants: list[tuple[int, int]], prefetch: int = 4, group: int = 1,
           group_bytes: int | None = None, nbytes: int | None = 2**16) -> Scheduler:
    """Servers granting ``(credits, readers)`` each; a first batch of ``nbytes`` received
    (None: none yet)."""
    s = Scheduler([f"tcp://s{i}:1" for i in range(len(grants))], timeout=100.0,
                  heartbeat_s=1.0, silent_s=3.0, grace=5.0, group=group,
                  group_bytes=group_bytes, prefetch=prefetch)
    for i, (credits, readers) in enumerate(grants):
        s.link(i, CONTROL, up=True, now=0.0)
        s.hellos_due(0.0)
        s.grant(i, credits, now=0.0, readers=readers, group=8)
    if nbytes is not None:
        s.sized(nbytes)
    s.follow(Demand(1, (PassPlan(Pass(0, 0), Batches.of(
        [[Range(0, 2 * i, 2 * i + 2)] for i in range(500)]), 7),)))
    return s


@pytest.mark.parametrize(("credits", "readers", "prefetch", "held"), [
    (64, 2, 4, 4),  # fewer readers than prefetch: prefetch
    (64, 12, 4, 12),  # more: one per reader
    (6, 12, 4, 6),  # never more than it granted
    (2, 12, 4, 2),  # a grant under prefetch
    (64, 1, 8, 8),
    (64, 64, 1, 64),
])
def test_a_server_is_sent_prefetch_requests_or_one_per_reader(credits: int, readers: int,
                                                              prefetch: int, held: int) -> None:
    s = _sched([(credits, readers)], prefetch)
    got = s.assignments(taken=0, now=0.0)
    assert len(got) == s.outstanding(0) == held == s.depth
    assert all(len(a.indexes) == 1 for a in got)
    s.on_reply(0, got[0].req_id, now=0.1)
    assert s.assignments(taken=0, now=0.1) == []  # the depth is full
    assert [list(a.indexes) for a in s.assignments(taken=1, now=0.1)] == [[held]]


@pytest.mark.parametrize(("readers", "depth", "group"), [
    (2, 32, 8),  # 4 requests of 8: as many batches as before
    (12, 96, 8),  # 12 requests of 8 batches of 64 KiB (6 MiB, within 4 x 32 MiB)
    (40, 320, 8),
])
def test_small_batches_keep_their_runs_over_more_readers(readers: int, depth: int,
                                                         group: int) -> None:
    """``batches_per_request=8`` of 64 KiB batches: a run of 8 to each reader."""
    s = _sched([(64, readers)], prefetch=4, group=8)
    assert (s.depth, s.group) == (depth, group)
    got = s.assignments(taken=0, now=0.0)
    assert len(got) == max(4, readers)
    assert {len(a.indexes) for a in got} == {group}


def test_a_fixed_run_of_large_batches_is_spread_over_the_readers() -> None:
    """``batches_per_request=8`` of 4 MiB batches, 12 readers: the bytes of 4 requests of 8
    (128 MiB) go as 12 requests of 2."""
    s = _sched([(64, 12)], prefetch=4, group=8, nbytes=4 * 2**20)
    assert (s.depth, s.group) == (32, 2)
    assert {len(a.indexes) for a in s.assignments(taken=0, now=0.0)} == {2}


def test_before_the_first_batch_a_server_is_sent_prefetch_requests() -> None:
    """Its size unknown, a batch could be of any size: ``prefetch`` requests of one, until
    the first reply."""
    s = _sched([(64, 12)], prefetch=4, group=8, group_bytes=32 * 2**20, nbytes=None)
    assert (s.depth, s.group) == (4, 1)
    assert len(s.assignments(taken=0, now=0.0)) == 4


@pytest.mark.parametrize(("nbytes", "depth", "group"), [
    (2**16, 96, 8),  # small: 12 requests of 8 (6 MiB), as 4 of 8 would be
    (4 * 2**20, 32, 2),  # 4 x 32 MiB spread over 12 requests of 2
    (9_633_792, 12, 1),  # 13 would fit 4 x 32 MiB: a batch to each reader
    (20 * 2**20, 6, 1),  # 6 fit: 6 requests
    (40 * 2**20, 4, 1),  # larger than 32 MiB: prefetch requests, as before
])
def test_requests_sized_from_the_first_batch_are_spread_over_the_readers(
        nbytes: int, depth: int, group: int) -> None:
    """Once sized, the depth holds a reply's batches a request within the bytes of
    ``prefetch`` replies of 32 MiB, at least a batch a request, at least ``prefetch``."""
    s = _sched([(64, 12)], prefetch=4, group=8, group_bytes=32 * 2**20, nbytes=None)
    assert s.sized(nbytes) is (depth > 4)
    assert (s.depth, s.group) == (depth, group)
    got = s.assignments(taken=0, now=0.0)
    assert len(got) == min(12, depth) and s.outstanding(0) == len(got)


def test_servers_of_few_and_many_readers_share_the_depth() -> None:
    s = _sched([(64, 2), (64, 12)], prefetch=4, group=8, nbytes=2 * 2**20)
    assert (s.depth, s.group) == (128, 8)  # (4 + 4) x 32 MiB, 8 batches to each of 16
    got = s.assignments(taken=0, now=0.0)
    # turns in proportion to readers (client/shares.py): the first server's 2 readers take
    # 2 requests, the other's 12 one each
    assert [s.outstanding(0), s.outstanding(1)] == [2, 12]
    assert {len(a.indexes) for a in got} == {8}


def test_a_short_first_reply_sizes_a_whole_batch() -> None:
    """The depth is sized from the first reply's bytes a sample (a short last batch, or one
    with samples left out, would otherwise size it for too many large batches)."""
    def reply(samples: int) -> wire.BatchMsg:
        return wire.batch_to_message(1, {"x": np.zeros((samples, 4096), np.uint8),
                                         "id": np.arange(samples)})
    whole = wire.BatchLayout.of(reply(64)).nbytes
    for samples in (1, 5, 64, 128):  # within the arrays' alignment to 64 bytes
        assert abs(batch_bytes(reply(samples), 64) - whole) <= whole // 50, samples
