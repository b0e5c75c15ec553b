"""The resume state: the same dict on every rank, loadable by a job of any size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataflow.client.config import LoaderConfig
from dataflow.client.discovery import parse_servers
from dataflow.client.state import PLAN_FIELDS, make_state, read_state
from dataflow.errors import DatasetMismatchError, StateMismatchError
from dataflow.shuffle import Shuffle

PLAN = {"seed": 3, "batch_size": 8, "shuffle": "sample", "shuffle_window": 64,
        "block_size": 4, "window": 2, "drop_last": False}


def _state(world_size: int = 4) -> dict:
    return make_state(epoch=2, consumed=96, total=420, fingerprint="f" * 16, plan=PLAN,
                      world_size=world_size)


def test_the_state_names_no_rank_and_is_the_job_s_alone() -> None:
    state = _state()
    assert set(state) == {"version", "epoch", "consumed", "total", "fingerprint",
                          *PLAN_FIELDS, "world_size"}
    assert read_state(state, total=420, fingerprint="f" * 16, plan=PLAN) == (2, 96)


def test_a_state_of_another_world_size_or_with_an_old_rank_field_loads() -> None:
    for state in (_state(world_size=7), {**_state(), "rank": 3}):
        assert read_state(state, total=420, fingerprint="f" * 16, plan=PLAN) == (2, 96)
    with pytest.raises(StateMismatchError, match="`seed`"):
        read_state(_state(), total=420, fingerprint="f" * 16, plan={**PLAN, "seed": 4})


def test_a_state_saved_before_the_shuffle_was_one_value_loads() -> None:
    """A version-2 state as earlier releases wrote it (the knobs as loose fields, their
    default window 2^18) matches a loader whose Shuffle has those knobs, and only such a
    loader: today's default window is refused, naming it."""
    old = {"version": 2, "epoch": 1, "consumed": 16, "total": 420, "fingerprint": "f" * 16,
           "seed": 3, "batch_size": 8, "shuffle": "block", "shuffle_window": 262144,
           "block_size": 64, "window": 8, "drop_last": False, "world_size": 2}
    cfg = LoaderConfig(servers=parse_servers("tcp://127.0.0.1:1"), batch_size=8, rank=0,
                       world_size=1, seed=3, shuffle=Shuffle("block", shuffle_window=1 << 18))
    default = LoaderConfig(servers=parse_servers("tcp://127.0.0.1:1"), batch_size=8, rank=0,
                           world_size=1, seed=3, shuffle=Shuffle("block"))
    with pytest.raises(StateMismatchError, match="`shuffle_window` is 262144 but this loader"):
        read_state(old, total=420, fingerprint="f" * 16, plan=default.plan_inputs())
    assert PLAN_FIELDS == ("seed", "batch_size", "shuffle", "shuffle_window", "block_size",
                           "window", "drop_last")
    assert read_state(old, total=420, fingerprint="f" * 16, plan=cfg.plan_inputs()) == (1, 16)
    assert make_state(epoch=1, consumed=16, total=420, fingerprint="f" * 16,
                      plan=cfg.plan_inputs(), world_size=2) == old
    other = LoaderConfig(servers=parse_servers("tcp://127.0.0.1:1"), batch_size=8, rank=0,
                         world_size=1, seed=3,
                         shuffle=Shuffle("block", shuffle_window=1 << 18, window=4))
    with pytest.raises(StateMismatchError, match="`window` is 8 but this loader has 4"):
        read_state(old, total=420, fingerprint="f" * 16, plan=other.plan_inputs())


@pytest.mark.parametrize("change, error, match", [
    ({"version": 1}, StateMismatchError, "`version` must be 2. Found: 1"),
    ({"epoch": -1}, StateMismatchError,
     "`epoch` of the state_dict must be an integer >= 0. Found: -1"),
    ({"epoch": True}, StateMismatchError,
     "`epoch` of the state_dict must be an integer >= 0. Found: True"),
    ({"consumed": 1.5}, StateMismatchError, "`consumed` of the state_dict must be an integer >= 0"),
    ({"consumed": 421}, StateMismatchError, "`consumed` must be <= 420. Found: 421"),
    ({"shuffle": True}, StateMismatchError, "`shuffle` is True but this loader has 'sample'"),
    ({"drop_last": 0}, StateMismatchError, "`drop_last` is 0 but this loader has False"),
    ({"fingerprint": "e" * 16}, DatasetMismatchError, "saved on dataset e{16}"),
    ({"total": 419}, DatasetMismatchError, r"\(419 samples\)"),
])
def test_a_state_that_does_not_fit_is_refused_naming_the_field(change: dict, error: type,
                                                               match: str) -> None:
    with pytest.raises(error, match=match):
        read_state({**_state(), **change}, total=420, fingerprint="f" * 16, plan=PLAN)


def test_a_state_missing_a_field_or_not_a_mapping_is_refused() -> None:
    for name in ("epoch", "consumed", "window"):
        state = {k: v for k, v in _state().items() if k != name}
        with pytest.raises(StateMismatchError, match=f"missing `{name}`"):
            read_state(state, total=420, fingerprint="f" * 16, plan=PLAN)
    with pytest.raises(StateMismatchError, match="must be a mapping. Found: list"):
        read_state([], total=420, fingerprint="f" * 16, plan=PLAN)  # type: ignore[arg-type]


def test_numpy_and_torch_integers_are_positions() -> None:
    state = {**_state(), "epoch": np.int64(2), "consumed": torch.tensor(96)}
    assert read_state(state, total=420, fingerprint="f" * 16, plan=PLAN) == (2, 96)
    state = {**_state(), "epoch": np.uint8(2)}
    assert read_state(state, total=420, fingerprint="f" * 16, plan=PLAN) == (2, 96)
