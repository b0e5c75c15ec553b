"""Peer loaders (optional): MosaicML Streaming, LitData, Ray Data.

Each peer reads its own format, so the bench converts the dataset once into
``<out_dir>/peers-cache/<peer>-<fingerprint>/`` (reused while the dataset is unchanged) and
reports how long the conversion took. A peer that is not installed, or fails to import, is
skipped with the reason. The peers live in a virtual environment of their own, made by
``make peers`` (:data:`PEERS_VENV`, beside the project's ``.venv``, whose packages it sees
behind its own): they pin older releases of packages the project's environment holds. Every
peer gets ``cfg.workers`` loading processes: DataLoader workers for Streaming and LitData,
``num_cpus`` for Ray (whose own daemons come on top and show in the loader CPU/RSS figures).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypedDict

import numpy as np
import torch
from torch.utils.data import default_collate

from dataflow.batch import Ragged
from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData
from dataflow.bench.loaders import Batch, LoaderRun, ReiterableRun
from dataflow.bench.procs import descendants, non_loopback_listeners
from dataflow.errors import SchemaError, ServerStartError
from dataflow.readers import open_shard

_DONE_MARKER = "bench-converted.json"


def shard_samples(url: str) -> Iterator[dict[str, object]]:
    """The samples of one shard as dicts of python scalars, numpy arrays and ``str``."""
    with open_shard(url) as reader:
        batch = reader.read(0, len(reader))
    for i in range(len(next(iter(batch.values())))):
        sample: dict[str, object] = {}
        for name, column in batch.items():
            if isinstance(column, Ragged):
                sample[name] = column[i]
            elif column.ndim == 1:
                sample[name] = column[i].item()
            else:
                sample[name] = np.ascontiguousarray(column[i])
        yield sample


def _cached(cfg: BenchConfig, data: BenchData, peer: str,
            convert: Callable[[str], None]) -> dict[str, object]:
    path = os.path.join(cfg.out_dir, "peers-cache", f"{peer}-{data.fingerprint[:16]}")
    marker = os.path.join(path, _DONE_MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            done = json.load(f)
        return {"path": path, "seconds": done["seconds"], "cached": True}
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    t0 = time.perf_counter()
    convert(path)
    seconds = time.perf_counter() - t0
    with open(marker, "w") as f:
        json.dump({"seconds": seconds}, f)
    return {"path": path, "seconds": seconds, "cached": False}


def _collate_host(samples: list[dict[str, object]]) -> dict[str, object]:
    return default_collate(samples)


class _LoaderKwargs(TypedDict):
    batch_size: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int


def _loader_kwargs(cfg: BenchConfig, pin_memory: bool) -> _LoaderKwargs:
    return _LoaderKwargs(batch_size=cfg.batch_size, num_workers=cfg.workers,
                         pin_memory=pin_memory, persistent_workers=True,
                         prefetch_factor=max(1, math.ceil(cfg.prefetch / cfg.workers)))


class _TorchLoaderPeer(ReiterableRun):
    """A peer whose loader is a torch-style DataLoader over its own dataset class."""

    def __init__(self, name: str, loader: Iterable[Batch], description: str,
                 budget: int) -> None:
        super().__init__()
        self.name = name
        self.description = description
        self.budget = budget
        self._loader = loader


def _mds_columns(data: BenchData) -> dict[str, str]:
    columns = {}
    for spec in data.schema:
        if spec.ragged == "str":
            columns[spec.name] = "str"
        elif spec.ragged == "bytes":
            columns[spec.name] = "bytes"
        elif spec.shape == () and spec.ragged is None:
            columns[spec.name] = spec.dtype
        elif spec.ragged is None:
            columns[spec.name] = f"ndarray:{spec.dtype}:{','.join(map(str, spec.shape))}"
        else:
            raise SchemaError(f"field {spec.name!r} ({spec}) has no MDS encoding here")
    return columns


def _streaming_prepare(cfg: BenchConfig, data: BenchData) -> dict[str, object]:
    from streaming import MDSWriter

    def convert(path: str) -> None:
        with MDSWriter(out=path, columns=_mds_columns(data), size_limit=1 << 26) as writer:
            for url in data.shards:
                for sample in shard_samples(url):
                    writer.write(sample)

    return _cached(cfg, data, "streaming", convert)


def _streaming_open(cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> _TorchLoaderPeer:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    path = _streaming_prepare(cfg, data)["path"]
    dataset = StreamingDataset(local=path, shuffle=cfg.shuffle, shuffle_seed=cfg.seed,
                               batch_size=cfg.batch_size)
    loader = torch.utils.data.DataLoader(dataset, collate_fn=_collate_host,
                                         **_loader_kwargs(cfg, pin_memory))
    return _TorchLoaderPeer("streaming", loader,
                            f"StreamingDataset (MDS) + DataLoader(num_workers={cfg.workers})",
                            cfg.workers)


def _litdata_prepare(cfg: BenchConfig, data: BenchData) -> dict[str, object]:
    import litdata

    def convert(path: str) -> None:
        litdata.optimize(fn=shard_samples, inputs=list(data.shards), output_dir=path,
                         chunk_bytes="64MB", num_workers=cfg.workers, verbose=False)

    return _cached(cfg, data, "litdata", convert)


def _litdata_open(cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> _TorchLoaderPeer:
    import litdata

    path = _litdata_prepare(cfg, data)["path"]
    dataset = litdata.StreamingDataset(input_dir=path, shuffle=cfg.shuffle, seed=cfg.seed)
    loader = litdata.StreamingDataLoader(dataset, collate_fn=_collate_host,
                                         **_loader_kwargs(cfg, pin_memory))
    return _TorchLoaderPeer("litdata", loader,
                            f"litdata StreamingDataLoader(num_workers={cfg.workers})", cfg.workers)


def _ray_table(url: str) -> object:
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray

    with open_shard(url) as reader:
        batch = reader.read(0, len(reader))
    columns = {}
    for name, column in batch.items():
        if isinstance(column, Ragged):
            columns[name] = pa.array([column[i] for i in range(len(column))])
        elif column.ndim == 1:
            columns[name] = pa.array(column)
        else:
            columns[name] = ArrowTensorArray.from_numpy(np.ascontiguousarray(column))
    return pa.table(columns)


def _ray_init(cfg: BenchConfig) -> None:
    import ray
    import ray.data

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if not ray.is_initialized():
        ray.init(num_cpus=cfg.workers, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, logging_level=logging.WARNING)
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)


def _ray_prepare(cfg: BenchConfig, data: BenchData) -> dict[str, object]:
    import pyarrow.parquet as pq

    def convert(path: str) -> None:
        for i, url in enumerate(data.shards):
            pq.write_table(_ray_table(url), os.path.join(path, f"part-{i:06d}.parquet"))

    return _cached(cfg, data, "ray", convert)


def _ray_collate(cfg_pin: bool, batch: dict[str, np.ndarray]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, values in batch.items():
        if values.dtype == object:
            out[name] = list(values)
        else:
            tensor = torch.from_numpy(np.array(values))
            out[name] = tensor.pin_memory() if cfg_pin else tensor
    return out


class RayRun:
    """Ray Data ``read_parquet`` + ``iter_torch_batches`` on a local Ray bound to 127.0.0.1."""

    name = "ray"

    def __init__(self, cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> None:
        import ray

        self._before = set(descendants([os.getpid()]))
        path = _ray_prepare(cfg, data)["path"]
        _ray_init(cfg)
        self._ray = ray
        exposed = non_loopback_listeners(self.pids())
        if exposed:
            self.close()
            raise ServerStartError(
                f"Ray processes {exposed} listen on non-loopback interfaces although Ray was "
                "started with _node_ip_address=127.0.0.1; the bench runs on loopback only"
            )
        self._cfg = cfg
        self.budget = cfg.workers
        self._pin = pin_memory
        self._path = path
        self.description = (f"ray.data.read_parquet + iter_torch_batches, num_cpus={cfg.workers}"
                            f", prefetch_batches={cfg.prefetch}")

    def batches(self) -> Iterator[Batch]:
        epoch = 0
        while True:
            ds = self._ray.data.read_parquet(self._path)
            if self._cfg.shuffle:
                ds = ds.randomize_block_order(seed=self._cfg.seed + epoch)
            yield from ds.iter_torch_batches(
                batch_size=self._cfg.batch_size, prefetch_batches=self._cfg.prefetch,
                collate_fn=partial(_ray_collate, self._pin),
                local_shuffle_buffer_size=1000 if self._cfg.shuffle else None,
                local_shuffle_seed=self._cfg.seed + epoch if self._cfg.shuffle else None,
            )
            epoch += 1

    def pids(self) -> list[int]:
        return [p for p in descendants([os.getpid()]) if p not in self._before]

    def close(self) -> None:
        if self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
        self._ray = None


class OpenPeer(Protocol):
    """Opens a peer's loader over its converted data."""

    def __call__(self, cfg: BenchConfig, data: BenchData, *, pin_memory: bool) -> LoaderRun:
        """The opened loader (``prepare`` has run or runs first, cached)."""


