"""Sweep mode: the same comparison over several step times or server counts.

Swept axes:

* ``step-ms``: the training step's duration; short steps show where a loader stops keeping up.
* ``servers``: local dataflow servers, each with the base configuration's reader processes per
  server; the shared CPU budget grows with it (torch and the peers get the same total worker
  count at each point).
* ``servers-split``: local dataflow servers at the same total of reader processes, the base
  configuration's ``workers`` split evenly over them (12 workers: 1 x 12, 2 x 6, 4 x 3); torch
  and the peers keep ``workers`` at every point: scale-out at an equal CPU budget.
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

AXES = ("step-ms", "servers", "servers-split")
SERVER_AXES = ("servers", "servers-split")


def point_config(base: BenchConfig, axis: str, value: float) -> BenchConfig:
    """The configuration of one sweep point.

    Raises:
        ConfigError: an unknown axis; a server count that is not a whole number of 1 or more,
            or (``servers-split``) that does not divide ``base.workers``; a servers axis with
            ``base.endpoints`` (the sweep starts its own servers).
    """
    if axis == "step-ms":
        return dataclasses.replace(base, step_ms=float(value))
    if axis not in SERVER_AXES:
        raise ConfigError(f"`axis` must be one of {AXES}. Found: {axis!r}")
    if base.endpoints:
        raise ConfigError(f"a `{axis}` sweep starts local servers; it cannot use the given "
                          f"`endpoints`. Found: {', '.join(base.endpoints)}")
    if value != int(value) or value < 1:
        raise ConfigError(f"`{axis}` sweep values must be whole numbers of 1 or more. "
                          f"Found: {value:g}")
    servers = int(value)
    if axis == "servers":
        return dataclasses.replace(base, servers=servers,
                                   workers=servers * base.workers_per_server)
    if base.workers % servers:
        raise ConfigError(
            f"a `servers-split` sweep splits `workers` ({base.workers}) evenly over the "
            f"servers; {servers} server(s) do not divide it. Found: servers={servers}, "
            f"workers={base.workers}")
    return dataclasses.replace(base, servers=servers)


def axis_label(base: BenchConfig, axis: str) -> str:
    """The swept setting and the CPU budget it implies, for the plot's x axis."""
    if axis == "servers":
        return (f"dataflow servers (CPU budget: {base.workers_per_server} loading processes "
                "per server, for every loader)")
    if axis == "servers-split":
        return (f"dataflow servers (CPU budget: {base.workers} loading processes in total, "
                "split over the servers; the same for every loader)")
    return "step time, ms (0: no step, the loaders' own rate)"


def value_label(axis: str, value: float) -> str:
    """A sweep point's column title in the text table (``step-ms`` 0: ``no step``)."""
    return "no step" if axis == "step-ms" and value == 0 else f"{value:g}"


def run_sweep(base: BenchConfig, axis: str, values: Sequence[float], *, tag: str = "sweep",
              out: TextIO | None = None, progress: Progress | None = None,
              wide: bool = False) -> JsonDoc:
    """Run ``base`` at each value of ``axis``; write ``<tag>.json`` and ``<tag>.png``.

    ``-2``, ``-3``, ... is appended to ``tag`` when an earlier sweep's files have that name, so
    a second sweep never overwrites the first. Every point's configuration is checked before
    the first runs. The header, tables (every column when ``wide``) and output paths go to
    ``out`` (default: ``sys.stdout`` when called).

    Returns:
        The sweep's JSON document: axis, values, per loader the median GPU-idle fraction and
        samples/s per value, and the per-point output files.
    """
    if axis not in AXES:
        raise ConfigError(f"`axis` must be one of {AXES}. Found: {axis!r}")
    if not values:
        raise ConfigError("`values` must hold at least one sweep point. Found: []")
    out = out or sys.stdout
    configs = [point_config(base, axis, value) for value in values]
    tag = free_tag(base.out_dir, tag, lambda t: [f"{t}.json", f"{t}.png", *(
        f"{t}-{axis}-{v:g}.{ext}" for v in values for ext in ("json", "png"))])
    idle: dict[str, list[float | None]] = {name: [] for name in base.loaders}
    rate: dict[str, list[float | None]] = {name: [] for name in base.loaders}
    points = []
    for value, cfg in zip(values, configs, strict=True):
        print(f"\n=== {axis} = {value:g} ===", file=out, flush=True)
        result = run_config(cfg, tag=f"{tag}-{axis}-{value:g}", plot=False, out=out,
                            progress=progress, wide=wide)
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
    png = plot_sweep(axis_label(base, axis), values, idle, rate,
                     os.path.join(base.out_dir, f"{tag}.png"), integer=axis in SERVER_AXES)
    print(f"\nsweep over {axis}: GPU-idle fraction per loader", file=out)
    width = max(10, len(axis) + 1, *(len(name) + 1 for name in base.loaders))
    print(f"  {axis:<{width}}" + "".join(f"{value_label(axis, v):>10}" for v in values),
          file=out)
    for name in base.loaders:
        cells = "".join(f"{y:>10.1%}" if y is not None else f"{'n/a':>10}" for y in idle[name])
        print(f"  {name:<{width}}{cells}", file=out)
    print(f"sweep figures: {json_path}", file=out)
    print(f"sweep plot: {png}" if png else f"sweep plot not written: {MISSING}", file=out)
    return doc
