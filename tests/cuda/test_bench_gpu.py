"""The bench's GPU mode: calibrated matmul step and CUDA-event accounting (skipped without CUDA)."""

from __future__ import annotations

import time

import pytest
import torch

from dataflow.bench.loop import measure
from dataflow.bench.steps import GpuStep
from dataflow.bench.transfer import CopyToDevice

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def batches(delays):
    """Batches after the given stalls; pinned once beforehand, so that a stall is the sleep alone
    (a fresh pinned allocation per batch costs the host ~4 ms on an H100 machine)."""
    pool = [{"id": torch.arange(i * 8, i * 8 + 8).pin_memory(),
             "image": torch.zeros(8, 3, 64, 64, dtype=torch.uint8).pin_memory()}
            for i in range(4)]
    for i, delay in enumerate(delays):
        time.sleep(delay)
        yield pool[i % len(pool)]


@pytest.mark.timeout(120)
def test_gpu_step_is_calibrated():
    step = GpuStep(0.01, torch.device("cuda"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batch = {"x": torch.ones(4, device="cuda")}
    step(batch)
    start.record()
    for _ in range(10):
        step(batch)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) / 10 == pytest.approx(10.0, rel=0.3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stall_ms, step_ms", [(20, 10), (20, 5), (40, 10)])
def test_gpu_idle_matches_injected_stalls(stall_ms: float, step_ms: float):
    """The loader needs ``stall_ms`` per batch, the GPU ``step_ms`` per step: in steady state
    the GPU idles for the rest of each period. The period is the stall plus the trainer's own
    time to launch the step (a few ms of Python for ~50 matmuls), so it is measured on the host
    clock, independently of the CUDA events the accounting uses: both must agree within 2
    points, and the idle is at least what the stall alone implies."""
    steps = 60
    step = GpuStep(step_ms / 1e3, torch.device("cuda"))
    edges: dict[str, float] = {}
    m = measure(batches([stall_ms / 1e3] * (steps + 3)), step=step,
                to_device=CopyToDevice(torch.device("cuda")), warmup=3, steps=steps,
                on_window=lambda edge: edges.setdefault(edge, time.perf_counter()))
    host_wall = edges["end"] - edges["start"]
    assert m.host_wait_s.mean() == pytest.approx(stall_ms / 1e3, abs=2e-3)
    assert m.idle_fraction == pytest.approx(1 - m.step_s.sum() / host_wall, abs=0.02)
    assert m.idle_fraction >= (stall_ms - step_ms) / stall_ms - 0.02
    assert m.step_s.mean() == pytest.approx(step_ms / 1e3, rel=0.3)
    assert m.transfer_s.sum() < 0.05 * m.wall_s
