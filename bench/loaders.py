"""Loader adapters: each yields batches endlessly (epoch after epoch) and names its processes.

Every adapter gets the same data, batch size and CPU budget (``BenchConfig.workers`` loading
processes) and yields ``dict[str, torch.Tensor | list]`` host batches; the bench's trainer
does the device copy the same way for all of them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch.utils.data import Dataset

from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData
from dataflow.bench.procs import descendants
from dataflow.bench.torch_datasets import ArrowMapDataset, webdataset_pipeline
from dataflow.errors import LoaderClosedError, ServerUnavailable

if TYPE_CHECKING:
    from dataflow.client import DataLoader
    from dataflow.index import DatasetIndex
    from dataflow.server import ServerHandle

Batch = Mapping[str, object]


class LoaderRun(Protocol):
    """An opened loader.

    Attributes:
        name: the loader's name in the report.
        description: how it was set up (processes, options), one line.
        budget: loading processes it uses, its share of the CPU budget: dataflow's reader
            processes over all servers (front processes not counted), torch's and the peers'
            workers.
    """

    name: str
    description: str
    budget: int

    def batches(self) -> Iterator[Batch]:
        """Batches forever, epoch after epoch (calling ``set_epoch`` where there is one)."""

    def pids(self) -> list[int]:
        """The live processes doing this loader's work outside the trainer process."""

    def close(self) -> None:
        """Stop the loader and its processes; idempotent."""


def dataflow_budget(readers: tuple[int, ...], *, local: bool) -> str:
    """How dataflow's servers are set up, from each server's reader process count."""
    counts = sorted(set(readers))
    shape = (f"{len(readers)} x {counts[0]}" if len(counts) == 1
             else " + ".join(str(r) for r in readers))
    where = "local" if local else "given"
    unmeasured = "" if local else "; their CPU and RSS not measured"
    return (f"{len(readers)} {where} server(s): {shape} = {sum(readers)} reader process(es) "
            f"+ {len(readers)} front process(es){unmeasured}")


def server_prefetch(cfg: BenchConfig, servers: int) -> int:
    """The bench's DataLoader's ``prefetch`` (requests kept at each of ``servers`` servers):
    the prefetch depth split over them, but never fewer than a server's reader processes (with
    ``--endpoints`` their count is not known beforehand: the split alone). The loader keeps a
    request at each reader only within the bytes of ``prefetch`` replies of 32 MiB (a batch
    per request for larger batches): fewer credits than readers would leave readers idle on
    large batches and cap the batches in flight whatever the servers added; torch's
    DataLoader likewise has at least one batch per worker in flight."""
    split = math.ceil(cfg.prefetch / servers)
    return split if cfg.endpoints else max(split, cfg.workers_per_server)


def served_index(endpoints: Sequence[str], *, batch_size: int, timeout: float
                 ) -> DatasetIndex:
    """The dataset index the servers at ``endpoints`` serve, as a DataLoader receives it (the
    first server to admit it; a server serving another dataset is kept out by the loader).

    Raises:
        ServerUnavailable: no server admitted a loader within ``timeout`` seconds.
    """
    from dataflow.client import DataLoader

    with DataLoader(list(endpoints), batch_size=batch_size, rank=0, world_size=1,
                    pin_memory=False, timeout=timeout) as loader:
        return loader.index


