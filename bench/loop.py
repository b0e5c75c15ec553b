"""The measured training loop and its accounting; knows nothing about any particular loader.

Definitions (every figure covers the measured steps only; warm-up steps are excluded):

* **wait** (data stall): time the accelerator sat idle because the trainer did not have the
  next batch. In the ``sleep`` and ``cpu`` modes it is the host time spent in ``next(it)``.
  In ``gpu`` mode it is measured on the GPU with CUDA events: from the end of step ``i - 1``
  to the moment the trainer, holding batch ``i``, could enqueue work (an event recorded on
  the default stream right after ``next(it)`` returns completes at the later of the two).
* **transfer**: host-to-device copy time not hidden by overlap. In ``gpu`` mode, from that
  event to the start of step ``i``, which waits for the batch's copy; zero when the copy ran
  while the previous step was still computing. In the CPU modes it is the host time of the
  ``to_device`` hook.
* **step**: compute time of the step (GPU time between its events in ``gpu`` mode).
* **wall**: host time of the measured steps (``gpu`` mode: GPU time from the end of the last
  warm-up step to the end of the last measured step, after a full synchronize).
* **GPU-idle fraction** = (sum of wait + sum of transfer) / wall.
* **time to first batch**: from the call that creates the iterator to the first batch.
* **trainer CPU**: ``time.process_time()`` of the trainer process (all its threads: the
  loop, the loader's client threads, pinning threads) over the measured steps.

In ``gpu`` mode the trainer does not synchronize per step; it keeps at most ``inflight`` steps
queued ahead of the GPU (waiting on the end event of step ``i - inflight``), like a loop that
reads its loss with a short lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dataflow.bench.steps import Step
from dataflow.checks import check_int
from dataflow.errors import ConfigError, SchemaError

Batch = Mapping[str, object]
ToDevice = Callable[[Batch], Batch]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Measurement:
    """What one run of the loop measured.

    Attributes:
        wait_s: per measured step, data stall (see module docstring), seconds, shape (steps,).
        transfer_s: per measured step, un-hidden host-to-device time, seconds.
        step_s: per measured step, step compute time, seconds.
        host_wait_s: per measured step, host time blocked in ``next(it)``, seconds.
        samples: per measured step, samples in the batch.
        wall_s: duration of the measured steps, seconds.
        ttfb_s: time to first batch from iterator creation, seconds.
        trainer_cpu_s: trainer-process CPU time over the measured steps, seconds.
        distinct_ids: distinct values of the ``id`` field over the measured steps (-1 when
            the batches have no ``id`` tensor).
    """

    wait_s: np.ndarray
    transfer_s: np.ndarray
    step_s: np.ndarray
    host_wait_s: np.ndarray
    samples: np.ndarray
    wall_s: float
    ttfb_s: float
    trainer_cpu_s: float
    distinct_ids: int

    @property
    def idle_fraction(self) -> float:
        """GPU-idle fraction: (wait + transfer) / wall."""
        return float((self.wait_s.sum() + self.transfer_s.sum()) / self.wall_s)


def batch_size_of(batch: Batch) -> int:
    """Samples in a batch: the leading dimension of its ``id`` field, else of its first field.

    Raises:
        SchemaError: the batch has no field with a length.
    """
    if "id" in batch and hasattr(batch["id"], "__len__"):
        return len(batch["id"])
    for value in batch.values():
        if hasattr(value, "__len__"):
            return len(value)
    raise SchemaError(f"batch has no field with a length; fields: {sorted(batch)}")


def _ids_of(batch: Batch) -> np.ndarray | None:
    value = batch.get("id")
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().astype(np.int64, copy=True).ravel()
    return None


def gpu_split(
    issued_ms: Sequence[float], started_ms: Sequence[float], ended_ms: Sequence[float],
    warmup: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Split a GPU timeline into per-step wait, transfer and step times.

    Args:
        issued_ms: per step, when the default stream reached the point recorded right after
            ``next(it)`` returned, milliseconds from a common reference, shape (n,).
        started_ms: per step, when the step's kernels could start (after the copy), ms.
        ended_ms: per step, when the step's kernels ended, ms.
        warmup: leading steps to exclude (at least 1: step ``warmup - 1`` ends the warm-up).

    Returns:
        ``(wait_s, transfer_s, step_s, wall_s)`` for steps ``warmup..n-1``; times in seconds,
        negative event jitter clipped to 0.
    """
    issued = np.asarray(issued_ms, dtype=np.float64)
    started = np.asarray(started_ms, dtype=np.float64)
    ended = np.asarray(ended_ms, dtype=np.float64)
    if warmup < 1 or not len(issued) == len(started) == len(ended) > warmup:
        raise ConfigError(
            f"gpu timeline needs equal-length event lists longer than warmup={warmup}. "
            f"Found: {len(issued)}, {len(started)}, {len(ended)}"
        )
    measured = slice(warmup, None)
    wait = np.clip(issued[measured] - ended[warmup - 1 : -1], 0.0, None)
    transfer = np.clip(started[measured] - issued[measured], 0.0, None)
    step = np.clip(ended[measured] - started[measured], 0.0, None)
    wall = float(ended[-1] - ended[warmup - 1])
    return wait / 1e3, transfer / 1e3, step / 1e3, wall / 1e3


