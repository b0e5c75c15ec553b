"""One bench configuration end to end: data, step, runs, JSON, plot, table."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData, check_same_dataset, load, warm_page_cache
from dataflow.bench.loaders import served_index
from dataflow.bench.plot import MISSING, plot_run
from dataflow.bench.report import (
    JsonDoc,
    format_table,
    headline,
    machine_info,
    to_json,
    write_json,
)
from dataflow.bench.runner import BenchOutcome, Progress, run_all
from dataflow.bench.steps import make_step


@dataclass(frozen=True)
class SessionResult:
    """What :func:`run_config` produced.

    Attributes:
        doc: the JSON document written to ``json_path``.
        outcome: the raw runs.
        json_path: where the JSON went.
        png_path: where the plot went (None without matplotlib or when not plotted).
    """

    doc: JsonDoc
    outcome: BenchOutcome
    json_path: str
    png_path: str | None


def header(cfg: BenchConfig, data: BenchData, step: str, page_cache: str) -> str:
    """What is being compared, printed before the runs."""
    budget = (f"{cfg.workers} loading processes per loader (torch num_workers={cfg.workers}; "
              f"dataflow {cfg.servers} server(s) x {cfg.workers_per_server} reader process(es)"
              f" + 1 front process per server; peers {cfg.workers} workers)")
    if cfg.endpoints:
        budget = (f"dataflow: the reader processes of {len(cfg.endpoints)} given server(s), "
                  f"as they report them (table column procs); torch and peers {cfg.workers} "
                  "workers")
    same = (f"; the given servers serve this dataset (fingerprint {data.fingerprint})"
            if cfg.endpoints else "")
    return "\n".join([
        f"data: {len(data.shards)} {data.fmt} shards, {data.total:,} samples, "
        f"{data.nbytes / 2**20:.1f} MiB (dataflow index {data.index_s:.2f} s){same}",
        f"step: {step}; batch {cfg.batch_size}; warm-up {cfg.warmup} + {cfg.steps} measured "
        f"steps; {cfg.repeats} repeat(s), loaders interleaved, median reported",
        f"CPU budget: {budget}",
        f"page cache: {page_cache}",
    ])


def free_tag(out_dir: str, tag: str, files: Callable[[str], Sequence[str]]) -> str:
    """``tag``, or ``tag-2``, ``tag-3``, ...: the first whose output ``files`` are all absent.

    Args:
        out_dir: the output directory.
        tag: the wanted base name.
        files: the file names (in ``out_dir``) a run with a given tag writes.
    """
    candidate, n = tag, 1
    while any(os.path.exists(os.path.join(out_dir, f)) for f in files(candidate)):
        n += 1
        candidate = f"{tag}-{n}"
    return candidate


def run_config(cfg: BenchConfig, *, tag: str, plot: bool = True, out: TextIO | None = None,
               progress: Progress | None = None, wide: bool = False) -> SessionResult:
    """Run every loader of ``cfg`` and write ``<out_dir>/<tag>.json`` (and ``.png``).

    With ``cfg.endpoints``, the given servers must serve the dataset of ``cfg.data`` (what
    the other loaders read): else nothing runs.

    Args:
        cfg: the configuration.
        tag: base name of the output files; ``-2``, ``-3``, ... is appended when files of
            that name exist (an earlier run's files are never overwritten).
        plot: write the PNG.
        wide: print every column of the table (else the narrow set,
            :data:`~dataflow.bench.report.NARROW`; the JSON has every figure either way).
        out: stream for the header, the table and the output paths (default: ``sys.stdout``
            when called).
        progress: progress display (default: stderr).

    Raises:
        DatasetMismatchError: the given servers serve another dataset than ``cfg.data``.
    """
    out = out or sys.stdout
    tag = free_tag(cfg.out_dir, tag, lambda t: (f"{t}.json", f"{t}.png"))
    data = load(cfg.data)
    if cfg.endpoints:
        served = served_index(cfg.endpoints, batch_size=cfg.batch_size, timeout=cfg.timeout_s)
        check_same_dataset(data, cfg.data, served, cfg.endpoints)
    page_cache = warm_page_cache(data)
    step = make_step(cfg.step, cfg.step_ms)
    print(header(cfg, data, step.describe(), page_cache), file=out, flush=True)
    outcome = run_all(cfg, data, step, progress)
    doc = to_json(cfg, data, outcome, step=step.describe(), page_cache=page_cache,
                  machine=machine_info())
    json_path = os.path.join(cfg.out_dir, f"{tag}.json")
    write_json(json_path, doc)
    png_path = None
    if plot and doc["loaders"]:
        png_path = plot_run(doc, os.path.join(cfg.out_dir, f"{tag}.png"))
    print(file=out)
    print(format_table(outcome, cfg.loaders, wide=wide), file=out)
    quote = headline(outcome)
    if quote is not None:
        print(f"\n{quote}", file=out)
    for name, info in outcome.prepare.items():
        how = "cached" if info["cached"] else "converted now"
        print(f"{name}: data conversion took {info['seconds']:.1f} s ({how}, {info['path']})",
              file=out)
    print(f"\nper-step figures: {json_path}", file=out)
    if plot:
        why = MISSING if doc["loaders"] else "no loader ran"
        print(f"plot: {png_path}" if png_path else f"plot not written: {why}", file=out)
    return SessionResult(doc, outcome, json_path, png_path)
