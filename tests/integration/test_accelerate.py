"""The DataLoader under Hugging Face Accelerate (2 CPU ranks, real servers on loopback).

``accelerator.prepare`` hands objects it does not know back as they are, so the loader keeps
its own sharding (rank and world size from the launcher's environment); its position goes into
Accelerate's checkpoints through ``register_for_checkpointing`` (it has ``state_dict`` /
``load_state_dict``): the main process saves it, every rank loads it. The training script is a
real file (``accelerate_train.py``, copied into ``tmp_path``), each rank a subprocess started as
``accelerate launch`` would.
"""

from __future__ import annotations

import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from ranks import Records, assert_one_epoch, run_rank_processes

from dataflow.plan import epoch_size

# Only a missing accelerate skips; a broken install fails in the script, with its log.
pytestmark = pytest.mark.skipif(find_spec("accelerate") is None,
                                reason="accelerate is not installed (the `dev` extra has it)")

SCRIPT = Path(__file__).with_name("accelerate_train.py")
WORLD = 2
BATCH = 8
SCRIPT_TIMEOUT_S = 120


def _train(tmp_path: Path, endpoint: str, name: str, *args: str) -> Records:
    script = tmp_path / SCRIPT.name
    if not script.exists():
        shutil.copy(SCRIPT, script)
    out = tmp_path / name
    cmd = [sys.executable, str(script), "--endpoint", endpoint, "--out", str(out),
           "--ckpt", str(tmp_path / "ckpt"), "--batch-size", str(BATCH), *args]
    return run_rank_processes(cmd, cwd=tmp_path, out=out, world=WORLD,
                              timeout_s=SCRIPT_TIMEOUT_S, name=name)


def _steps(records: Records, epoch: int, last: int | None = None) -> dict[int, list[list[int]]]:
    """Per rank, the ids of each step of loader epoch ``epoch`` (up to global step ``last``)."""
    return {rank: [r["ids"] for r in recs if r["kind"] == "train" and r["epoch"] == epoch
                   and (last is None or r["step"] <= last)]
            for rank, recs in records.items()}


@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S + 60)
def test_save_state_mid_epoch_then_load_state_reads_the_rest_once(demo_data, servers,
                                                                  tmp_path) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    n = epoch_size(demo.total, world_size=WORLD, batch_size=BATCH,
                   drop_last=False).batches_per_rank
    saved = n + n // 2  # the checkpoint's step: half way through epoch 1
    lost = 2  # steps run after it, lost by the "crash"
    first = _train(tmp_path, endpoint, "first", "--every", str(saved),
                   "--stop-after", str(saved + lost))

    for rank, recs in first.items():
        assert [r["same"] for r in recs if r["kind"] == "prepared"] == [True], rank
    assert_one_epoch(_steps(first, 0), demo.total, BATCH, "run 1, epoch 0 (no set_epoch)")
    head0, head1 = _steps(first, 0)[0][: n // 2], _steps(first, 1)[0][: n // 2]
    assert len(head1) == n // 2 and head0 != head1, "epoch 1 repeats epoch 0's order"

    second = _train(tmp_path, endpoint, "second", "--resume")

    # every rank loaded the main process's state: epoch 1, the checkpoint's samples consumed
    for rank, recs in second.items():
        (loaded,) = [r["state"] for r in recs if r["kind"] == "loaded"]
        assert (loaded["epoch"], loaded["consumed"], loaded["world_size"]) \
            == (1, (saved - n) * WORLD * BATCH, WORLD), f"rank {rank}: {loaded}"
    head = _steps(first, 1, last=saved)
    tail = _steps(second, 1)
    assert_one_epoch({rank: head[rank] + tail[rank] for rank in range(WORLD)}, demo.total,
                     BATCH, "epoch 1 across the crash")
    replayed = _steps(first, 1)
    for rank in range(WORLD):  # the lost steps are read again, the same batches
        assert tail[rank][:lost] == replayed[rank][n // 2:], rank
    assert {r["epoch"] for recs in second.values() for r in recs if r["kind"] == "train"} \
        == {1}
