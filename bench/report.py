"""The bench's outputs: terminal/markdown table and the JSON file with every per-step figure."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData
from dataflow.bench.runner import BenchOutcome, RunResult, median_figures

# A JSON object as json.dump takes it and json.load gives it back: values are not typed further.
JsonDoc = dict[str, Any]

BASELINE = "torch"
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_idle", "GPU-idle", "{:.1%}"),
    ("samples_per_s", "samples/s", "{:,.0f}"),
    ("batches_per_s", "batches/s", "{:,.1f}"),
    ("wait_p50_ms", "p50 ms", "{:.2f}"),
    ("wait_p95_ms", "p95 ms", "{:.2f}"),
    ("wait_p99_ms", "p99 ms", "{:.2f}"),
    ("trainer_cpu_ms_per_batch", "trainer ms/b", "{:.2f}"),
    ("loader_cpu_ms_per_batch", "loader ms/b", "{:.2f}"),
    ("trainer_peak_rss_mib", "trainer RSS MiB", "{:,.0f}"),
    ("loader_peak_rss_mib", "loader RSS MiB", "{:,.0f}"),
    ("ttfb_s", "1st batch s", "{:.2f}"),
)
# The terminal table's columns unless --wide (under 100 characters with every range shown):
# the GPU-idle fraction, throughput and its ratio, the wait in next() (median and tail), the
# trainer's CPU per batch. "ms/b": CPU milliseconds per batch.
NARROW = ("loader", "procs", "GPU-idle", "samples/s", f"vs {BASELINE}", "p50 ms", "p99 ms",
          "trainer ms/b")


def machine_info() -> dict[str, object]:
    """Where the bench ran: CPUs, memory, OS, versions, GPU, date."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_gib, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": gpu,
    }


def _cell(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def budgets(outcome: BenchOutcome) -> dict[str, int]:
    """Per loader that ran, the loading processes it used."""
    return {name: runs[0].budget for name, runs in outcome.results.items() if runs}


def unequal_budgets(budget: Mapping[str, int]) -> str | None:
    """A warning naming each loader's loading processes when they differ, else None."""
    if len(set(budget.values())) <= 1:
        return None
    each = ", ".join(f"{name} {n}" for name, n in budget.items())
    return (f"unequal CPU budgets (loading processes: {each}): ratios marked ! compare "
            "different budgets, not loaders")


def budget_title(budget: Mapping[str, int]) -> str:
    """The CPU budget for a plot title: one count when equal, else every loader's."""
    counts = set(budget.values())
    if len(counts) == 1:
        return f"{counts.pop()} loading processes per loader"
    return "UNEQUAL budgets: " + ", ".join(f"{name} {n}" for name, n in budget.items()) + \
        " loading processes"


@dataclass(frozen=True)
class Spread:
    """Per-repeat values of one figure: the median quoted and the range around it.

    Attributes:
        values: the per-repeat values, in repeat order.
        median: their median.
        low: the smallest.
        high: the largest.
    """

    values: tuple[float, ...]
    median: float
    low: float
    high: float

    def cell(self, fmt: str, mark: str = "") -> str:
        """The median formatted by ``fmt`` (then ``mark``), and ``[low-high]`` when more than
        one repeat gave a value: ``2.18x [2.10-2.25]``."""
        text = fmt.format(self.median) + mark
        if len(self.values) < 2:
            return text
        lo, hi = (fmt.format(v).rstrip("x%") for v in (self.low, self.high))
        return f"{text} [{lo}-{hi}]"


def spread(values: Sequence[float]) -> Spread:
    """The :class:`Spread` of per-repeat ``values``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("a spread needs at least one value")
    return Spread(tuple(values), float(np.median(values)), min(values), max(values))


def repeat_ratios(runs: Sequence[RunResult], base: Sequence[RunResult],
                  key: str = "samples_per_s") -> list[float]:
    """Per repeat that both loaders ran, ``runs``' figure ``key`` over ``base``'s, in repeat
    order.

    Runs are paired by repeat: the runs are interleaved (see
    :func:`dataflow.bench.runner.schedule`), so both halves of a pair met the same machine.
    """
    theirs = {r.repeat: r.figures()[key] for r in base}
    out = []
    for run in runs:
        mine, other = run.figures()[key], theirs.get(run.repeat)
        if mine is not None and other:
            out.append(mine / other)
    return out


def ratio_spread(outcome: BenchOutcome, name: str) -> Spread | None:
    """``name``'s samples/s over the baseline's, per repeat (None: no pair ran)."""
    ratios = repeat_ratios(outcome.results.get(name, []), outcome.results.get(BASELINE, []))
    return spread(ratios) if ratios else None


def idle_spread(runs: Sequence[RunResult]) -> Spread:
    """A loader's GPU-idle fraction over its repeats."""
    return spread([r.measurement.idle_fraction for r in runs])


def summary_rows(outcome: BenchOutcome, order: Sequence[str]) -> list[list[str]]:
    """One row of cells per loader (medians over repeats; skipped/failed rows say why).

    GPU-idle and the ratio to the baseline's samples/s are the medians of the per-repeat
    values, followed by their ``[min-max]`` when there were several repeats; the ratio is taken
    per repeat (see :func:`repeat_ratios`). It is marked ``!`` when the loader used a different
    number of loading processes than the baseline.
    """
    medians = {name: median_figures(runs) for name, runs in outcome.results.items()
               if name not in outcome.failed}
    budget = budgets(outcome)
    rows = []
    for name in order:
        if name in outcome.skipped:
            rows.append([name, f"skipped: {outcome.skipped[name]}"])
            continue
        if name in outcome.failed:
            rows.append([name, f"FAILED: {outcome.failed[name]}"])
            continue
        if name not in medians:
            continue
        ratios = ratio_spread(outcome, name) if BASELINE in medians else None
        if name == BASELINE:
            ratio = "1.00x"
        elif ratios is None:
            ratio = "n/a"
        else:
            ratio = ratios.cell("{:.2f}x", "!" if budget[name] != budget[BASELINE] else "")
        cells = [_cell(medians[name][key], fmt) for key, _, fmt in COLUMNS]
        cells[0] = idle_spread(outcome.results[name]).cell(COLUMNS[0][2])
        rows.append([name, str(budget[name]), *cells[:2], ratio, *cells[2:]])
    return rows


def headline(outcome: BenchOutcome, name: str = "dataflow") -> str | None:
    """The sentence to quote: ``name`` against the baseline, samples/s ratio and GPU-idle, as
    medians of the interleaved repeats with their ranges (None unless both ran)."""
    if name in outcome.failed or BASELINE in outcome.failed:
        return None
    ratios = ratio_spread(outcome, name)
    if ratios is None:
        return None
    mine, base = idle_spread(outcome.results[name]), idle_spread(outcome.results[BASELINE])
    n = len(ratios.values)
    text = (f"{name} vs {BASELINE}: {ratios.median:.2f}x the samples/s, GPU-idle "
            f"{mine.median:.1%} vs {base.median:.1%}")
    if n < 2:
        return text + " (1 repeat: no spread measured; --repeats 3 shows it)"
    return (f"{text} (median of {n} interleaved repeats; range {ratios.low:.2f}x-"
            f"{ratios.high:.2f}x, GPU-idle {mine.low:.1%}-{mine.high:.1%} vs "
            f"{base.low:.1%}-{base.high:.1%})")


def _headers() -> list[str]:
    names = [title for _, title, _ in COLUMNS]
    return ["loader", "procs", *names[:2], f"vs {BASELINE}", *names[2:]]


def format_table(outcome: BenchOutcome, order: Sequence[str], *, markdown: bool = False,
                 wide: bool = False) -> str:
    """The summary table, plain text for the terminal or GitHub markdown.

    ``procs`` is each loader's loading processes; a line under the table warns when they
    differ between loaders. The plain table has the :data:`NARROW` columns unless ``wide``;
    markdown has them all.
    """
    headers = _headers()
    rows = summary_rows(outcome, order)
    if not (wide or markdown):
        keep = [headers.index(h) for h in NARROW]
        headers = [headers[i] for i in keep]
        rows = [[r[i] for i in keep] if len(r) == len(_headers()) else r for r in rows]
    warning = unequal_budgets(budgets(outcome))
    note = [] if warning is None else ["", f"WARNING: {warning}"]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
        for row in rows:
            lines.append("| " + " | ".join(row + [""] * (len(headers) - len(row))) + " |")
        return "\n".join(lines + note)
    full = [r for r in rows if len(r) == len(headers)]
    widths = [max(len(h), *(len(r[i]) for r in full)) if full else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w)
                       for i, (h, w) in enumerate(zip(headers, widths, strict=True)))]
    for row in rows:
        if len(row) == len(headers):
            lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        else:
            lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
    return "\n".join(lines + note)


