"""PNG plots of bench results (matplotlib, optional: without it the plots are skipped)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dataflow.bench.report import budget_title

MISSING = "matplotlib is not installed; skipping the PNG (pip install 'dataflow-loader[bench]')"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _median_run(loader: Mapping[str, Any]) -> Mapping[str, Any]:
    runs = sorted(loader["runs"], key=lambda r: r["figures"]["samples_per_s"])
    return runs[len(runs) // 2]


def plot_run(doc: Mapping[str, Any], path: str) -> str | None:
    """Per-step wait over time for each loader, and bars of GPU-idle fraction and samples/s.

    Args:
        doc: the bench's JSON document (see :func:`bench.report.to_json`).
        path: PNG file to write.

    Returns:
        ``path``, or None when matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return None
    loaders = {name: v for name, v in doc["loaders"].items() if not v.get("failed")}
    fig, (ax_wait, ax_idle, ax_rate) = plt.subplots(
        1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [2.2, 1, 1]})
    names = list(loaders)
    for name in names:
        run = _median_run(loaders[name])
        fig_ = run["figures"]
        label = f"{name} (p50 {fig_['wait_p50_ms']:.2f} ms, p99 {fig_['wait_p99_ms']:.2f} ms)"
        ax_wait.plot(range(1, len(run["wait_ms"]) + 1), run["wait_ms"], label=label, lw=0.9)
    # Linear up to 0.1 ms, logarithmic above: a loader that never stalls stays visible beside
    # one that waits tens of milliseconds.
    ax_wait.set_yscale("symlog", linthresh=0.1)
    ax_wait.set_xlabel("measured step")
    ax_wait.set_ylabel("wait (data stall), ms (log above 0.1)")
    ax_wait.set_title("per-step wait (median-throughput repeat)")
    ax_wait.legend()
    idle = [loaders[n]["median"]["gpu_idle"] * 100 for n in names]
    rate = [loaders[n]["median"]["samples_per_s"] for n in names]
    ax_idle.bar(names, idle, color="tab:red")
    ax_idle.set_ylabel("GPU-idle, % of wall time")
    ax_idle.set_title("GPU-idle fraction (median)")
    ax_rate.bar(names, rate, color="tab:blue")
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_title("throughput (median)")
    cfg = doc["config"]
    budget = {name: loaders[name]["budget"] for name in names}
    fig.suptitle(f"{doc['data']['format']}, batch {cfg['batch_size']}, {doc['step']}, "
                 f"{budget_title(budget)}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_sweep(axis: str, values: Sequence[float],
               idle: Mapping[str, Sequence[float | None]],
               rate: Mapping[str, Sequence[float | None]], path: str, *,
               integer: bool = False) -> str | None:
    """GPU-idle fraction and samples/s against the swept setting, one line per loader.

    Args:
        axis: the swept setting's label (e.g. ``step ms``).
        values: the setting's values, x axis.
        idle: per loader, GPU-idle fraction per value (None: not measured).
        rate: per loader, samples/s per value.
        path: PNG file to write.
        integer: the setting is a count (servers): ticks at the swept values only.

    Returns:
        ``path``, or None when matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return None
    fig, (ax_idle, ax_rate) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in idle:
        xs = [v for v, y in zip(values, idle[name], strict=True) if y is not None]
        ax_idle.plot(xs, [y * 100 for y in idle[name] if y is not None], "o-", label=name)
        ax_rate.plot(xs, [y for y in rate[name] if y is not None], "o-", label=name)
    ax_idle.set_xlabel(axis)
    ax_idle.set_ylabel("GPU-idle, % of wall time")
    ax_idle.set_title("where each loader stops keeping up")
    ax_rate.set_xlabel(axis)
    ax_rate.set_ylabel("samples/s")
    for ax in (ax_idle, ax_rate):
        if integer:
            ax.set_xticks([int(v) for v in values])
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
