"""Interleaved repeats and the spread the bench quotes, from synthetic timings."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.bench.loop import Measurement
from dataflow.bench.report import (
    format_table,
    headline,
    ratio_spread,
    repeat_ratios,
    spread,
    summary_rows,
)
from dataflow.bench.runner import BenchOutcome, RunResult, schedule

STEPS, BATCH = 10, 64


def timed(wall_s: float, idle: float) -> Measurement:
    """A run of STEPS batches of BATCH samples over ``wall_s`` seconds, ``idle`` of it
    waiting."""
    wait = np.full(STEPS, wall_s * idle / STEPS)
    step = np.full(STEPS, wall_s * (1 - idle) / STEPS)
    return Measurement(
        wait_s=wait, transfer_s=np.zeros(STEPS), step_s=step, host_wait_s=wait,
        samples=np.full(STEPS, BATCH), wall_s=wall_s, ttfb_s=0.1, trainer_cpu_s=0.01,
        distinct_ids=STEPS * BATCH,
    )


def result(loader: str, repeat: int, wall_s: float, idle: float = 0.1) -> RunResult:
    return RunResult(loader=loader, repeat=repeat, description=loader,
                     measurement=timed(wall_s, idle), setup_s=0.5, trainer_peak_rss=None,
                     loader_peak_rss=None, loader_cpu_s=None, loader_processes=2, budget=2)


def test_runs_are_interleaved_loader_by_loader():
    assert schedule(["dataflow", "torch"], 3) == [
        (0, "dataflow"), (0, "torch"), (1, "dataflow"), (1, "torch"),
        (2, "dataflow"), (2, "torch")]
    assert schedule(["torch", "dataflow", "ray"], 1) == [
        (0, "torch"), (0, "dataflow"), (0, "ray")]
    assert schedule(["dataflow"], 2) == [(0, "dataflow"), (1, "dataflow")]


def test_paired_ratios_cancel_a_machine_that_slows_between_repeats():
    # dataflow takes half torch's time on the same machine; the machine slows 1x, 3x, 1.5x
    # from one repeat to the next (another job), the same for both runs of a repeat.
    slowdown = {0: 1.0, 1: 3.0, 2: 1.5}
    true_wall = {"dataflow": 0.1, "torch": 0.2}
    outcome = BenchOutcome()
    for repeat, name in schedule(["dataflow", "torch"], 3):
        outcome.results.setdefault(name, []).append(
            result(name, repeat, true_wall[name] * slowdown[repeat]))
    ratios = repeat_ratios(outcome.results["dataflow"], outcome.results["torch"])
    assert ratios == pytest.approx([2.0, 2.0, 2.0])
    quoted = ratio_spread(outcome, "dataflow")
    assert quoted is not None
    assert (quoted.median, quoted.low, quoted.high) == pytest.approx((2.0, 2.0, 2.0))


def test_ratios_pair_runs_of_the_same_repeat_only():
    base = [result("torch", 0, 0.2), result("torch", 2, 0.4)]  # repeat 1 of torch is missing
    runs = [result("dataflow", r, 0.1) for r in range(3)]
    assert repeat_ratios(runs, base) == pytest.approx([2.0, 4.0])
    assert repeat_ratios(runs, []) == []


def test_spread_is_the_median_and_the_range():
    s = spread([3.0, 1.0, 2.0])
    assert (s.values, s.median, s.low, s.high) == ((3.0, 1.0, 2.0), 2.0, 1.0, 3.0)
    assert s.cell("{:.2f}x") == "2.00x [1.00-3.00]"
    assert s.cell("{:.2f}x", "!") == "2.00x! [1.00-3.00]"
    assert spread([0.5, 0.25]).cell("{:.1%}") == "37.5% [25.0-50.0]"
    assert spread([0.5]).cell("{:.1%}") == "50.0%"
    with pytest.raises(ValueError, match="at least one value"):
        spread([])


def noisy_outcome() -> BenchOutcome:
    """Three repeats on a busy machine: dataflow 2x, 4x and 1.5x torch's samples/s."""
    outcome = BenchOutcome()
    for repeat, (df_wall, torch_wall) in enumerate([(0.1, 0.2), (0.1, 0.4), (0.2, 0.3)]):
        outcome.results.setdefault("dataflow", []).append(
            result("dataflow", repeat, df_wall, idle=[0.02, 0.05, 0.10][repeat]))
        outcome.results.setdefault("torch", []).append(
            result("torch", repeat, torch_wall, idle=[0.5, 0.6, 0.4][repeat]))
    return outcome


def test_the_table_shows_each_ratio_with_its_range():
    outcome = noisy_outcome()
    rows = summary_rows(outcome, ["dataflow", "torch"])
    assert rows[0][2] == "5.0% [2.0-10.0]"
    assert rows[0][4] == "2.00x [1.50-4.00]"
    assert rows[1][2] == "50.0% [40.0-60.0]" and rows[1][4] == "1.00x"
    assert "2.00x [1.50-4.00]" in format_table(outcome, ["dataflow", "torch"])


def test_the_headline_quotes_the_median_with_the_range():
    assert headline(noisy_outcome()) == (
        "dataflow vs torch: 2.00x the samples/s, GPU-idle 5.0% vs 50.0% (median of 3 "
        "interleaved repeats; range 1.50x-4.00x, GPU-idle 2.0%-10.0% vs 40.0%-60.0%)")


def test_one_repeat_says_it_measured_no_spread():
    outcome = BenchOutcome()
    outcome.results["dataflow"] = [result("dataflow", 0, 0.1, idle=0.02)]
    outcome.results["torch"] = [result("torch", 0, 0.25, idle=0.5)]
    assert headline(outcome) == (
        "dataflow vs torch: 2.50x the samples/s, GPU-idle 2.0% vs 50.0% (1 repeat: no spread "
        "measured; --repeats 3 shows it)")
    assert summary_rows(outcome, ["dataflow", "torch"])[0][2:5] == ["2.0%", "6,400", "2.50x"]


def test_no_headline_without_both_loaders():
    outcome = noisy_outcome()
    outcome.failed["torch"] = "RuntimeError: boom"
    assert headline(outcome) is None
    alone = BenchOutcome()
    alone.results["dataflow"] = [result("dataflow", 0, 0.1)]
    assert headline(alone) is None
    assert summary_rows(alone, ["dataflow"])[0][4] == "n/a"