def _floats(a: np.ndarray, scale: float = 1.0) -> list[float]:
    return [round(float(x) * scale, 4) for x in a]


def to_json(cfg: BenchConfig, data: BenchData, outcome: BenchOutcome, *, step: str,
            page_cache: str, machine: dict[str, object]) -> JsonDoc:
    """Everything about one configuration: settings, machine, medians and per-step figures.

    Per-step arrays are in milliseconds (``wait_ms``, ``transfer_ms``, ``step_ms``,
    ``host_wait_ms``) and samples per step, measured steps only. ``vs_torch_per_repeat`` is,
    per repeat that the baseline ran too, the loader's samples/s over the baseline's.
    """
    loaders: dict[str, object] = {}
    for name, runs in outcome.results.items():
        loaders[name] = {
            "description": runs[0].description,
            "budget": runs[0].budget,
            "median": median_figures(runs),
            f"vs_{BASELINE}_per_repeat": repeat_ratios(runs, outcome.results.get(BASELINE, [])),
            "failed": outcome.failed.get(name),
            "runs": [
                {
                    "repeat": r.repeat,
                    "figures": r.figures(),
                    "loader_processes": r.loader_processes,
                    "distinct_ids": r.measurement.distinct_ids,
                    "wall_s": r.measurement.wall_s,
                    "wait_ms": _floats(r.measurement.wait_s, 1e3),
                    "transfer_ms": _floats(r.measurement.transfer_s, 1e3),
                    "step_ms": _floats(r.measurement.step_s, 1e3),
                    "host_wait_ms": _floats(r.measurement.host_wait_s, 1e3),
                    "samples": [int(x) for x in r.measurement.samples],
                }
                for r in runs
            ],
        }
    return {
        "config": dataclasses.asdict(cfg),
        "machine": machine,
        "step": step,
        "page_cache": page_cache,
        "data": {"shards": len(data.shards), "samples": data.total, "format": data.fmt,
                 "bytes": data.nbytes, "fingerprint": data.fingerprint,
                 "index_s": data.index_s},
        "loaders": loaders,
        "skipped": outcome.skipped,
        "failed": outcome.failed,
        "prepare": outcome.prepare,
    }


def write_json(path: str, doc: Mapping[str, object]) -> None:
    """Write ``doc`` as indented JSON, creating the directory."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
