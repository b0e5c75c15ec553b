"""The next epoch read ahead while the current one ends: the same batches as a loader that
starts that epoch cold, whatever the loop does at the boundary (set_epoch, a break, an
iterator made before set_epoch, a resume)."""

from __future__ import annotations

import pytest
from srvtools import wait_for

from dataflow.client import DataLoader
from dataflow.errors import LoaderClosedError, RemoteError

BATCH = 8


def _ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def _cold(endpoint: str, epoch: int) -> list[list[int]]:
    """Epoch ``epoch`` from a new loader (nothing read ahead)."""
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        dl.set_epoch(epoch)
        return _ids(dl)


@pytest.fixture
def endpoint(demo_data, servers) -> str:
    return servers([str(p) for p in demo_data("arrow").paths], workers=2).endpoint


@pytest.mark.timeout(90)
def test_consecutive_epochs_are_the_epochs_a_cold_loader_reads(endpoint, demo_data) -> None:
    total = demo_data("arrow").total
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        auto = [_ids(dl) for _ in range(3)]  # each pass starts the next epoch
        explicit = []
        for epoch in (3, 4):
            dl.set_epoch(epoch)
            explicit.append(_ids(dl))
        wait_for(lambda: dl.stats()["waiting"] > 0, 10, "epoch 5's first batch read ahead")
        discarded = dl.stats()["discarded"]
    for epoch, got in enumerate(auto + explicit):
        assert got == _cold(endpoint, epoch), f"epoch {epoch}"
        assert sorted(i for b in got for i in b) == list(range(total))
    assert auto[0] != auto[1]
    assert discarded == 0


@pytest.mark.timeout(90)
def test_a_break_after_the_read_ahead_then_the_next_epoch(endpoint) -> None:
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        for i, _ in enumerate(dl):
            if i == len(dl) - 2:  # the next epoch was appended a window before the end
                break
        dl.set_epoch(1)
        after_break = _ids(dl)
    assert after_break == _cold(endpoint, 1)


@pytest.mark.timeout(90)
def test_an_iterator_made_before_set_epoch_and_a_resume_at_the_boundary(endpoint) -> None:
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        _ids(dl)
        it = iter(dl)  # Lightning makes its iterator, then sets the epoch
        dl.set_epoch(1)
        lightning = _ids(it)
        state = dl.state_dict()  # after epoch 1's last batch: epoch 2 was read ahead
        it = iter(dl)
        dl.set_epoch(5)  # retargeted to another epoch than the one read ahead
        retargeted = _ids(it)
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as fresh:
        fresh.load_state_dict(state)
        resumed = _ids(fresh)
    assert lightning == _cold(endpoint, 1)
    assert retargeted == _cold(endpoint, 5)
    assert resumed == _cold(endpoint, 2)


CURRICULUM = '''
SCHEDULE = [0.1, 0.2]  # made for the two epochs the job trains


def tf(batch, ctx):
    SCHEDULE[ctx.epoch]
    return batch
'''


@pytest.mark.timeout(90)
def test_a_failed_batch_read_ahead_is_raised_only_where_the_loop_reaches_it(
        demo_data, servers, raw_client, tmp_path) -> None:
    (tmp_path / "curriculum.py").write_text(CURRICULUM)
    server = servers([str(p) for p in demo_data("arrow").paths], workers=1, cwd=tmp_path,
                     extra_args=["--transform", "curriculum:tf"])
    with DataLoader(server.endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        counts = [sum(1 for _ in dl) for _ in range(2)]  # epoch 2's batches fail when read
        assert counts == [len(dl)] * 2
        wait_for(lambda: dl.stats()["waiting"] > 0, 10, "epoch 2's first batch read ahead")
        it = iter(dl)
        for _ in range(2):  # a loop that catches the error and goes on gets it again
            with pytest.raises(RemoteError, match=r"TransformError: .*batch 0 of epoch 2 .*"):
                next(it)
        with pytest.raises(LoaderClosedError, match="failed earlier") as info:
            iter(dl)
        assert isinstance(info.value.__cause__, RemoteError)
        probe = raw_client(server.endpoint)
        wait_for(lambda: probe.stats()["clients"] == 1, 10, "the failed loader's BYE")


@pytest.mark.timeout(90)
def test_a_loop_that_stops_at_len_then_makes_its_iterator_before_set_epoch_keeps_it(
        endpoint) -> None:
    """Lightning's fetcher takes ``len(loader)`` batches and never sees StopIteration (the
    epoch is not complete), then makes the next epoch's iterator and sets the epoch: the
    epoch read ahead is the one used, nothing discarded."""
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=3,
                    timeout=20) as dl:
        it = iter(dl)
        first = [next(it)["id"].tolist() for _ in range(len(dl))]
        wait_for(lambda: dl.stats()["waiting"] > 0, 10, "epoch 1's first batch read ahead")
        it = iter(dl)  # still epoch 0 (not complete) until set_epoch
        dl.set_epoch(1)
        second = _ids(it)
        discarded = dl.stats()["discarded"]
    assert first == _cold(endpoint, 0)
    assert second == _cold(endpoint, 1)
    assert discarded == 0
