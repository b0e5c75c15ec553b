"""Sweep mode: the same comparison over several step times or server counts.

Swept axes:

* ``step-ms``: the training step's duration; short steps show where a loader stops keeping up.
* ``servers``: local dataflow servers, each with the base configuration's reader processes per
  server; the shared CPU budget grows with it (torch and the peers get the same total worker
  count at each point).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from dataflow.bench.config import BenchConfig
from dataflow.bench.plot import MISSING, plot_sweep
from dataflow.bench.report import JsonDoc, write_json
from dataflow.bench.runner import Progress
from dataflow.bench.session import free_tag, run_config
from dataflow.errors import ConfigError

AXES = ("step-ms", "servers")


def point_config(base: BenchConfig, axis: str, value: float) -> BenchConfig:
    """The configuration of one sweep point."""
    if axis == "step-ms":
        return dataclasses.replace(base, step_ms=float(value))
    if axis == "servers":
        if value != int(value) or value < 1:
            raise ConfigError(f"`servers` sweep values must be whole numbers of 1 or more. "
                              f"Found: {value:g}")
        servers = int(value)
        return dataclasses.replace(base, servers=servers,
                                   workers=servers * base.workers_per_server)
    raise ConfigError(f"`axis` must be one of {AXES}. Found: {axis!r}")


def run_sweep(base: BenchConfig, axis: str, values: Sequence[float], *, tag: str = "sweep",
              out: TextIO = sys.stdout, progress: Progress | None = None) -> JsonDoc:
    """Run ``base`` at each value of ``axis``; write ``<tag>.json`` and ``<tag>.png``.

    ``-2``, ``-3``, ... is appended to ``tag`` when an earlier sweep's files have that name, so
    a second sweep never overwrites the first.

    Returns:
        The sweep's JSON document: axis, values, per loader the median GPU-idle fraction and
        samples/s per value, and the per-point output files.
    """
    if axis not in AXES:
        raise ConfigError(f"`axis` must be one of {AXES}. Found: {axis!r}")
    if not values:
        raise ConfigError("`values` must hold at least one sweep point. Found: []")
    tag = free_tag(base.out_dir, tag, lambda t: [f"{t}.json", f"{t}.png", *(
        f"{t}-{axis}-{v:g}.{ext}" for v in values for ext in ("json", "png"))])
    idle: dict[str, list[float | None]] = {name: [] for name in base.loaders}
    rate: dict[str, list[float | None]] = {name: [] for name in base.loaders}
    points = []
    for value in values:
        cfg = point_config(base, axis, value)
        print(f"\n=== {axis} = {value:g} ===", file=out, flush=True)
        result = run_config(cfg, tag=f"{tag}-{axis}-{value:g}", plot=False, out=out,
                            progress=progress)
        for name in base.loaders:
            median = result.doc["loaders"].get(name, {}).get("median")
            failed = name in result.outcome.failed
            idle[name].append(None if failed or median is None else median["gpu_idle"])
            rate[name].append(None if failed or median is None else median["samples_per_s"])
        points.append({"value": value, "json": result.json_path,
                       "failed": result.outcome.failed})
    doc: JsonDoc = {"axis": axis, "values": list(values), "gpu_idle": idle,
                    "samples_per_s": rate, "points": points}
    json_path = os.path.join(base.out_dir, f"{tag}.json")
    write_json(json_path, doc)
    label = ("step time, ms" if axis == "step-ms" else
             f"dataflow servers (CPU budget: {base.workers_per_server} loading processes per "
             "server, for every loader)")
    png = plot_sweep(label, values, idle, rate, os.path.join(base.out_dir, f"{tag}.png"),
                     integer=axis == "servers")
    print(f"\nsweep over {axis}: GPU-idle fraction per loader", file=out)
    print(f"  {axis:<10}" + "".join(f"{v:>10g}" for v in values), file=out)
    for name in base.loaders:
        cells = "".join(f"{y:>10.1%}" if y is not None else f"{'n/a':>10}" for y in idle[name])
        print(f"  {name:<10}{cells}", file=out)
    print(f"sweep figures: {json_path}", file=out)
    print(f"sweep plot: {png}" if png else f"sweep plot not written: {MISSING}", file=out)
    return doc