PEERS_VENV = ".venv-peers"
"""The peers' virtual environment, made by :data:`MAKE_PEERS` in the repository's root."""
MAKE_PEERS = "make peers"
"""The command that installs every peer (the Makefile's ``peers`` target), under the torch pin."""


@dataclass(frozen=True)
class Peer:
    """A peer loader.

    Attributes:
        module: the module whose import decides availability.
        package: the requirement :data:`MAKE_PEERS` installs for it.
        needs: per module the peer imports when it loads (other than its own), how to
            install it when missing or broken, for the skip message.
        prepare: converts the dataset (cached); returns path, seconds and cache hit.
        open: opens the loader (after ``prepare``).
    """

    module: str
    package: str
    needs: dict[str, str]
    prepare: Callable[[BenchConfig, BenchData], dict[str, object]]
    open: OpenPeer


TORCHVISION_FIX = (
    f"`rm -rf {PEERS_VENV}; {MAKE_PEERS} TORCH_INDEX=URL` installs the torchvision built for "
    f"this torch ({torch.__version__}) from the index torch came from, e.g. "
    "https://download.pytorch.org/whl/cpu for a CPU build (PyPI's torchvision is built for "
    "a CUDA torch and fails to load with a CPU one: `operator torchvision::nms does not exist`)"
)

