"""``python -m dataflow.bench startup``: time to ready and to first batch on many small shards.

For each shard count, writes (once, under ``--out``) that many small WebDataset tars, then
measures, in one run, repeats interleaved:

* ``cold``: a fresh server with no tar member indexes and no dataset index cache (every
  shard walked, every index written);
* ``tar indexes``: tar member indexes beside the shards, a fresh cache dir (every shard
  opened, no tar walked);
* ``cached``: the dataset index cache of the run before (no shard opened, one ``stat`` each);
* ``torch+webdataset``: ``torch.utils.data.DataLoader`` over the bench's webdataset pipeline,
  from construction to its first batch, in this process (torch already imported);
* ``torch+webdataset, new process``: the same from ``Popen`` of a fresh interpreter that
  imports torch and webdataset first, as a server pays its own imports.

Server times are wall times from ``Popen`` (interpreter start and imports included) to the
ready line, and to the first batch a :class:`dataflow.client.DataLoader` gets from it; the
server's own log adds the time its index took and its time to ready from ``main()`` (after
its imports).
"""

from __future__ import annotations

import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SCENARIOS = ("cold", "tar indexes", "cached", "torch+webdataset",
             "torch+webdataset, new process")
_LOGGED = {"index_s": re.compile(r"index in ([0-9.]+) s"),
           "main_to_ready_s": re.compile(r"ready in ([0-9.]+) s")}
FEATURE = 16
"""float32 values per sample's ``x.npy``."""


@dataclass(frozen=True)
class StartupConfig:
    """What ``bench startup`` measures.

    Attributes:
        shard_counts: dataset sizes to measure, in shards.
        samples_per_shard: samples in each tar.
        batch_size: samples per batch.
        workers: reader processes of the server, and torch DataLoader workers.
        repeats: runs per scenario, interleaved; medians reported.
        timeout_s: longest wait for a ready line or a first batch.
        out_dir: where the shards and the JSON results go.
    """

    shard_counts: tuple[int, ...] = (1000, 10000)
    samples_per_shard: int = 8
    batch_size: int = 64
    workers: int = 2
    repeats: int = 3
    timeout_s: float = 600.0
    out_dir: str = "bench-out"

    def __post_init__(self) -> None:
        from dataflow.checks import check_int
        from dataflow.errors import ConfigError

        if not self.shard_counts or min(self.shard_counts) < 1:
            raise ConfigError(f"`shard_counts` must be positive. Found: {self.shard_counts}")
        for name in ("samples_per_shard", "batch_size", "workers", "repeats"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if not self.timeout_s > 0:
            raise ConfigError(f"`timeout_s` must be > 0. Found: {self.timeout_s}")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(directory: str, shards: int, samples: int) -> list[str]:
    """``shards`` tars of ``samples`` samples each (``id`` and a ``x.npy`` of
    :data:`FEATURE` float32), ids ``0..shards*samples-1``; kept when already complete."""
    paths = [os.path.join(directory, f"s-{i:06d}.tar") for i in range(shards)]
    done = os.path.join(directory, "COMPLETE")
    if os.path.exists(done):
        return paths
    os.makedirs(directory, exist_ok=True)
    for i, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for j in range(samples):
                sid = i * samples + j
                arr = io.BytesIO()
                np.save(arr, np.full(FEATURE, sid, dtype=np.float32))
                _add(tar, f"{sid:08d}.id", str(sid).encode())
                _add(tar, f"{sid:08d}.x.npy", arr.getvalue())
    with open(done, "w") as f:
        f.write(f"{shards}x{samples}\n")
    return paths


def _drop_tar_indexes(paths: Sequence[str]) -> None:
    from dataflow.storage.sources import INDEX_SUFFIX

    for p in paths:
        if os.path.exists(p + INDEX_SUFFIX):
            os.remove(p + INDEX_SUFFIX)


def _check(batch: dict, cfg: StartupConfig) -> None:
    if len(batch["id"]) != cfg.batch_size or tuple(batch["x"].shape[1:]) != (FEATURE,):
        raise RuntimeError(f"unexpected first batch: {len(batch['id'])} ids, x of shape "
                           f"{tuple(batch['x'].shape)}")


def _server_run(paths: list[str], cfg: StartupConfig, cache_dir: str) -> dict:
    """Start a server on ``paths``; seconds to its ready line and to a client's first batch."""
    from dataflow.client import DataLoader
    from dataflow.server import launch

    start = time.monotonic()
    with launch([os.path.dirname(paths[0])], workers=cfg.workers, timeout=cfg.timeout_s,
                extra_args=["--cache-dir", cache_dir, "--progress", "off"]) as handle:
        ready = time.monotonic() - start
        with DataLoader([handle.endpoint], batch_size=cfg.batch_size, rank=0, world_size=1,
                        pin_memory=False, timeout=cfg.timeout_s) as dl:
            batch = next(iter(dl))
        first = time.monotonic() - start
        _check(batch, cfg)
        deadline = time.monotonic() + cfg.timeout_s
        while "ready in" not in (log := handle.stderr_tail()) and time.monotonic() < deadline:
            time.sleep(0.05)
    found = {k: rx.search(log) for k, rx in _LOGGED.items()}
    return {"ready_s": ready, "first_batch_s": first, "index_cache": handle.ready["index_cache"],
            **{k: float(m.group(1)) if m else None for k, m in found.items()}}


_TORCH_CHILD = ("import sys, json; del sys.path[0]; from dataflow.bench.startup import "
                "StartupConfig, _torch_run; c = json.loads(sys.stdin.read()); "
                "print(json.dumps(_torch_run(c.pop('paths'), StartupConfig(**c))))")


def _torch_process_run(paths: list[str], cfg: StartupConfig) -> dict:
    """Seconds from ``Popen`` of a fresh interpreter to its torch DataLoader's first batch."""
    arg = json.dumps({"paths": paths, "batch_size": cfg.batch_size, "workers": cfg.workers,
                      "timeout_s": cfg.timeout_s})
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", _TORCH_CHILD], input=arg.encode(), check=True,
                   timeout=cfg.timeout_s, stdout=subprocess.PIPE)
    return {"ready_s": None, "first_batch_s": time.monotonic() - start, "index_cache": None}


