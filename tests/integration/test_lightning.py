"""The DataLoader under PyTorch Lightning DDP (2 CPU ranks, real servers on loopback).

Lightning 2.x treats a loader with ``state_dict``/``load_state_dict`` as stateful: it saves rank
0's loader state in its checkpoints and, when the checkpoint was taken mid-epoch, loads it on
every rank. Each epoch it calls ``loader.sampler.set_epoch(epoch)`` (after it made the epoch's
iterator: the client retargets an iterator not read yet), it runs a validation sanity check
that abandons the val loader after a few batches, and it does not prefetch from a loader that
has a length. The client's contract (``client/cursor.py``: every pass is a full pass of the
current epoch, a completed pass advances the epoch, the state is global) is what makes that
work, also after a resume from an end-of-epoch checkpoint, where Lightning loads no loader
state and only sets the epoch; these tests check it end to end.

The training script is a real file (``lightning_train.py``, copied into ``tmp_path``), each of
its 2 ranks (``strategy="ddp"``, CPU, gloo) a subprocess under a timeout; each rank records the
sample ids of every step in ``OUT/rank{r}.jsonl``.
"""

from __future__ import annotations

import shutil
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from ranks import Records, assert_one_epoch, run_rank_processes

from dataflow.plan import epoch_size

# Only a missing lightning skips; a broken install fails in the script, with its log.
pytestmark = pytest.mark.skipif(find_spec("lightning") is None,
                                reason="lightning is not installed (the `dev` extra has it)")

SCRIPT = Path(__file__).with_name("lightning_train.py")
WORLD = 2
BATCH = 8
VAL_BATCH = 12
SCRIPT_TIMEOUT_S = 120


def _train(tmp_path: Path, endpoint: str, name: str, *args: str) -> Records:
    """Run the training script on 2 DDP ranks to completion; returns each rank's records.

    Both ranks are started here, as torchrun would (Lightning's own launcher starts rank 1
    the same way, but only once rank 0 has imported everything, which doubles the start-up
    time on 2 cores).
    """
    script = tmp_path / SCRIPT.name
    if not script.exists():
        shutil.copy(SCRIPT, script)
    out = tmp_path / name
    cmd = [sys.executable, str(script), "--endpoint", endpoint, "--out", str(out),
           "--devices", str(WORLD), "--batch-size", str(BATCH),
           "--val-batch-size", str(VAL_BATCH), *args]
    return run_rank_processes(cmd, cwd=tmp_path, out=out, world=WORLD,
                              timeout_s=SCRIPT_TIMEOUT_S, name=name)


def _batches(records: Records, kind: str, epoch: int | None = None) -> dict[int, list[list[int]]]:
    """Per rank, the ids of each ``kind`` batch (of trainer epoch ``epoch``), in order."""
    return {rank: [r["ids"] for r in recs
                   if r["kind"] == kind and (epoch is None or r["epoch"] == epoch)]
            for rank, recs in records.items()}


def _loader_events(records: Records, name: str) -> dict[int, list[dict[str, Any]]]:
    return {rank: [r for r in recs if r["kind"] == "loader" and r["name"] == name]
            for rank, recs in records.items()}


@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_ddp_fit_reads_every_sample_once_per_epoch(demo_data, servers, tmp_path) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    records = _train(tmp_path, endpoint, "fit", "--max-epochs", "2")

    for name, batch in (("train", BATCH), ("val", VAL_BATCH)):
        made = _loader_events(records, name)
        n = epoch_size(demo.total, world_size=WORLD, batch_size=batch,
                       drop_last=False).batches_per_rank
        for rank, events in made.items():  # built once, after DDP init: rank from the group
            assert [(e["rank"], e["world_size"], e["len"]) for e in events] == [(rank, WORLD, n)]

    # (a) each training epoch is a full, reshuffled epoch without set_epoch
    epochs = [_batches(records, "train", e) for e in range(2)]
    for e, per_rank in enumerate(epochs):
        assert_one_epoch(per_rank, demo.total, BATCH, f"train epoch {e}")
    assert epochs[0][0] != epochs[1][0], "epoch 1 repeats epoch 0's order"
    assert {r["loader_epoch"] for r in records[0] if r["kind"] == "train" and r["epoch"] == 1} \
        == {1}

    # (b) the sanity check (2 batches per rank) takes nothing from the first validation pass
    sanity = _batches(records, "sanity")
    assert {rank: len(b) for rank, b in sanity.items()} == {r: 2 for r in range(WORLD)}
    for e in range(2):
        assert_one_epoch(_batches(records, "val", e), demo.total, VAL_BATCH,
                         f"validation after epoch {e}")


