"""The training step of controlled cost that the bench's trainer runs on every batch.

Three modes, chosen so that a stall shows up the way it would in real training:

* ``gpu``: a chain of square matmuls on the default CUDA stream, calibrated at start so that
  one step takes ``step_ms``. The trainer only enqueues it; the GPU runs it while the trainer
  already waits for the next batch, so data stalls and copy overlap are real.
* ``sleep``: ``time.sleep(step_ms)``. Like a GPU step it leaves the trainer's CPU free for
  that time, so background threads of a loader (prefetch, pinning) can run meanwhile.
* ``cpu``: a busy loop of numpy ufuncs on a small array for ``step_ms``, keeping one trainer
  core busy, like a CPU-bound training step. numpy releases the GIL inside the loops, as torch
  CPU kernels do, so a loader's threads can still take turns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from dataflow.errors import ConfigError

CALIBRATION_ITERS = 20
MATMUL_SIZES = (4096, 2048, 1024, 512)
_BUSY_ELEMENTS = 16_384


class Step(Protocol):
    """One training step: consumes a batch (already on the step's device)."""

    mode: str
    target_s: float

    def __call__(self, batch: Mapping[str, object]) -> None:
        """Run (or, on a GPU, enqueue) one step on ``batch``."""

    def describe(self) -> str:
        """One line saying what the step does, for the report."""


class SleepStep:
    """A step that sleeps: the trainer's CPU is free for ``target_s`` seconds."""

    mode = "sleep"

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s

    def __call__(self, batch: Mapping[str, object]) -> None:
        if self.target_s > 0:
            time.sleep(self.target_s)

    def describe(self) -> str:
        return f"sleep {self.target_s * 1e3:g} ms (trainer CPU free, like a GPU step)"


class CpuStep:
    """A step that keeps one trainer core busy for ``target_s`` seconds."""

    mode = "cpu"

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self._a = np.linspace(0.0, 1.0, _BUSY_ELEMENTS, dtype=np.float32)
        self._b = np.empty_like(self._a)

    def __call__(self, batch: Mapping[str, object]) -> None:
        deadline = time.perf_counter() + self.target_s
        while time.perf_counter() < deadline:
            np.sqrt(self._a, out=self._b)
            np.multiply(self._b, self._b, out=self._b)

    def describe(self) -> str:
        return f"cpu busy {self.target_s * 1e3:g} ms (one trainer core busy)"


def _first_tensor(batch: Mapping[str, object]) -> torch.Tensor | None:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value
    return None


class GpuStep:
    """A chain of ``n x n`` fp16 matmuls on the default CUDA stream, sized to ``target_s``.

    Calibration picks the largest size in ``MATMUL_SIZES`` whose single matmul takes at most a
    quarter of the target, times it with CUDA events and sets the chain length to
    ``round(target / time_per_matmul)``. Each step first reduces one tensor of the batch into
    the chain's input, so the step depends on the batch and cannot start before its copy ends.
    """

    mode = "gpu"

    def __init__(self, target_s: float, device: torch.device) -> None:
        if device.type != "cuda":
            raise ConfigError(f"`step` gpu needs a CUDA device. Found: {device}")
        self.target_s = target_s
        self.device = device
        self.size, self.per_matmul_s = self._calibrate()
        self.chain = round(target_s / self.per_matmul_s) if target_s > 0 else 0
        generator = torch.Generator(device=device).manual_seed(0)
        self._a = torch.randn(self.size, self.size, device=device, dtype=torch.float16,
                              generator=generator)
        self._b = torch.randn_like(self._a) / self.size**0.5
        self._sink = torch.zeros((), device=device, dtype=torch.float32)

    def _time_matmul(self, size: int) -> float:
        a = torch.randn(size, size, device=self.device, dtype=torch.float16)
        b = torch.randn_like(a)
        for _ in range(3):
            torch.mm(a, b)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALIBRATION_ITERS):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / CALIBRATION_ITERS

    def _calibrate(self) -> tuple[int, float]:
        per = 0.0
        for size in MATMUL_SIZES:
            per = self._time_matmul(size)
            if self.target_s == 0 or per <= self.target_s / 4:
                return size, per
        return MATMUL_SIZES[-1], per

    def __call__(self, batch: Mapping[str, object]) -> None:
        x = _first_tensor(batch)
        if x is not None:
            self._sink += x.float().mean()
        a = self._a
        for _ in range(self.chain):
            a = torch.mm(a, self._b)
        self._sink += a[0, 0].float()

    def describe(self) -> str:
        return (
            f"gpu {self.chain} x matmul {self.size}^2 fp16 "
            f"({self.per_matmul_s * 1e3:.3f} ms each, target {self.target_s * 1e3:g} ms)"
        )


def resolve_mode(mode: str) -> str:
    """The concrete step mode: ``auto`` becomes ``gpu`` with CUDA, else ``sleep``."""
    if mode == "auto":
        return "gpu" if torch.cuda.is_available() else "sleep"
    if mode == "gpu" and not torch.cuda.is_available():
        raise ConfigError("`step` gpu needs CUDA, which this machine lacks. Found: step='gpu'")
    return mode


def make_step(mode: str, step_ms: float) -> Step:
    """Build (and for ``gpu``, calibrate) the step.

    Args:
        mode: ``gpu``, ``sleep``, ``cpu`` or ``auto``.
        step_ms: target step duration in milliseconds.
    """
    mode = resolve_mode(mode)
    target_s = step_ms / 1e3
    if mode == "gpu":
        return GpuStep(target_s, torch.device("cuda", torch.cuda.current_device()))
    if mode == "cpu":
        return CpuStep(target_s)
    return SleepStep(target_s)
