"""The reorder buffer: plan order out, whatever the arrival order; impossible cases raise."""

from __future__ import annotations

import itertools

import pytest

from dataflow.client.reorder import Reorder
from dataflow.errors import InternalError


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_any_arrival_order_is_released_in_plan_order(order) -> None:
    r: Reorder[str] = Reorder(first=10, capacity=4)
    out = []
    for i in order:
        out += r.add(10 + i, f"b{i}")
    assert out == [(10 + i, f"b{i}") for i in range(4)] and len(r) == 0


def test_duplicates_and_overflow_raise() -> None:
    r: Reorder[str] = Reorder(first=0, capacity=2)
    assert r.add(0, "a") == [(0, "a")]
    with pytest.raises(InternalError, match="twice"):
        r.add(0, "again")
    r.add(2, "c")
    with pytest.raises(InternalError, match="twice"):
        r.add(2, "c")
    r.add(3, "d")
    with pytest.raises(InternalError, match="capacity"):
        r.add(4, "e")
    assert sorted(r.clear()) == ["c", "d"] and len(r) == 0


def test_capacity_grows_and_never_shrinks() -> None:
    r: Reorder[str] = Reorder(first=0, capacity=1)
    r.add(1, "b")
    with pytest.raises(InternalError, match="capacity"):
        r.add(2, "c")
    r.grow(3)
    assert r.add(2, "c") == [] and r.add(0, "a") == [(0, "a"), (1, "b"), (2, "c")]
    with pytest.raises(InternalError, match="cannot shrink"):
        r.grow(1)
