"""Shape of the bench's table, JSON and plots, from synthetic measurements."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from dataflow.bench.__main__ import build_parser
from dataflow.bench.config import BenchConfig
from dataflow.bench.data import BenchData
from dataflow.bench.loaders import dataflow_budget, server_prefetch
from dataflow.bench.loop import Measurement
from dataflow.bench.peers import MAKE_PEERS, PEERS, PEERS_VENV, install_hint, unavailable_reason
from dataflow.bench.plot import plot_run, plot_sweep
from dataflow.bench.procs import (
    _is_loopback,
    cpu_delta,
    cpu_seconds,
    cpu_snapshot,
    descendants,
    non_loopback_listeners,
    peak_rss_bytes,
    total_peak_rss,
)
from dataflow.bench.report import (
    budget_title,
    format_table,
    machine_info,
    summary_rows,
    to_json,
    write_json,
)
from dataflow.bench.runner import BenchOutcome, RunResult, median_figures

STEPS = 10


def measurement(wait_ms: float, samples: int = 64) -> Measurement:
    wait = np.full(STEPS, wait_ms / 1e3)
    step = np.full(STEPS, 0.01)
    return Measurement(
        wait_s=wait, transfer_s=np.zeros(STEPS), step_s=step, host_wait_s=wait,
        samples=np.full(STEPS, samples), wall_s=float(wait.sum() + step.sum()), ttfb_s=0.5,
        trainer_cpu_s=0.01, distinct_ids=STEPS * samples,
    )


def run(loader: str, repeat: int, wait_ms: float, **kw) -> RunResult:
    defaults = dict(description=f"{loader} setup", setup_s=1.0, trainer_peak_rss=300 << 20,
                    loader_peak_rss=200 << 20, loader_cpu_s=0.05, loader_processes=2,
                    budget=2)
    return RunResult(loader=loader, repeat=repeat, measurement=measurement(wait_ms),
                     **{**defaults, **kw})


@pytest.fixture
def outcome() -> BenchOutcome:
    out = BenchOutcome()
    out.results["dataflow"] = [run("dataflow", r, w) for r, w in enumerate([0.0, 1.0, 0.5])]
    out.results["torch"] = [run("torch", r, w, loader_peak_rss=None, loader_cpu_s=None)
                            for r, w in enumerate([10.0, 10.0, 30.0])]
    out.skipped["ray"] = "not installed"
    out.failed["litdata"] = "RuntimeError: boom"
    return out


def cfg(tmp_path) -> BenchConfig:
    return BenchConfig(data=("d",), loaders=("dataflow", "torch", "ray", "litdata"),
                       out_dir=str(tmp_path))


def data() -> BenchData:
    return BenchData(shards=("a.tar",), sizes=(640,), fmt="tar", fingerprint="f" * 32,
                     schema=(), nbytes=1 << 20, index_s=0.1)


def test_figures_follow_the_definitions():
    f = run("torch", 0, 10.0).figures()
    assert f["gpu_idle"] == pytest.approx(0.5)
    assert f["samples_per_s"] == pytest.approx(STEPS * 64 / 0.2)
    assert f["batches_per_s"] == pytest.approx(STEPS / 0.2)
    assert f["wait_p50_ms"] == pytest.approx(10.0)
    assert f["trainer_cpu_ms_per_batch"] == pytest.approx(1.0)
    assert f["loader_cpu_ms_per_batch"] == pytest.approx(5.0)
    assert f["trainer_peak_rss_mib"] == pytest.approx(300)


def test_medians_skip_unmeasurable_figures(outcome):
    med = median_figures(outcome.results["dataflow"])
    assert med["wait_p50_ms"] == pytest.approx(0.5)
    torch_med = median_figures(outcome.results["torch"])
    assert torch_med["loader_peak_rss_mib"] is None
    assert torch_med["wait_p50_ms"] == pytest.approx(10.0)


def test_table_rows(outcome):
    rows = summary_rows(outcome, ["dataflow", "torch", "ray", "litdata"])
    assert [r[0] for r in rows] == ["dataflow", "torch", "ray", "litdata"]
    # Medians over the 3 repeats with their range; the ratio is the median of per-repeat
    # ratios (6400/3200, 5818/3200, 6095/1600), not the ratio of the medians (1.90x).
    assert rows[0][2:5] == ["4.8% [0.0-9.1]", "6,095", "2.00x [1.82-3.81]"]
    assert rows[1][1] == "2" and rows[1][2] == "50.0% [50.0-75.0]" and rows[1][4] == "1.00x"
    assert rows[2][1].startswith("skipped: not installed")
    assert rows[3][1].startswith("FAILED: RuntimeError")
    text = format_table(outcome, ["dataflow", "torch", "ray", "litdata"], wide=True)
    assert "GPU-idle" in text and "n/a" in text and "WARNING" not in text
    md = format_table(outcome, ["dataflow", "torch"], markdown=True)
    lines = md.splitlines()
    assert lines[0].startswith("| loader |") and len(lines) == 4
    assert len({line.count("|") for line in lines}) == 1


def test_the_terminal_table_stays_under_100_columns_unless_wide(outcome):
    outcome.results["dataflow"] = [run("dataflow", r, w, loader_peak_rss=12_345 << 20)
                                   for r, w in enumerate([0.0, 99.0, 1000.0])]
    narrow = format_table(outcome, ["dataflow", "torch", "ray", "litdata"])
    assert max(len(line) for line in narrow.splitlines()) < 100
    assert "loader ms/b" not in narrow and "1st batch s" not in narrow
    assert narrow.splitlines()[0].split()[:3] == ["loader", "procs", "GPU-idle"]
    wide = format_table(outcome, ["dataflow", "torch"], wide=True)
    assert all(title in wide for title in ("loader ms/b", "loader RSS MiB", "1st batch s",
                                           "batches/s", "p95 ms"))
    assert "12,345" in wide and "12,345" not in narrow
    assert "skipped: not installed" in narrow and "FAILED: RuntimeError" in narrow


def test_unequal_budgets_are_flagged(tmp_path, outcome):
    outcome.results["dataflow"] = [run("dataflow", r, 0.0, budget=9) for r in range(3)]
    rows = summary_rows(outcome, ["dataflow", "torch"])
    assert rows[0][1] == "9" and rows[0][4] == "2.00x! [2.00-4.00]"
    assert rows[1][4] == "1.00x"
    for markdown in (False, True):
        text = format_table(outcome, ["dataflow", "torch"], markdown=markdown)
        assert "WARNING: unequal CPU budgets (loading processes: dataflow 9, torch 2)" in text
    assert budget_title({"dataflow": 9, "torch": 2}) == (
        "UNEQUAL budgets: dataflow 9, torch 2 loading processes")
    assert budget_title({"dataflow": 2, "torch": 2}) == "2 loading processes per loader"
    doc = to_json(cfg(tmp_path), data(), outcome, step="sleep", page_cache="warm", machine={})
    assert doc["loaders"]["dataflow"]["budget"] == 9


def test_dataflow_budget_names_each_server():
    assert dataflow_budget((4, 4), local=True) == (
        "2 local server(s): 2 x 4 = 8 reader process(es) + 2 front process(es)")
    assert dataflow_budget((8, 1), local=False) == (
        "2 given server(s): 8 + 1 = 9 reader process(es) + 2 front process(es); their CPU and "
        "RSS not measured")


@pytest.mark.parametrize(("prefetch", "workers", "servers", "expected"), [
    (4, 12, 1, 12), (4, 12, 2, 6), (4, 12, 4, 3), (4, 2, 2, 2), (16, 4, 2, 8), (4, 1, 1, 4),
])
def test_each_server_gets_credits_for_every_reader(prefetch, workers, servers, expected):
    cfg = BenchConfig(data=("demo",), workers=workers, servers=servers, prefetch=prefetch)
    assert server_prefetch(cfg, servers) == expected


def test_given_servers_get_the_prefetch_split_alone():
    cfg = BenchConfig(data=("demo",), workers=12, prefetch=4, endpoints=("tcp://a:1", "tcp://b:1"))
    assert server_prefetch(cfg, 2) == 2


def test_a_peer_missing_a_dependency_says_which_and_the_fix(tmp_path, monkeypatch):
    assert "torchvision" in PEERS["streaming"].needs
    (tmp_path / "bench_fake_peer.py").write_text("import bench_fake_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = dataclasses.replace(PEERS["streaming"], module="bench_fake_peer",
                               needs={"bench_fake_absent_dependency": "install the thing"})
    monkeypatch.setitem(PEERS, "streaming", fake)
    reason = unavailable_reason("streaming")
    assert reason is not None
    assert reason.startswith("`bench_fake_peer` imports `bench_fake_absent_dependency`, which "
                             "is missing or broken (ModuleNotFoundError")
    assert reason.endswith("fix: install the thing")
    monkeypatch.setitem(PEERS, "streaming", dataclasses.replace(fake, module="bench_no_such"))
    reason = unavailable_reason("streaming")
    assert reason.startswith("not installed (No module named 'bench_no_such'); ")
    assert reason.endswith(install_hint("streaming"))
    assert unavailable_reason("torch") is None


def test_the_peers_install_hint_names_the_make_target_and_the_bench_command():
    hint = install_hint("litdata")
    assert f"`{MAKE_PEERS}`" in hint and PEERS_VENV in hint
    run = hint.split(f"`{PEERS_VENV}/bin/python -m dataflow.bench ", 1)[1].split("`")[0]
    args = build_parser().parse_args(run.replace("...", "").split())
    assert args.loaders == ["dataflow", "torch", "litdata"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_peers_installs_every_peer_into_its_own_venv_under_the_torch_pin():
    """`make peers` (named by the skip hints) exists and installs each peer's package into
    the peers' venv, never into .venv; a dry run (-n, -B: as if never made) executes nothing."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def dry_run(*args: str) -> list[str]:
        done = subprocess.run(["make", "-n", "-B", "-C", root, "-o", ".venv/.demo-installed",
                               MAKE_PEERS.split()[1], *args],
                              capture_output=True, text=True, timeout=60, check=True)
        return done.stdout.splitlines()

    lines = dry_run()
    assert f"test -d {PEERS_VENV} || .venv/bin/python -m venv {PEERS_VENV}" in lines
    pips = [x for x in lines if " -m pip install " in x]
    assert len(pips) == 1
    assert pips[0].startswith(f'PIP_CONSTRAINT="{root}/.ci/constraints.txt" {PEERS_VENV}/bin/')
    assert all(f"'{peer.package}'" in pips[0] for peer in PEERS.values())
    index = "https://example.invalid/whl/cpu"
    pips = [x for x in dry_run(f"TORCH_INDEX={index}") if " -m pip install " in x]
    assert pips[0].endswith(f"--index-url '{index}' -U torchvision")
    assert pips[0].startswith(f'PIP_CONSTRAINT="{root}/.ci/constraints.txt" {PEERS_VENV}/bin/')


