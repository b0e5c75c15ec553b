"""``examples/train.py`` end to end: a torch model trained from two local loader servers, cut
short after a checkpoint, resumed from it; every epoch is every sample exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def _run(out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(TRAIN), "--out", str(out), "--epochs", "3",
                           "--every", "5", *args], capture_output=True, text=True, timeout=100,
                          cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
def test_training_stopped_after_a_checkpoint_resumes_every_sample_exactly_once(tmp_path) -> None:
    out = tmp_path / "train"
    first = _run(out, "--stop-after", "17")  # checkpoint at step 15: one batch into epoch 1
    assert first["steps"] == 17 and first["device"] in ("cpu", "cuda")
    second = _run(out, "--resume")
    ckpt, ids = second["checkpoint_ids"], second["ids"]
    every = sorted(ckpt["0"])
    assert len(every) == len(set(every)) > 0 and sorted(first["ids"]["0"]) == every
    assert sorted(ckpt["1"] + ids["1"]) == every and sorted(ids["2"]) == every
    assert ckpt["1"] == first["ids"]["1"][: len(ckpt["1"])]  # the batches before the cut
    assert all(v == v and v < 10 for v in (second["first_loss"], second["last_loss"]))
