"""Bench settings: one frozen, validated dataclass shared by every mode of the bench."""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.checks import check_int
from dataflow.errors import ConfigError

LOADERS = ("dataflow", "torch", "streaming", "litdata", "ray")
STEP_MODES = ("auto", "gpu", "sleep", "cpu")


@dataclass(frozen=True)
class BenchConfig:
    """What one bench run measures, identical for every loader it compares.

    Attributes:
        data: dataset specs (paths, dirs, globs, brace ranges) of the shards to read.
        loaders: loaders to compare, in run order; names from ``LOADERS``.
        batch_size: samples per batch.
        workers: loading processes per loader, the shared CPU budget: torch's ``num_workers``,
            dataflow's total server reader processes, each peer's worker count.
        servers: local dataflow servers started by the bench (``workers`` is split evenly).
        endpoints: endpoints of running dataflow servers; when given, none are started.
        step: ``gpu``, ``sleep``, ``cpu``, or ``auto`` (``gpu`` with CUDA, else ``sleep``).
        step_ms: target duration of one training step, milliseconds (0 allowed).
        warmup: steps run before measuring (excluded from every figure).
        steps: measured steps per run.
        repeats: runs per loader; the median of each figure is reported.
        shuffle: whether loaders shuffle.
        seed: shuffle seed.
        prefetch: batches each loader may prepare ahead (dataflow ``prefetch``, torch
            ``prefetch_factor`` per worker).
        inflight: GPU mode only: steps the trainer may queue ahead of the GPU.
        io_threads: ZeroMQ I/O threads of dataflow's DataLoader (its ``io_threads``: at most
            64; large batches receive faster with 2 or more).
        timeout_s: seconds a loader may take for one batch before the run fails.
        out_dir: directory for the JSON, the PNG and cached peer conversions.
    """

    data: tuple[str, ...]
    loaders: tuple[str, ...] = ("dataflow", "torch")
    batch_size: int = 64
    workers: int = 2
    servers: int = 2
    endpoints: tuple[str, ...] = ()
    step: str = "auto"
    step_ms: float = 10.0
    warmup: int = 10
    steps: int = 200
    repeats: int = 3
    shuffle: bool = True
    seed: int = 0
    prefetch: int = 4
    inflight: int = 2
    io_threads: int = 1
    timeout_s: float = 60.0
    out_dir: str = "bench-out"

    def __post_init__(self) -> None:
        if not self.data or not all(isinstance(d, str) and d for d in self.data):
            raise ConfigError(f"`data` must be one or more non-empty specs. Found: {self.data!r}")
        if not self.loaders:
            raise ConfigError("`loaders` must name at least one loader. Found: ()")
        unknown = [name for name in self.loaders if name not in LOADERS]
        if unknown:
            raise ConfigError(f"`loaders` must be among {LOADERS}. Found: {unknown[0]!r}")
        if len(set(self.loaders)) != len(self.loaders):
            raise ConfigError(f"`loaders` must not repeat a loader. Found: {self.loaders}")
        for name in ("batch_size", "workers", "servers", "warmup", "steps", "repeats",
                     "prefetch", "inflight", "io_threads"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if not self.timeout_s > 0:
            raise ConfigError(f"`timeout_s` must be greater than 0. Found: {self.timeout_s}")
        if self.step not in STEP_MODES:
            raise ConfigError(f"`step` must be one of {STEP_MODES}. Found: {self.step!r}")
        if self.step_ms < 0:
            raise ConfigError(f"`step_ms` must be 0 or more. Found: {self.step_ms}")
        if not self.endpoints and self.workers % self.servers:
            raise ConfigError(
                f"`workers` must be a multiple of `servers` so every server gets the same "
                f"number of reader processes. Found: workers={self.workers}, "
                f"servers={self.servers}"
            )
        if not self.out_dir:
            raise ConfigError("`out_dir` must be a directory path. Found: ''")

    @property
    def workers_per_server(self) -> int:
        """Reader processes of each local dataflow server."""
        return self.workers // self.servers
