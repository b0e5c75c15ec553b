"""Exact mid-epoch resume through state_dict / load_state_dict."""

from __future__ import annotations

import time

import pytest

from dataflow.client import DataLoader
from dataflow.errors import DataflowError

KW = dict(batch_size=8, rank=1, world_size=2, seed=3, timeout=20)


def _ids(batch) -> list[int]:
    return batch["id"].tolist()


@pytest.mark.timeout(90)
def test_resume_yields_exactly_the_rest(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    with DataLoader(endpoint, **KW) as dl:
        full = [_ids(b) for b in dl]
        next_epoch = [_ids(b) for b in dl]
        n = len(dl)
    assert len(full) == n > 3
    for k in (0, 1, n // 2, n - 1, n):
        with DataLoader(endpoint, **KW) as first:
            got = []
            it = iter(first)
            for _ in range(k):
                got.append(_ids(next(it)))
            state = first.state_dict()
        assert state["batches_yielded"] == k and state["epoch"] == 0
        with DataLoader(endpoint, **KW) as second:
            second.load_state_dict(state)
            rest = [_ids(b) for b in second]
            if k == n:
                assert second.epoch == 1 and rest == next_epoch
            else:
                assert got + rest == full, f"resume after {k} batches"


@pytest.mark.timeout(60)
def test_epochs_advance_and_set_epoch(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    with DataLoader(endpoint, **KW) as dl:
        e0 = [_ids(b) for b in dl]
        e1 = [_ids(b) for b in dl]
        assert dl.epoch == 1 and e0 != e1
        dl.set_epoch(0)
        assert [_ids(b) for b in dl] == e0
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        assert state["epoch"] == 1 and state["batches_yielded"] == 1
        assert [_ids(b) for b in dl] == e1[1:]


@pytest.mark.timeout(60)
def test_load_state_dict_validates(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    with DataLoader(endpoint, **KW) as dl:
        state = dl.state_dict()
        for field, value in [("fingerprint", "0000"), ("world_size", 4), ("seed", 9),
                             ("batch_size", 3)]:
            with pytest.raises(DataflowError, match=f"`{field}`"):
                dl.load_state_dict({**state, field: value})
        with pytest.raises(DataflowError, match="`batches_yielded`"):
            dl.load_state_dict({**state, "batches_yielded": len(dl) + 1})


@pytest.mark.timeout(60)
def test_many_abandoned_iterators_do_not_overflow_the_loader(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    with DataLoader(server.endpoint, batch_size=8, rank=0, world_size=1, prefetch=2,
                    timeout=20) as dl:
        for _ in range(8):
            iter(dl)
            time.sleep(0.3)
        ids = sorted(i for batch in dl for i in batch["id"].tolist())
    assert ids == list(range(demo.total))
