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
    for i, delay in enumerate(delays):
        time.sleep(delay)
        yield {"id": torch.arange(i * 8, i * 8 + 8).pin_memory(),
               "image": torch.zeros(8, 3, 64, 64, dtype=torch.uint8).pin_memory()}


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
def test_gpu_idle_matches_injected_stalls():
    # The loader needs 20 ms per batch, the GPU 10 ms per step: whatever the trainer queues
    # ahead, in steady state the GPU idles (20 - 10) / 20 of the time.
    steps, stall_s, step_s = 30, 0.02, 0.01
    step = GpuStep(step_s, torch.device("cuda"))
    m = measure(batches([stall_s] * (steps + 3)), step=step,
                to_device=CopyToDevice(torch.device("cuda")), warmup=3, steps=steps)
    assert m.idle_fraction == pytest.approx((stall_s - step_s) / stall_s, abs=0.08)
    assert m.step_s.sum() == pytest.approx(steps * step_s, rel=0.3)
    assert m.transfer_s.sum() < 0.05 * m.wall_s
