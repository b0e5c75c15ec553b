"""The delivery contract under training-loop patterns, with real servers: resume in the usual
loop, peeks and breaks, abandoned iterators, elastic resume on another world size."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from srvtools import run_ranks

from dataflow.client import DataLoader
from dataflow.errors import (
    ConfigError,
    DatasetMismatchError,
    StaleIteratorError,
    StateMismatchError,
)
from dataflow.plan import epoch_size

BATCH = 8
EPOCHS = 3


def _ids(batch) -> list[int]:
    return batch["id"].tolist()


def _loader(endpoint: str, rank: int = 0, world: int = 1, **kw) -> DataLoader:
    return DataLoader(endpoint, batch_size=BATCH, rank=rank, world_size=world, seed=3,
                      timeout=20, **kw)


def _usual_loop(dl: DataLoader, start: int, stop_at: tuple[int, int] | None = None):
    """``for epoch in range(start, EPOCHS): set_epoch(epoch); for batch in dl``; returns the
    ids seen and, with ``stop_at=(epoch, k)``, stops after k batches of that epoch (k == len:
    after its last batch) and returns the state taken there."""
    seen: list[list[int]] = []
    for epoch in range(start, EPOCHS):
        dl.set_epoch(epoch)
        if stop_at == (epoch, 0):
            return seen, dl.state_dict()
        for i, batch in enumerate(dl):
            seen.append(_ids(batch))
            if stop_at == (epoch, i + 1):
                return seen, dl.state_dict()
    return seen, None


@pytest.mark.timeout(120)
def test_usual_loop_resumed_anywhere_equals_the_uninterrupted_stream(demo_data,
                                                                     servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    with _loader(endpoint) as dl:
        reference, _ = _usual_loop(dl, 0)
        n = len(dl)
    assert len(reference) == EPOCHS * n
    cases = [((0, 0), 0), ((0, 1), 0), ((1, n // 2), 1), ((1, n - 1), 1),
             ((0, n), 0), ((0, n), 1), ((1, n), 1), ((1, n), 2)]
    for stop_at, restart in cases:
        with _loader(endpoint) as first:
            head, state = _usual_loop(first, 0, stop_at)
        assert state is not None
        with _loader(endpoint) as second:
            second.load_state_dict(state)
            tail, _ = _usual_loop(second, restart)
        assert head + tail == reference, f"stopped at {stop_at}, restarted at epoch {restart}"


@pytest.mark.timeout(120)
def test_loop_without_set_epoch_resumes_and_advances(demo_data, servers) -> None:
    demo = demo_data("tar")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    with _loader(endpoint) as dl:
        epochs = [[_ids(b) for b in dl] for _ in range(2)]
        assert dl.epoch == 1 and epochs[0] != epochs[1]
        n = len(dl)
        it = iter(dl)
        for _ in range(3):
            next(it)
        state = dl.state_dict()
    assert state["epoch"] == 2
    with _loader(endpoint) as dl:
        dl.load_state_dict(state)
        rest = [_ids(b) for b in dl]
        assert len(rest) == n - 3
        after = [_ids(b) for b in dl]
        assert dl.epoch == 3 and len(after) == n
        dl.set_epoch(0)
        assert [_ids(b) for b in dl] == epochs[0]


@pytest.mark.timeout(60)
def test_set_epoch_retargets_an_unread_iterator_and_invalidates_a_read_one(demo_data,
                                                                            servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    with _loader(endpoint) as dl:
        dl.set_epoch(2)
        epoch2 = [_ids(b) for b in dl]
        dl.set_epoch(0)
        it = iter(dl)  # made before the epoch is set, as Lightning does
        dl.sampler.set_epoch(2)  # the DistributedSampler idiom
        assert [_ids(b) for b in it] == epoch2 and dl.epoch == 2
        dl.set_epoch(1)
        it = iter(dl)
        next(it)
        dl.set_epoch(2)
        with pytest.raises(StaleIteratorError):
            next(it)
        assert [_ids(b) for b in dl] == epoch2


@pytest.mark.timeout(120)
def test_peeks_and_breaks_on_some_ranks_keep_counts_equal(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint

    def rank_body(rank: int) -> list[int]:
        with _loader(endpoint, rank, 2) as dl:
            if rank == 0:
                next(iter(dl))  # shape peek
                for i, _ in enumerate(dl):
                    if i == 2:
                        break
            counts = [sum(1 for _ in dl) for _ in range(2)]
            return counts + [len(dl)]

    (a, b) = run_ranks(2, rank_body, 100)
    assert a == b and a[0] == a[1] == a[2]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("world", "new_world"), [(2, 3), (4, 3), (4, 6), (5, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_reads_every_remaining_sample_once(demo_data, servers, world: int,
                                                          new_world: int,
                                                          drop_last: bool) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    full = epoch_size(demo.total, world_size=world, batch_size=BATCH, drop_last=drop_last)
    k = full.batches_per_rank // 2

    def first_job(rank: int) -> tuple[list[int], dict]:
        with _loader(endpoint, rank, world, drop_last=drop_last) as dl:
            it = iter(dl)
            ids = [i for _ in range(k) for i in _ids(next(it))]
            return ids, dl.state_dict()

    firsts = run_ranks(world, first_job, 100)
    states = [s for _, s in firsts]  # type: ignore[misc]
    assert all(s == states[0] for s in states)  # the same on every rank
    assert "rank" not in states[0]
    state = states[world - 1]  # any rank's state will do

    def second_job(rank: int) -> list[int]:
        with _loader(endpoint, rank, new_world, drop_last=drop_last) as dl:
            dl.load_state_dict(state)
            batches = [_ids(b) for b in dl]
            assert len(batches) == epoch_size(
                demo.total, world_size=new_world, batch_size=BATCH, drop_last=drop_last,
                start=state["consumed"]).batches_per_rank
            return [i for b in batches for i in b]

    seconds = run_ranks(new_world, second_job, 100)
    assert len({len(s) // BATCH for s in seconds}) <= 2  # equal batches; the last may be short
    before = [i for ids, _ in firsts for i in ids]  # type: ignore[misc]
    after = [i for ids in seconds for i in ids]  # type: ignore[union-attr]
    assert len(before) == len(set(before)) == world * k * BATCH
    rest = epoch_size(demo.total, world_size=new_world, batch_size=BATCH, drop_last=drop_last,
                      start=state["consumed"])
    counts = Counter(before + after)
    if drop_last:
        assert max(counts.values()) == 1
        assert len(counts) == demo.total - rest.dropped
    else:
        assert set(counts) == set(range(demo.total))
        assert sum(counts.values()) - demo.total == rest.repeated


@pytest.mark.timeout(60)
def test_load_state_dict_validates(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    other = servers([str(p) for p in demo.paths[:-1]]).endpoint
    with _loader(endpoint) as dl:
        state = dl.state_dict()
        for field, value in [("seed", 9), ("batch_size", 3), ("shuffle", "block"),
                             ("drop_last", True)]:
            with pytest.raises(StateMismatchError, match=f"`{field}`"):
                dl.load_state_dict({**state, field: value})
        for field, value in [("epoch", True), ("epoch", -1), ("consumed", "3"),
                             ("consumed", demo.total + 1), ("version", 1)]:
            with pytest.raises(StateMismatchError, match=f"`{field}`"):
                dl.load_state_dict({**state, field: value})
        with pytest.raises(StateMismatchError, match="missing `epoch`"):
            dl.load_state_dict({k: v for k, v in state.items() if k != "epoch"})
        dl.load_state_dict({**state, "epoch": np.int64(2), "world_size": 7, "rank": 5})
        assert dl.epoch == 2
        for wrong in (True, -1, 1.5, "2"):
            with pytest.raises(ConfigError, match="`epoch`"):
                dl.set_epoch(wrong)  # type: ignore[arg-type]
        dl.set_epoch(np.int64(1))  # type: ignore[arg-type]
        assert dl.epoch == 1
    with _loader(other) as dl, pytest.raises(DatasetMismatchError, match="dataset"):
        dl.load_state_dict(state)


def _wait_delivered(dl: DataLoader, more_than: int) -> int:
    deadline = time.monotonic() + 20
    while (n := dl.stats()["delivered"]) <= more_than:
        assert time.monotonic() < deadline, "no batch delivered within 20 s"
        time.sleep(0.01)
    return n


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [1, 4, 16])
def test_abandoned_iterators_then_a_read_one_yield_the_epoch_once(demo_data, servers,
                                                                   prefetch: int) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2)
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, prefetch=prefetch,
                    timeout=20) as dl:
        delivered = 0
        for _ in range(4):
            iter(dl)  # created, never read: its batches arrive and must not stay behind
            delivered = _wait_delivered(dl, delivered)
        ids = sorted(i for batch in dl for i in batch["id"].tolist())
        assert dl.stats()["discarded"] > 0
    assert ids == list(range(demo.total))


def _state_after(endpoint: str, epoch: int, k: int) -> dict:
    """The state after ``k`` batches of ``epoch`` (one rank)."""
    with _loader(endpoint) as dl:
        dl.set_epoch(epoch)
        it = iter(dl)
        for _ in range(k):
            next(it)
        return dl.state_dict()


@pytest.mark.timeout(90)
def test_set_epoch_again_after_a_resumed_pass_completed_is_the_whole_epoch(demo_data,
                                                                            servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    with _loader(endpoint) as dl:
        dl.set_epoch(1)
        whole = [_ids(b) for b in dl]
    state = _state_after(endpoint, 1, 3)
    with _loader(endpoint) as dl:
        dl.load_state_dict(state)
        dl.set_epoch(1)
        rest = [_ids(b) for b in dl]
        dl.set_epoch(1)  # epoch 1 asked for again, explicitly: all of it, as a cold loader
        again = [_ids(b) for b in dl]
    assert rest == whole[3:]
    assert again == whole


@pytest.mark.timeout(90)
def test_a_state_counts_the_batches_of_a_held_iterator_only(demo_data, servers) -> None:
    """A peek or a break whose iterator is gone consumed nothing (the next pass starts the
    epoch over, and so does a resume); a training loop's iterator, held, consumed its
    batches."""
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    with _loader(endpoint) as dl:
        whole = [_ids(b) for b in dl]
        dl.set_epoch(0)
        peeked = _ids(next(iter(dl)))
        after_peek = dl.state_dict()
        for i, _ in enumerate(dl):
            if i == 2:
                break
        after_break = dl.state_dict()
        it = iter(dl)
        held = [_ids(next(it)) for _ in range(2)]
        while_held = dl.state_dict()
        del it
        after_drop = dl.state_dict()
        assert [_ids(b) for b in dl] == whole  # the pass after them all: the whole epoch
    assert peeked == whole[0] and held == whole[:2]
    assert after_peek["consumed"] == after_break["consumed"] == after_drop["consumed"] == 0
    assert while_held["consumed"] == 2 * BATCH
    for state, skipped in ((after_peek, 0), (while_held, 2)):
        with _loader(endpoint) as dl:
            dl.load_state_dict(state)
            assert [_ids(b) for b in dl] == whole[skipped:]


@pytest.mark.timeout(120)
def test_a_peek_at_an_epoch_of_one_batch_per_rank_does_not_complete_it(demo_data,
                                                                      servers) -> None:
    """DDP (2 ranks), one batch per rank, a shape peek on rank 0 only: both ranks still read
    epoch 0 and then epoch 1, every sample once per epoch."""
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    batch = 256
    assert epoch_size(demo.total, world_size=2, batch_size=batch,
                      drop_last=False).batches_per_rank == 1

    def rank_body(rank: int) -> list[tuple[int, list[int]]]:
        with DataLoader(endpoint, batch_size=batch, rank=rank, world_size=2, seed=3,
                        timeout=20) as dl:
            if rank == 0:
                next(iter(dl))  # the peek yields the epoch's only batch, and is dropped
            out = []
            for _ in range(2):
                ids = [i for b in dl for i in _ids(b)]
                out.append((dl.epoch, ids))
            return out

    ranks = run_ranks(2, rank_body, 100)
    assert [e for e, _ in ranks[0]] == [e for e, _ in ranks[1]] == [0, 1]
    for epoch in range(2):
        ids = ranks[0][epoch][1] + ranks[1][epoch][1]
        assert sorted(ids) == list(range(demo.total)), f"epoch {epoch}"


@pytest.mark.timeout(90)
def test_a_peek_at_the_last_batch_left_after_a_resume_does_not_complete_the_epoch(
        demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    n = epoch_size(demo.total, world_size=1, batch_size=BATCH, drop_last=False).batches_per_rank
    with _loader(endpoint) as dl:
        whole = [_ids(b) for b in dl]
    state = _state_after(endpoint, 0, n - 1)
    with _loader(endpoint) as dl:
        dl.load_state_dict(state)
        assert _ids(next(iter(dl))) == whole[-1]
        assert dl.state_dict() == state
        assert [_ids(b) for b in dl] == whole[-1:] and dl.epoch == 0
        assert dl.state_dict()["consumed"] == demo.total
        assert len([_ids(b) for b in dl]) == n and dl.epoch == 1


@pytest.mark.timeout(120)
def test_a_resume_on_the_same_world_size_is_the_uninterrupted_run_padding_included(
        demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    world, batch = 3, 32
    size = epoch_size(demo.total, world_size=world, batch_size=batch, drop_last=False)
    assert size.repeated > 0 and size.batches_per_rank > 2  # a padded tail, read after a resume
    k = size.batches_per_rank // 2

    def run(rank: int, state: dict | None, stop: int | None) -> tuple[list[bytes], dict]:
        with DataLoader(endpoint, batch_size=batch, rank=rank, world_size=world, seed=3,
                        timeout=20) as dl:
            if state is not None:
                dl.load_state_dict(state)
            dl.set_epoch(1)
            got = []
            for b in dl:
                got.append(b["id"].numpy().tobytes() + b["image"].numpy().tobytes())
                if len(got) == stop:
                    return got, dl.state_dict()
            return got, dl.state_dict()

    whole = run_ranks(world, lambda r: run(r, None, None), 100)
    head = run_ranks(world, lambda r: run(r, None, k), 100)
    states = [s for _, s in head]
    assert all(s == states[0] for s in states)
    tail = run_ranks(world, lambda r: run(r, states[r - 1], None), 100)  # another rank's state
    for rank in range(world):
        assert head[rank][0] + tail[rank][0] == whole[rank][0], f"rank {rank}"