def test_json_holds_every_step(tmp_path, outcome):
    doc = to_json(cfg(tmp_path), data(), outcome, step="sleep 10 ms", page_cache="warm",
                  machine=machine_info())
    path = tmp_path / "x" / "bench.json"
    write_json(str(path), doc)
    back = json.loads(path.read_text())
    assert set(back) >= {"config", "machine", "step", "page_cache", "data", "loaders",
                         "skipped", "failed", "prepare"}
    runs = back["loaders"]["dataflow"]["runs"]
    assert len(runs) == 3
    assert len(runs[0]["wait_ms"]) == STEPS and len(runs[0]["samples"]) == STEPS
    assert back["loaders"]["torch"]["median"]["gpu_idle"] == pytest.approx(0.5)
    assert back["loaders"]["dataflow"]["vs_torch_per_repeat"] == pytest.approx(
        [2.0, 640 / 0.11 / 3200, 640 / 0.105 / 1600])
    assert back["loaders"]["torch"]["vs_torch_per_repeat"] == [1.0, 1.0, 1.0]
    assert back["machine"]["cpus"] == os.cpu_count()
    assert back["skipped"] == {"ray": "not installed"}


def test_plots_are_written(tmp_path, outcome):
    outcome.failed.clear()
    doc = to_json(cfg(tmp_path), data(), outcome, step="sleep", page_cache="warm",
                  machine={})
    doc = json.loads(json.dumps(doc))
    png = plot_run(doc, str(tmp_path / "p" / "bench.png"))
    assert png and os.path.getsize(png) > 1000
    sweep = plot_sweep("step ms", [0, 5], {"a": [0.5, None]}, {"a": [100.0, None]},
                       str(tmp_path / "sweep.png"))
    assert sweep and os.path.getsize(sweep) > 1000
    servers = plot_sweep("servers", [1, 2, 4], {"a": [0.5, 0.2, 0.1]}, {"a": [1.0, 2.0, 3.0]},
                         str(tmp_path / "servers.png"), integer=True)
    assert servers and os.path.getsize(servers) > 1000


@pytest.mark.timeout(30)
def test_process_figures():
    me = os.getpid()
    assert peak_rss_bytes(me) > 1 << 20
    assert cpu_seconds(me) > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants([me])
        assert total_peak_rss([child.pid, 999_999_999]) > 0
        before = cpu_snapshot([child.pid])
        assert cpu_delta(before, cpu_snapshot([child.pid])) >= 0
    finally:
        child.kill()
        child.wait()
    assert peak_rss_bytes(child.pid) is None


def test_loopback_listeners_are_not_flagged():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert non_loopback_listeners([os.getpid()]) == []
    assert _is_loopback("0100007F:1F90")
    assert not _is_loopback("00000000:1F90")
    assert not _is_loopback("00000000000000000000000000000000:1F90")