def _torch_run(paths: list[str], cfg: StartupConfig) -> dict:
    """Seconds from building a torch DataLoader over the webdataset pipeline to its first batch."""
    import torch

    from dataflow.batch import FieldSpec
    from dataflow.bench.torch_datasets import webdataset_pipeline

    schema = (FieldSpec("id", "int64"), FieldSpec("x", "float32", (FEATURE,)))
    start = time.monotonic()
    pipeline = webdataset_pipeline(paths, schema, batch_size=cfg.batch_size, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=cfg.workers,
                                         timeout=cfg.timeout_s)
    batch = next(iter(loader))
    first = time.monotonic() - start
    _check(batch, cfg)
    del loader
    return {"ready_s": None, "first_batch_s": first, "index_cache": None}


def measure(paths: list[str], cfg: StartupConfig) -> dict[str, list[dict]]:
    """Every scenario ``cfg.repeats`` times, interleaved; raw results by scenario."""
    runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
    for _ in range(cfg.repeats):
        with tempfile.TemporaryDirectory(prefix="dataflow-startup-") as cache:
            _drop_tar_indexes(paths)
            runs["cold"].append(_server_run(paths, cfg, os.path.join(cache, "a")))
            runs["tar indexes"].append(_server_run(paths, cfg, os.path.join(cache, "b")))
            runs["cached"].append(_server_run(paths, cfg, os.path.join(cache, "b")))
        runs["torch+webdataset"].append(_torch_run(paths, cfg))
        runs["torch+webdataset, new process"].append(_torch_process_run(paths, cfg))
    return runs


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per scenario: median seconds (to ready, to first batch, logged by the server), and the
    cache outcomes."""
    keys = ("ready_s", "first_batch_s", *_LOGGED)
    return {s: {**{k: _median(r, k) for k in keys},
                "index_cache": sorted({str(x["index_cache"]) for x in r})}
            for s, r in runs.items()}


def format_rows(shards: int, summary: dict[str, dict]) -> list[str]:
    """Markdown table rows: shards, scenario, seconds to ready, to first batch, the server's
    index and main-to-ready times, first batch relative to torch+webdataset in a new process."""
    base = summary["torch+webdataset, new process"]["first_batch_s"]
    rows = []
    for s in SCENARIOS:
        row = summary[s]
        cells = [_cell(row[k]) for k in ("ready_s", "first_batch_s", "index_s",
                                          "main_to_ready_s")]
        ratio = f"{row['first_batch_s'] / base:.2f}x" if base else "-"
        rows.append(f"| {shards} | {s} | {' | '.join(cells)} | {ratio} |")
    return rows


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_startup(cfg: StartupConfig) -> dict:
    """Write the datasets, measure each, print a markdown table, save JSON under ``out_dir``."""
    doc: dict = {"config": cfg.__dict__, "results": {}}
    lines = ["| shards | scenario | ready (s) | first batch (s) | index (s, logged) | "
             "main() to ready (s, logged) | first batch vs torch+wds new process |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for n in cfg.shard_counts:
        directory = os.path.join(cfg.out_dir, f"startup-{n}x{cfg.samples_per_shard}")
        print(f"shards: {directory}", flush=True)
        paths = write_shards(directory, n, cfg.samples_per_shard)
        runs = measure(paths, cfg)
        summary = summarize(runs)
        doc["results"][str(n)] = {"runs": runs, "summary": summary}
        lines += format_rows(n, summary)
        print("\n".join(lines[-len(SCENARIOS):]), flush=True)
    print("\n" + "\n".join(lines))
    os.makedirs(cfg.out_dir, exist_ok=True)
    out = os.path.join(cfg.out_dir, "startup.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"results: {out}")
    return doc