class DataflowRun:
    """dataflow's client over local servers it starts (or over given endpoints).

    ``cfg.workers`` reader processes in total: ``cfg.servers`` servers of
    ``cfg.workers_per_server`` each. Each server also has its own front process (sockets,
    scheduling), which shows in the loader CPU and RSS figures. ``cfg.prefetch`` batches are
    requested ahead in total, split evenly over the servers.
    """

    name = "dataflow"

    def __init__(self, cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> None:
        from dataflow.client import DataLoader
        from dataflow.server import launch

        self._handles: list[ServerHandle] = []
        self._loader: DataLoader | None = None
        try:
            if cfg.endpoints:
                endpoints = list(cfg.endpoints)
            else:
                for _ in range(cfg.servers):
                    self._handles.append(launch(list(data.shards), workers=cfg.workers_per_server,
                                                timeout=cfg.timeout_s))
                endpoints = [h.endpoint for h in self._handles]
            self._loader = DataLoader(
                endpoints, batch_size=cfg.batch_size, rank=0, world_size=1,
                shuffle=cfg.shuffle, seed=cfg.seed, pin_memory=pin_memory,
                prefetch=server_prefetch(cfg, len(endpoints)),
                timeout=cfg.timeout_s, io_threads=cfg.io_threads,
            )
            readers = self._all_joined(self._loader, endpoints, cfg.timeout_s)
            self.budget = sum(readers)
            self.description = dataflow_budget(readers, local=not cfg.endpoints) + (
                f", io_threads={cfg.io_threads}" if cfg.io_threads != 1 else "")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _all_joined(loader: DataLoader, endpoints: list[str], timeout: float
                    ) -> tuple[int, ...]:
        """Every server's reader count, once all of ``endpoints`` joined (the loader starts
        with the first; the budget counts them all).

        Raises:
            ServerUnavailable: not all joined within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while len(readers := loader.server_readers) < len(endpoints):
            if time.monotonic() > deadline:
                raise ServerUnavailable(", ".join(endpoints), f"{len(readers)} of "
                                        f"{len(endpoints)} servers joined within {timeout} s")
            time.sleep(0.01)
        return readers

    def batches(self) -> Iterator[Batch]:
        loader = self._loader
        if loader is None:
            raise LoaderClosedError("the dataflow bench loader is closed")
        return self._epochs(loader)

    @staticmethod
    def _epochs(loader: DataLoader) -> Iterator[Batch]:
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    def pids(self) -> list[int]:
        roots = [h.pid for h in self._handles]
        return sorted(set(roots) | set(descendants(roots)))

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None
        while self._handles:
            self._handles.pop().close()


class ReiterableRun:
    """A loader object that yields one epoch per iteration (torch-style), run epoch after epoch.

    Its processes are the trainer's descendants that appeared after construction began.
    """

    name: str
    description: str
    budget: int

    def __init__(self) -> None:
        self._before = set(descendants([os.getpid()]))
        self._epochs: Generator[Batch, None, None] | None = None
        self._loader: Iterable[Batch] | None = None

    def batches(self) -> Iterator[Batch]:
        if self._loader is None:
            raise LoaderClosedError(f"the {self.name} bench loader is closed")
        self._epochs = self._run_epochs(self._loader)
        return self._epochs

    @staticmethod
    def _run_epochs(loader: Iterable[Batch]) -> Generator[Batch, None, None]:
        while True:
            yield from loader

    def pids(self) -> list[int]:
        return [p for p in descendants([os.getpid()]) if p not in self._before]

    def close(self) -> None:
        """Drop the epoch generator and the loader; persistent workers exit with it."""
        if self._epochs is not None:
            self._epochs.close()
            self._epochs = None
        self._loader = None


class TorchRun(ReiterableRun):
    """``torch.utils.data.DataLoader`` with ``cfg.workers`` worker processes.

    Tar shards go through a webdataset pipeline batching in the workers; Arrow and Parquet
    shards through a map-style dataset with sampler and collation. Workers are persistent and
    prefetch ``ceil(cfg.prefetch / cfg.workers)`` batches each, so the total prefetch depth
    matches dataflow's.
    """

    name = "torch"

    def __init__(self, cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> None:
        super().__init__()
        prefetch_factor = max(1, math.ceil(cfg.prefetch / cfg.workers))
        dataset: Dataset
        batch_size: int | None
        shuffle: bool | None
        generator: torch.Generator | None
        if data.fmt in ("tar", "tar.gz"):
            dataset = webdataset_pipeline(data.shards, data.schema, batch_size=cfg.batch_size,
                                          shuffle=cfg.shuffle, seed=cfg.seed)
            batch_size, shuffle, generator = None, None, None
            kind = "webdataset pipeline"
        else:
            dataset = ArrowMapDataset(data.shards, data.sizes, data.schema, data.fmt)
            batch_size, shuffle = cfg.batch_size, cfg.shuffle
            generator = torch.Generator().manual_seed(cfg.seed)
            kind = "map-style Arrow dataset"
        self._loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
            num_workers=cfg.workers, pin_memory=pin_memory, persistent_workers=True,
            prefetch_factor=prefetch_factor, timeout=cfg.timeout_s,
        )
        self.budget = cfg.workers
        self.description = (f"DataLoader({kind}, num_workers={cfg.workers}, "
                            f"prefetch_factor={prefetch_factor}, pin_memory={pin_memory})")
