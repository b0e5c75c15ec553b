"""Run a training script as the ranks of one CPU job, as torchrun would, and check its epochs.

Each rank is a subprocess in a session of its own, started with the environment a launcher
leaves (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``: gloo over loopback), killed whole when the run ends or times out, its output
in a log whose tail a failure shows. The scripts record the sample ids of every step in
``OUT/rank{r}.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dataflow.plan import epoch_size

# The environment a launcher or scheduler would leave behind; a framework would take it as a
# job of its own.
ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT")
ENV_DROP_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "JSM_", "PL_", "ACCELERATE_")

Records = dict[int, list[dict[str, Any]]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank_processes(cmd: list[str], *, cwd: Path, out: Path, world: int,
                       timeout_s: float, name: str) -> Records:
    """Run ``cmd`` as ranks ``0..world-1`` of one job to completion (``pytest.fail`` with the
    log tails if any exits non-zero or outlives ``timeout_s``); returns each rank's records
    from ``out``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ENV_DROP and not k.startswith(ENV_DROP_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), NODE_RANK="0", WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world))
    logs = [cwd / f"{name}-rank{rank}.log" for rank in range(world)]
    procs: list[subprocess.Popen] = []
    codes: list[int | None] = []
    deadline = time.monotonic() + timeout_s
    try:
        for rank, log_path in enumerate(logs):
            with log_path.open("wb") as log:
                procs.append(subprocess.Popen(
                    cmd, cwd=cwd, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
        for proc in procs:
            try:
                codes.append(proc.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if codes != [0] * world:
        tails = "\n".join(f"--- rank {rank} ---\n{p.read_text(errors='replace')[-3000:]}"
                          for rank, p in enumerate(logs))
        pytest.fail(f"{name}: exit statuses {codes} (None: still running after "
                    f"{timeout_s} s); log tails:\n{tails}")
    records = {}
    for rank in range(world):
        lines = (out / f"rank{rank}.jsonl").read_text().splitlines()
        records[rank] = [json.loads(line) for line in lines]
    return records


def assert_one_epoch(per_rank: dict[int, list[list[int]]], total: int, batch_size: int,
                     what: str) -> None:
    """``per_rank`` (each rank's batches of ids) is one full epoch: equal batch counts, every
    sample exactly once plus the documented padding repeats."""
    size = epoch_size(total, world_size=len(per_rank), batch_size=batch_size, drop_last=False)
    counts = {rank: len(b) for rank, b in per_rank.items()}
    assert set(counts.values()) == {size.batches_per_rank}, f"{what}: batches per rank {counts}"
    seen = Counter(i for batches in per_rank.values() for b in batches for i in b)
    missing = sorted(set(range(total)) - set(seen))
    assert not missing, f"{what}: {len(missing)} samples never seen, e.g. {missing[:10]}"
    assert set(seen) <= set(range(total)), f"{what}: unknown ids"
    extra = sum(seen.values()) - total
    assert extra == size.repeated, (f"{what}: {extra} repeated samples, expected the "
                                    f"{size.repeated} padding repeats; "
                                    f"{sorted(i for i, c in seen.items() if c > 1)[:20]}")
