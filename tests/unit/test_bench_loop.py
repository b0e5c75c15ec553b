"""The bench's accounting, checked against fake loaders with known injected delays.

The accounting tests run the loop on a fake clock that only the fake loader, copy and step
advance, so every figure is exact and nothing depends on how busy the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch

from dataflow.bench.loop import batch_size_of, gpu_split, measure
from dataflow.bench.steps import CpuStep, SleepStep, make_step, resolve_mode
from dataflow.bench.transfer import identity
from dataflow.errors import ConfigError, SchemaError

BATCH = 8


class FakeClock:
    """A clock in seconds that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeStep:
    """A sleep-mode step that takes ``target_s`` of fake time and no CPU."""

    mode = "sleep"

    def __init__(self, clock: FakeClock, target_s: float) -> None:
        self.clock = clock
        self.target_s = target_s

    def __call__(self, batch: object) -> None:
        self.clock.advance(self.target_s)

    def describe(self) -> str:
        return f"fake {self.target_s} s"


def batch_of(i: int) -> dict:
    return {"id": torch.arange(i * BATCH, (i + 1) * BATCH), "x": torch.zeros(BATCH, 4)}


def fake_loader(delays: Sequence[float], *, first_delay: float = 0.0) -> Iterator[dict]:
    """Yields len(delays) batches; sleeps delays[i] before batch i (first_delay before all)."""
    time.sleep(first_delay)
    for i, delay in enumerate(delays):
        time.sleep(delay)
        yield batch_of(i)


def timed_loader(clock: FakeClock, delays: Sequence[float], *,
                 first_delay: float = 0.0) -> Iterator[dict]:
    """Like :func:`fake_loader`, on ``clock``: batch i arrives ``delays[i]`` after asked for."""
    clock.advance(first_delay)
    for i, delay in enumerate(delays):
        clock.advance(delay)
        yield batch_of(i)


def test_stall_fraction_matches_injected_delays():
    clock = FakeClock()
    warmup, steps, step_s = 2, 30, 0.01
    measured = [0.02 if i % 3 == 0 else 0.0 for i in range(steps)]
    m = measure(timed_loader(clock, [0.05] * warmup + measured), step=FakeStep(clock, step_s),
                to_device=identity, warmup=warmup, steps=steps, clock=clock)
    expected_wait = sum(measured)
    assert m.wait_s.shape == (steps,)
    np.testing.assert_allclose(m.wait_s, measured, atol=1e-12)
    np.testing.assert_allclose(m.step_s, step_s, atol=1e-12)
    assert m.transfer_s.sum() == 0
    assert m.wall_s == pytest.approx(expected_wait + steps * step_s)
    assert m.idle_fraction == pytest.approx(expected_wait / (expected_wait + steps * step_s))
    assert m.samples.sum() == steps * BATCH
    assert m.distinct_ids == steps * BATCH


def test_transfer_is_counted_as_idle():
    clock = FakeClock()
    steps, copy_s, step_s = 20, 0.004, 0.006

    def slow_copy(batch):
        clock.advance(copy_s)
        return batch

    m = measure(timed_loader(clock, [0.0] * (steps + 1)), step=FakeStep(clock, step_s),
                to_device=slow_copy, warmup=1, steps=steps, clock=clock)
    np.testing.assert_allclose(m.transfer_s, copy_s, atol=1e-12)
    assert m.wait_s.sum() == 0
    assert m.wall_s == pytest.approx(steps * (copy_s + step_s))
    assert m.idle_fraction == pytest.approx(copy_s / (copy_s + step_s))


def test_warmup_is_excluded_and_first_batch_timed():
    clock = FakeClock()
    m = measure(timed_loader(clock, [0.1, 0.05] + [0.0] * 10, first_delay=0.05),
                step=FakeStep(clock, 0.002), to_device=identity, warmup=2, steps=10,
                clock=clock)
    assert m.ttfb_s == pytest.approx(0.15)
    assert m.wait_s.sum() == 0
    assert m.wall_s == pytest.approx(10 * 0.002)
    assert m.idle_fraction == 0


def test_trainer_cpu_covers_the_measured_steps_only():
    clock, cpu = FakeClock(), FakeClock()

    def busy_copy(batch):
        cpu.advance(0.001)
        return batch

    m = measure(timed_loader(clock, [0.0] * 5), step=FakeStep(clock, 0.01), to_device=busy_copy,
                warmup=2, steps=3, clock=clock, cpu_clock=cpu)
    assert m.trainer_cpu_s == pytest.approx(3 * 0.001)


@pytest.mark.timeout(30)
def test_sleep_step_leaves_trainer_cpu_free():
    # Real clocks: CPU time can only fall behind wall time under load, never run ahead of it.
    m = measure(fake_loader([0.0] * 21), step=SleepStep(0.01), to_device=identity,
                warmup=1, steps=20)
    assert m.trainer_cpu_s < 0.5 * m.wall_s


def test_progress_and_window_callbacks():
    seen, edges = [], []
    measure(fake_loader([0.0] * 5), step=SleepStep(0.0), to_device=identity, warmup=2,
            steps=3, on_step=lambda done, total: seen.append((done, total)),
            on_window=edges.append)
    assert seen == [(i, 5) for i in range(1, 6)]
    assert edges == ["start", "end"]


def test_short_loader_raises_with_counts():
    with pytest.raises(ConfigError, match="ended after 3 batches; the bench needs 5"):
        measure(fake_loader([0.0] * 3), step=SleepStep(0.0), to_device=identity, warmup=1,
                steps=4)


def test_warmup_and_steps_validated():
    with pytest.raises(ConfigError, match="`warmup` must be an integer >= 1"):
        measure(fake_loader([0.0]), step=SleepStep(0.0), to_device=identity, warmup=0, steps=1)


def test_gpu_split_on_a_known_timeline():
    # step i: issued, started, ended (ms). Step 0 is warm-up.
    issued = [0.0, 10.0, 25.0, 40.0]
    started = [1.0, 12.0, 25.0, 41.0]
    ended = [10.0, 22.0, 35.0, 51.0]
    wait, transfer, step, wall = gpu_split(issued, started, ended, warmup=1)
    np.testing.assert_allclose(wait * 1e3, [0.0, 3.0, 5.0])
    np.testing.assert_allclose(transfer * 1e3, [2.0, 0.0, 1.0])
    np.testing.assert_allclose(step * 1e3, [10.0, 10.0, 10.0])
    assert wall == pytest.approx(0.041)
    assert (wait.sum() + transfer.sum() + step.sum()) == pytest.approx(wall)


def test_gpu_split_rejects_bad_timelines():
    with pytest.raises(ConfigError, match="longer than warmup"):
        gpu_split([0.0], [0.0], [1.0], warmup=1)
    with pytest.raises(ConfigError, match="equal-length"):
        gpu_split([0.0, 1.0], [0.0], [1.0, 2.0], warmup=1)


def test_batch_size_of():
    assert batch_size_of({"id": torch.zeros(5)}) == 5
    assert batch_size_of({"text": ["a", "b"]}) == 2
    with pytest.raises(SchemaError, match="no field with a length"):
        batch_size_of({"n": 3})


def test_cpu_step_takes_its_time():
    step = CpuStep(0.02)
    t0 = time.perf_counter()
    step({})
    assert time.perf_counter() - t0 >= 0.02


def test_step_modes_without_cuda():
    assert make_step("sleep", 5).describe().startswith("sleep 5 ms")
    assert make_step("cpu", 5).mode == "cpu"
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_mode("auto") == "sleep"
    with pytest.raises(ConfigError, match="needs CUDA"):
        make_step("gpu", 5)
