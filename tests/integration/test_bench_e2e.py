"""The real bench on tiny demo data: real servers, real torch workers, real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dataflow.bench.__main__ import main
from dataflow.bench.config import BenchConfig
from dataflow.bench.data import check_same_dataset, ensure_demo, load
from dataflow.bench.loaders import served_index
from dataflow.bench.procs import descendants
from dataflow.bench.session import run_config
from dataflow.bench.torch_datasets import ArrowMapDataset, webdataset_pipeline
from dataflow.errors import DatasetMismatchError

REPO = Path(__file__).resolve().parents[2]
SHARDS, PER_SHARD = 4, 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["tar", "arrow", "parquet"])
def test_torch_baseline_reads_every_sample_once(tmp_path, fmt):
    data = load([ensure_demo(str(tmp_path / fmt), fmt=fmt, shards=SHARDS,
                             samples_per_shard=PER_SHARD)])
    if fmt == "tar":
        dataset = webdataset_pipeline(data.shards, data.schema, batch_size=32, shuffle=True,
                                      seed=1)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    else:
        dataset = ArrowMapDataset(data.shards, data.sizes, data.schema, data.fmt)
        loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True,
                                             num_workers=2)
    ids = []
    for batch in loader:
        assert batch["image"].shape[1:] == (3, 64, 64)
        assert batch["image"].dtype == torch.uint8
        assert torch.equal(batch["label"], batch["id"] % 10)
        assert all(text.startswith(f"sample {i} ") for i, text in
                   zip(batch["id"].tolist(), batch["text"], strict=True))
        ids += batch["id"].tolist()
    assert len(set(data.sizes)) > 1
    assert sorted(ids) == list(range(sum(data.sizes)))


def test_demo_data_is_cached(tmp_path):
    out = str(tmp_path / "demo")
    ensure_demo(out, fmt="tar", shards=2, samples_per_shard=10)
    first = sorted(p.stat().st_mtime_ns for p in Path(out).glob("train-*"))
    ensure_demo(out, fmt="tar", shards=2, samples_per_shard=10)
    assert sorted(p.stat().st_mtime_ns for p in Path(out).glob("train-*")) == first
    ensure_demo(out, fmt="tar", shards=3, samples_per_shard=10)
    assert len(list(Path(out).glob("train-*.tar"))) == 3


@pytest.mark.timeout(90)
def test_bench_runs_dataflow_and_torch_end_to_end(tmp_path):
    out = tmp_path / "out"
    steps, batch = 20, 16
    cmd = [sys.executable, "-m", "dataflow.bench", "run", "--format", "tar",
           "--shards", str(SHARDS),
           "--samples-per-shard", str(PER_SHARD), "--loaders", "dataflow,torch,streaming",
           "--batch-size", str(batch), "--steps", str(steps), "--warmup", "2", "--repeats", "1",
           "--step-ms", "2", "--out", str(out), "--tag", "e2e", "--markdown"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| loader |" in done.stdout
    doc = json.loads((out / "e2e.json").read_text())
    data = load([str(out / f"demo-tar-{SHARDS}x{PER_SHARD}")])
    assert doc["data"] == {**doc["data"], "samples": sum(data.sizes), "format": "tar"}
    assert "streaming" in doc["skipped"] or "streaming" in doc["loaders"]
    for name in ("dataflow", "torch"):
        (run,) = doc["loaders"][name]["runs"]
        assert len(run["wait_ms"]) == steps
        assert run["samples"] == [batch] * steps
        assert run["distinct_ids"] == steps * batch
        assert run["loader_processes"] >= 2
        assert 0.0 <= run["figures"]["gpu_idle"] <= 1.0
    assert (out / "e2e.png").stat().st_size > 1000
    assert not doc["failed"]


def _tar_with_hard_links(out: Path, samples: int) -> Path:
    """A tar made by the ``tar`` CLI whose odd samples' ``.text`` are hard links to sample 1's.

    dataflow reads the link's data; webdataset skips link members, so its samples lack
    ``text`` and ``default_collate`` raises ``KeyError`` inside the torch workers.
    """
    src = out / "src"
    src.mkdir(parents=True)
    for i in range(samples):
        (src / f"{i:06d}.id").write_text(str(i))
        (src / f"{i:06d}.label").write_text(str(i % 10))
        if i % 2 and i != 1:
            os.link(src / "000001.text", src / f"{i:06d}.text")
        else:
            (src / f"{i:06d}.text").write_text(f"sample {i}")
    (out / "data").mkdir()
    names = sorted(p.name for p in src.iterdir())
    subprocess.run(["tar", "cf", str(out / "data" / "shard.tar"), *names], cwd=src, check=True)
    return out / "data"


@pytest.mark.timeout(90)
def test_a_loader_raising_any_exception_is_reported_failed(tmp_path):
    data = _tar_with_hard_links(tmp_path, 40)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dataflow.bench", "run", str(data), "--loaders", "dataflow,torch",
           "--batch-size", "8", "--steps", "5", "--warmup", "1", "--repeats", "1",
           "--step-ms", "0", "--servers", "1", "--out", str(out), "--tag", "fail"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=80)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads((out / "fail.json").read_text())
    assert doc["failed"]["torch"].startswith("KeyError"), doc["failed"]
    assert "dataflow" in doc["loaders"] and "dataflow" not in doc["failed"]
    assert "FAILED" in done.stdout


def _servers_below(pid: int) -> list[int]:
    found = []
    for child in descendants([pid]):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"dataflow.server" in part for part in cmdline[1:3]):
            found.append(child)
    return found


@pytest.mark.timeout(90)
def test_sigterm_stops_the_servers_the_bench_started(tmp_path):
    data = ensure_demo(str(tmp_path / "demo"), fmt="tar", shards=2, samples_per_shard=50)
    cmd = [sys.executable, "-m", "dataflow.bench", "run", data, "--loaders", "dataflow",
           "--batch-size", "8", "--steps", "100000", "--warmup", "1", "--repeats", "1",
           "--step-ms", "5", "--servers", "1", "--out", str(tmp_path / "out")]
    bench = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not servers and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.2)
            servers = _servers_below(bench.pid)
        assert servers, "the bench started no server"
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in servers):
            time.sleep(0.1)
        assert not [p for p in servers if os.path.exists(f"/proc/{p}")]
        assert code == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in servers:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_given_servers_budget_is_stated_and_earlier_files_are_kept(tmp_path):
    from dataflow.server.launch import launch

    out = tmp_path / "out"
    data = ensure_demo(str(tmp_path / "data"), fmt="tar", shards=SHARDS,
                       samples_per_shard=PER_SHARD)
    out.mkdir()
    (out / "ep.json").write_text("an earlier run\n")
    with launch([data], workers=3, timeout=60) as server:
        cmd = [sys.executable, "-m", "dataflow.bench", "run", data, "--endpoints",
               server.endpoint, "--loaders", "dataflow,torch", "--workers", "2",
               "--batch-size", "16", "--steps", "10", "--warmup", "2", "--repeats", "1",
               "--step-ms", "1", "--out", str(out), "--tag", "ep"]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "ep.json").read_text() == "an earlier run\n"
    doc = json.loads((out / "ep-2.json").read_text())
    assert doc["loaders"]["dataflow"]["budget"] == 3
    assert doc["loaders"]["torch"]["budget"] == 2
    assert "1 given server(s): 1 x 3 = 3 reader process(es)" in (
        doc["loaders"]["dataflow"]["description"])
    assert "WARNING: unequal CPU budgets (loading processes: dataflow 3, torch 2)" in done.stdout
    assert f"the given servers serve this dataset (fingerprint {doc['data']['fingerprint']})" in (
        done.stdout)


@pytest.mark.timeout(90)
def test_given_servers_of_another_dataset_are_refused(tmp_path, servers):
    served = ensure_demo(str(tmp_path / "served"), fmt="tar", shards=2, samples_per_shard=20)
    other = ensure_demo(str(tmp_path / "other"), fmt="tar", shards=3, samples_per_shard=20)
    copy = str(tmp_path / "copy")
    shutil.copytree(served, copy)  # copy2: names, sizes and mtimes kept
    server = servers([served])
    index = served_index([server.endpoint], batch_size=8, timeout=30)
    assert index.fingerprint == load([served]).fingerprint
    check_same_dataset(load([copy]), [copy], index, [server.endpoint])
    theirs = load([other])
    out = tmp_path / "out"
    cfg = BenchConfig(data=(other,), endpoints=(server.endpoint,), batch_size=8, timeout_s=30,
                      out_dir=str(out))
    with pytest.raises(DatasetMismatchError) as e:
        run_config(cfg, tag="refused")
    message = str(e.value)
    assert (f"the servers at {server.endpoint} serve dataset {index.fingerprint} (2 shards, "
            f"{index.total} samples), but DATA {other} is dataset") in message
    assert f"{theirs.fingerprint} (3 shards, {theirs.total} samples)" in message
    assert not out.exists()


@pytest.mark.timeout(90)
def test_given_servers_without_data_must_serve_the_demo(tmp_path, servers, capsys):
    served = ensure_demo(str(tmp_path / "served"), fmt="tar", shards=2, samples_per_shard=20)
    server = servers([served])
    out = tmp_path / "out"
    args = ["run", "--shards", "3", "--samples-per-shard", "20", "--timeout", "30",
            "--batch-size", "8", "--steps", "4", "--warmup", "1", "--repeats", "1",
            "--step-ms", "0", "--out", str(out)]
    assert main([*args, "--endpoints", server.endpoint]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the servers at {server.endpoint} serve dataset ")
    demo = out / "demo-tar-3x20"
    assert f"DATA {demo} is dataset " in err
    assert not list(out.glob("*.json"))
    # Servers of the demo dataset the bench wrote: the same data, so torch is compared.
    same = servers([str(demo)])
    assert main([*args, "--endpoints", same.endpoint]) == 0
    assert "the given servers serve this dataset" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["loaders"].keys() == {"dataflow", "torch"}