def _timed_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


class _Clocks:
    """Host-side per-step records of one run."""

    def __init__(self, total: int) -> None:
        self.host_wait = np.zeros(total)
        self.transfer = np.zeros(total)
        self.step = np.zeros(total)
        self.samples = np.zeros(total, dtype=np.int64)
        self.ids: list[np.ndarray] = []


def measure(
    batches: Iterable[Batch],
    *,
    step: Step,
    to_device: ToDevice,
    warmup: int,
    steps: int,
    inflight: int = 2,
    on_step: Callable[[int, int], None] | None = None,
    on_window: Callable[[str], None] | None = None,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock = time.process_time,
) -> Measurement:
    """Run ``warmup + steps`` training steps on batches from ``batches`` and account for time.

    Args:
        batches: any iterable of batches (dicts of tensors); it must yield at least
            ``warmup + steps`` batches (loaders chain epochs themselves).
        step: the training step; ``step.mode == "gpu"`` switches to CUDA-event accounting.
        to_device: hook moving a host batch to the step's device.
        warmup: steps excluded from the figures (at least 1).
        steps: measured steps.
        inflight: ``gpu`` mode only: most steps queued ahead of the GPU.
        on_step: called as ``on_step(i, total)`` after each step (progress display).
        on_window: called with ``"start"`` and ``"end"`` at the edges of the measured window
            (the caller snapshots loader-process counters there).
        clock: host wall clock, seconds (tests inject a fake one to get exact figures).
        cpu_clock: the trainer process's CPU clock, seconds.

    Returns:
        The :class:`Measurement` of the measured steps.

    Raises:
        ConfigError: the iterable ended before ``warmup + steps`` batches.
    """
    warmup, steps = check_int("warmup", warmup, 1), check_int("steps", steps, 1)
    gpu = step.mode == "gpu"
    total = warmup + steps
    clocks = _Clocks(total)
    events: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = []
    if gpu:
        reference = _timed_event()
        reference.record()
    created = clock()
    it = iter(batches)
    ttfb = cpu0 = t_start = 0.0
    for i in range(total):
        if i == warmup:
            # Snapshots first: their host time must not show as GPU idle in the first step.
            if on_window is not None:
                on_window("start")
            cpu0 = cpu_clock()
            if gpu:
                torch.cuda.synchronize()
            t_start = clock()
        t0 = clock()
        try:
            batch = next(it)
        except StopIteration:
            raise ConfigError(
                f"the loader ended after {i} batches; the bench needs {total} "
                f"(warmup {warmup} + steps {steps})"
            ) from None
        t1 = clock()
        if i == 0:
            ttfb = t1 - created
        clocks.host_wait[i] = t1 - t0
        clocks.samples[i] = batch_size_of(batch)
        if i >= warmup:
            ids = _ids_of(batch)
            if ids is not None:
                clocks.ids.append(ids)
        if gpu:
            marks = (_timed_event(), _timed_event(), _timed_event())
            marks[0].record()
            on_device = to_device(batch)
            marks[1].record()
            step(on_device)
            marks[2].record()
            events.append(marks)
            if i >= inflight:
                events[i - inflight][2].synchronize()
        else:
            t_copy = clock()
            on_device = to_device(batch)
            t2 = clock()
            step(on_device)
            clocks.transfer[i] = t2 - t_copy
            clocks.step[i] = clock() - t2
        if on_step is not None:
            on_step(i + 1, total)
    if gpu:
        torch.cuda.synchronize()
    wall = clock() - t_start
    trainer_cpu = cpu_clock() - cpu0
    if on_window is not None:
        on_window("end")
    measured = slice(warmup, None)
    if gpu:
        wait, transfer, step_s, wall = gpu_split(
            [reference.elapsed_time(e[0]) for e in events],
            [reference.elapsed_time(e[1]) for e in events],
            [reference.elapsed_time(e[2]) for e in events],
            warmup,
        )
    else:
        wait = clocks.host_wait[measured]
        transfer = clocks.transfer[measured]
        step_s = clocks.step[measured]
    distinct = len(np.unique(np.concatenate(clocks.ids))) if clocks.ids else -1
    return Measurement(
        wait_s=wait,
        transfer_s=transfer,
        step_s=step_s,
        host_wait_s=clocks.host_wait[measured],
        samples=clocks.samples[measured],
        wall_s=wall,
        ttfb_s=ttfb,
        trainer_cpu_s=trainer_cpu,
        distinct_ids=distinct,
    )