PEERS: dict[str, Peer] = {
    "streaming": Peer("streaming", "mosaicml-streaming", {"torchvision": TORCHVISION_FIX},
                      _streaming_prepare, _streaming_open),
    "litdata": Peer("litdata", "litdata", {"torchvision": TORCHVISION_FIX},
                    _litdata_prepare, _litdata_open),
    "ray": Peer("ray.data", "ray[data]",
                {"pydantic": f"`{PEERS_VENV}/bin/python -m pip install pydantic`"},
                _ray_prepare, RayRun),
}


def install_hint(name: str) -> str:
    """How to install peer ``name`` and run the bench with it."""
    return (f"`{MAKE_PEERS}` (in the repository's root) installs the peers into {PEERS_VENV}, "
            "a virtual environment of their own that leaves .venv as it is; then run the "
            f"bench with its python: `{PEERS_VENV}/bin/python -m dataflow.bench run --loaders "
            f"dataflow,torch,{name} ...`")


def _needed(peer: Peer, error: BaseException) -> str | None:
    """The dependency of ``peer`` that ``error`` is about, or None."""
    missing = getattr(error, "name", None) or ""
    text = str(error)
    for module in peer.needs:
        if missing.split(".")[0] == module or module in text:
            return module
    return None


def unavailable_reason(name: str) -> str | None:
    """Why loader ``name`` cannot run here, or None when it can (dataflow/torch always can)."""
    peer = PEERS.get(name)
    if peer is None:
        return None
    try:
        importlib.import_module(peer.module)
    except Exception as e:  # ImportError, or a broken install (a mismatched extension)
        dependency = _needed(peer, e)
        if dependency is not None:
            return (f"`{peer.module}` imports `{dependency}`, which is missing or broken "
                    f"({type(e).__name__}: {e}); fix: {peer.needs[dependency]}")
        if isinstance(e, ImportError):
            return f"not installed ({e}); {install_hint(name)}"
        return f"fails to import: {type(e).__name__}: {e}"
    return None
