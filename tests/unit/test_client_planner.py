"""The next pass's plan worked out on a thread of its own (:mod:`dataflow.client.planner`)."""

from __future__ import annotations

import threading

import pytest

from dataflow.client.cursor import Pass
from dataflow.client.planner import Planner
from dataflow.errors import InternalError


def _named(span: Pass) -> tuple[Pass, str]:
    return span, threading.current_thread().name


def test_a_prepared_plan_is_handed_over_and_any_other_is_worked_out_on_the_spot() -> None:
    planner = Planner(_named)
    me = threading.current_thread().name
    try:
        planner.prepare(Pass(1, 0))
        span, where = planner(Pass(1, 0))
        assert span == Pass(1, 0) and where.startswith("dataflow-plan")
        assert planner(Pass(1, 0)) == (Pass(1, 0), me)  # handed over once
        planner.prepare(Pass(2, 0))
        assert planner(Pass(3, 5)) == (Pass(3, 5), me)  # not the prepared one: dropped
        assert planner(Pass(2, 0)) == (Pass(2, 0), me)
        planner.prepare(Pass(4, 0))
        planner.prepare(Pass(5, 0))  # the latest is kept
        assert planner(Pass(5, 0))[1].startswith("dataflow-plan")
    finally:
        planner.close()
    planner.close()  # idempotent


def test_an_error_of_a_prepared_plan_is_raised_when_it_is_asked_for() -> None:
    def failing(span: Pass) -> None:
        raise InternalError(f"plan of {span} failed")

    planner = Planner(failing)
    try:
        planner.prepare(Pass(1, 0))
        with pytest.raises(InternalError, match=r"plan of .*epoch=1.* failed"):
            planner(Pass(1, 0))
    finally:
        planner.close()