@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S + 60)
def test_ddp_resume_mid_epoch_from_a_lightning_checkpoint(demo_data, servers, tmp_path) -> None:
    import torch

    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    n = epoch_size(demo.total, world_size=WORLD, batch_size=BATCH,
                   drop_last=False).batches_per_rank
    k = n // 2
    stop = n + k  # global step: k batches into epoch 1
    ckpt_dir = tmp_path / "ckpt"
    first = _train(tmp_path, endpoint, "first", "--max-epochs", "2", "--max-steps", str(stop),
                   "--ckpt-dir", str(ckpt_dir), "--ckpt-step", str(stop))

    assert_one_epoch(_batches(first, "train", 0), demo.total, BATCH, "run 1, train epoch 0")
    head = _batches(first, "train", 1)
    assert {rank: len(b) for rank, b in head.items()} == {r: k for r in range(WORLD)}

    # Lightning saved rank 0's loader state, k batches into epoch 1, as plain scalars.
    assert [p.name for p in ckpt_dir.iterdir()] == ["mid.ckpt"]
    ckpt = torch.load(ckpt_dir / "mid.ckpt", weights_only=True)
    assert ckpt["global_step"] == stop
    (saved,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert (saved["world_size"], saved["epoch"], saved["consumed"]) \
        == (WORLD, 1, k * WORLD * BATCH)

    second = _train(tmp_path, endpoint, "second", "--max-epochs", "2",
                    "--resume", str(ckpt_dir / "mid.ckpt"))

    # every rank loaded rank 0's state as it was saved, and kept its own rank
    for rank, recs in second.items():
        loads = [r for r in recs if r["kind"] == "load_state_dict"]
        assert len(loads) == 1, f"rank {rank}: {loads}"
        assert "error" not in loads[0], f"rank {rank} refused rank 0's state: {loads[0]}"
        assert loads[0]["state"] == saved
        after = loads[0]["after"]
        assert (loads[0]["rank"], after["epoch"], after["consumed"]) \
            == (rank, 1, saved["consumed"])

    # (c) the interrupted epoch: run 1's k batches + run 2's rest, nothing replayed or lost
    tail = _batches(second, "train")
    assert {rank: len(b) for rank, b in tail.items()} == {r: n - k for r in range(WORLD)}
    assert {(r["epoch"], r["loader_epoch"]) for recs in second.values() for r in recs
            if r["kind"] == "train"} == {(1, 1)}
    assert_one_epoch({rank: head[rank] + tail[rank] for rank in range(WORLD)}, demo.total,
                     BATCH, "train epoch 1 across the interruption")
    assert_one_epoch(_batches(second, "val", 1), demo.total, VAL_BATCH,
                     "validation after the resumed epoch")


@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S + 60)
def test_ddp_resume_from_an_end_of_epoch_checkpoint_continues_the_epochs(demo_data, servers,
                                                                         tmp_path) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths]).endpoint
    ckpt_dir = tmp_path / "ckpt"
    first = _train(tmp_path, endpoint, "first", "--max-epochs", "1",
                   "--epoch-ckpt-dir", str(ckpt_dir))
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["epoch0.ckpt"]
    second = _train(tmp_path, endpoint, "second", "--max-epochs", "2",
                    "--resume", str(ckpt_dir / "epoch0.ckpt"))

    resumed = _batches(second, "train", 1)
    assert_one_epoch(resumed, demo.total, BATCH, "train epoch 1 after the resume")
    epoch0 = _batches(first, "train", 0)
    loader_epochs = {r["loader_epoch"] for recs in second.values() for r in recs
                     if r["kind"] == "train"}
    assert loader_epochs == {1} and resumed[0] != epoch0[0], (
        f"Lightning epoch 1 after the resume was served as loader epoch(s) {loader_epochs}; "
        f"same order as epoch 0: {resumed[0] == epoch0[0]}")
