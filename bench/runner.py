"""Runs every loader of a configuration ``repeats`` times, interleaved, and collects figures."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData
from dataflow.bench.loaders import DataflowRun, LoaderRun, TorchRun
from dataflow.bench.loop import Measurement, measure
from dataflow.bench.peers import PEERS, unavailable_reason
from dataflow.bench.procs import (
    cpu_delta,
    cpu_snapshot,
    peak_rss_bytes,
    reset_peak_rss,
    total_peak_rss,
)
from dataflow.bench.steps import Step
from dataflow.bench.transfer import CopyToDevice, identity

PROCESS_EXIT_WAIT_S = 10.0
MIB = 2**20


@dataclass(frozen=True)
class RunResult:
    """One loader, one repeat.

    Attributes:
        loader: loader name.
        repeat: repeat number, from 0.
        description: how the loader was set up.
        measurement: the loop's measurement.
        setup_s: seconds to open the loader (start servers / workers) before iterating.
        trainer_peak_rss: peak RSS of the trainer process during this run, bytes, or None
            where the peak could not be reset between runs.
        loader_peak_rss: sum of the peak RSS of the loader's processes, bytes (None: not
            measurable, e.g. remote servers).
        loader_cpu_s: CPU seconds of the loader's processes over the measured steps (None:
            not measurable).
        loader_processes: loader processes seen.
        budget: loading processes the loader used (see ``LoaderRun.budget``).
    """

    loader: str
    repeat: int
    description: str
    measurement: Measurement
    setup_s: float
    trainer_peak_rss: int | None
    loader_peak_rss: int | None
    loader_cpu_s: float | None
    loader_processes: int
    budget: int

    def figures(self) -> dict[str, float | None]:
        """The headline figures of this run (units in the key names)."""
        m = self.measurement
        steps = len(m.wait_s)
        wait_ms = m.wait_s * 1e3
        return {
            "gpu_idle": m.idle_fraction,
            "samples_per_s": float(m.samples.sum() / m.wall_s),
            "batches_per_s": steps / m.wall_s,
            "wait_p50_ms": float(np.percentile(wait_ms, 50)),
            "wait_p95_ms": float(np.percentile(wait_ms, 95)),
            "wait_p99_ms": float(np.percentile(wait_ms, 99)),
            "transfer_ms": float(m.transfer_s.mean() * 1e3),
            "step_ms": float(m.step_s.mean() * 1e3),
            "trainer_cpu_ms_per_batch": m.trainer_cpu_s / steps * 1e3,
            "loader_cpu_ms_per_batch": (None if self.loader_cpu_s is None
                                        else self.loader_cpu_s / steps * 1e3),
            "trainer_peak_rss_mib": (None if self.trainer_peak_rss is None
                                     else self.trainer_peak_rss / MIB),
            "loader_peak_rss_mib": (None if self.loader_peak_rss is None
                                    else self.loader_peak_rss / MIB),
            "ttfb_s": m.ttfb_s,
            "setup_s": self.setup_s,
        }


@dataclass
class BenchOutcome:
    """Everything one configuration produced.

    Attributes:
        results: per loader, its runs in repeat order.
        skipped: per loader not run, the reason.
        failed: per loader that raised, the error message.
        prepare_s: per loader, seconds spent converting the data to its format (peers), and
            whether the conversion came from the cache.
    """

    results: dict[str, list[RunResult]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    prepare: dict[str, dict[str, object]] = field(default_factory=dict)


def median_figures(runs: list[RunResult]) -> dict[str, float | None]:
    """Per figure, the median over repeats (None where a figure is not measurable)."""
    per_run = [r.figures() for r in runs]
    out: dict[str, float | None] = {}
    for key in per_run[0]:
        values = [v for v in (f[key] for f in per_run) if v is not None]
        out[key] = float(np.median(values)) if values else None
    return out


class Progress:
    """One status line on stderr, rewritten in place on a terminal, else one line per run."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last = 0.0

    def step(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if self.tty and (done == total or now - self._last > 0.2):
            self._last = now
            self.stream.write(f"\r{label}: step {done}/{total}   ")
            self.stream.flush()

    def line(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r")
        self.stream.write(text + "\n")
        self.stream.flush()


def schedule(names: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """The runs of a configuration in order, as ``(repeat, loader)``: every loader once per
    repeat, in ``names`` order, repeat after repeat (dataflow, torch, dataflow, torch, ...).

    Interleaved, the runs of one repeat share the machine's state (other jobs' load, the page
    cache, clocks), so a per-repeat ratio between two loaders compares them under the same
    conditions, and a drift of the machine shows as a spread between repeats instead of
    favouring the loader that ran first.
    """
    return [(repeat, name) for repeat in range(repeats) for name in names]


def _open(name: str, cfg: BenchConfig, data: BenchData, pin_memory: bool) -> LoaderRun:
    if name == "dataflow":
        return DataflowRun(cfg, data, pin_memory=pin_memory)
    if name == "torch":
        return TorchRun(cfg, data, pin_memory=pin_memory)
    return PEERS[name].open(cfg, data, pin_memory=pin_memory)


def _wait_exit(pids: list[int]) -> None:
    """Wait until a closed loader's processes are gone, so the next run has the CPUs."""
    deadline = time.monotonic() + PROCESS_EXIT_WAIT_S
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)


def run_once(name: str, repeat: int, cfg: BenchConfig, data: BenchData, step: Step,
             progress: Progress) -> RunResult:
    """Open loader ``name``, run the measured loop on it, read its process figures, close it."""
    gpu = step.mode == "gpu"
    to_device: Callable = CopyToDevice(torch.device("cuda")) if gpu else identity
    rss_reset = reset_peak_rss()
    t0 = time.perf_counter()
    loader = _open(name, cfg, data, pin_memory=gpu)
    setup_s = time.perf_counter() - t0
    pids: list[int] = []
    snapshots: dict[str, dict[int, float]] = {}
    label = f"{name} repeat {repeat + 1}/{cfg.repeats}"

    def on_window(edge: str) -> None:
        snapshots[edge] = cpu_snapshot(loader.pids())

    try:
        measurement = measure(
            loader.batches(), step=step, to_device=to_device, warmup=cfg.warmup,
            steps=cfg.steps, inflight=cfg.inflight,
            on_step=lambda done, total: progress.step(label, done, total),
            on_window=on_window,
        )
        pids = loader.pids()
        loader_rss = total_peak_rss(pids) if pids else None
        trainer_rss = peak_rss_bytes(os.getpid()) if rss_reset else None
    finally:
        loader.close()
        # Collect the loader's garbage now: a finalizer left in a reference cycle (torch's
        # iterator joins its workers for up to 5 s each) must not run inside the next run.
        gc.collect()
        _wait_exit(pids)
    loader_cpu = (cpu_delta(snapshots["start"], snapshots["end"])
                  if snapshots.get("end") else None)
    result = RunResult(
        loader=name, repeat=repeat, description=loader.description, measurement=measurement,
        setup_s=setup_s, trainer_peak_rss=trainer_rss, loader_peak_rss=loader_rss,
        loader_cpu_s=loader_cpu, loader_processes=len(pids), budget=loader.budget,
    )
    f = result.figures()
    progress.line(f"{label}: GPU-idle {f['gpu_idle']:.1%}, {f['samples_per_s']:,.0f} samples/s")
    return result


def run_all(cfg: BenchConfig, data: BenchData, step: Step,
            progress: Progress | None = None) -> BenchOutcome:
    """Every loader of ``cfg``, ``cfg.repeats`` times, interleaved (loader order per repeat).

    Peers that are not installed are skipped with their reason; a loader that fails, with any
    exception (a worker's error re-raised by torch keeps its own type), is recorded with its
    error and not run again; the others go on.
    """
    progress = progress or Progress()
    outcome = BenchOutcome()
    names: list[str] = []
    for name in cfg.loaders:
        reason = unavailable_reason(name)
        if reason is not None:
            outcome.skipped[name] = reason
            progress.line(f"skipping {name}: {reason}")
            continue
        if name in PEERS:
            try:
                outcome.prepare[name] = PEERS[name].prepare(cfg, data)
            except Exception as e:
                outcome.failed[name] = f"converting the data failed: {type(e).__name__}: {e}"
                progress.line(f"{name} failed: {outcome.failed[name]}")
                continue
        names.append(name)
    for repeat, name in schedule(names, cfg.repeats):
        if name in outcome.failed:
            continue
        try:
            run = run_once(name, repeat, cfg, data, step, progress)
        except Exception as e:
            outcome.failed[name] = f"{type(e).__name__}: {e}"
            progress.line(f"{name} failed: {outcome.failed[name]}")
            continue
        outcome.results.setdefault(name, []).append(run)
    return outcome
