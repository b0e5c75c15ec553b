"""The resume state: the same dict on every rank, loadable by a job of any size."""

from __future__ import annotations

import pytest

from dataflow.client.state import PLAN_FIELDS, make_state, read_state
from dataflow.errors import StateMismatchError

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
