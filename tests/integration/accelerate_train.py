"""A tiny Hugging Face Accelerate training script over dataflow, run by ``test_accelerate.py``.

Not a test module: the test copies it into ``tmp_path`` and runs it once per rank with the
environment ``accelerate launch`` (or torchrun) leaves: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``... The loader takes rank and world size from that environment.

The loop is the one Accelerate's docs show, with the loader's position registered for
checkpointing (``accelerator.register_for_checkpointing``): ``save_state`` every ``--every``
steps, ``--stop-after`` steps to stand for a crash, ``--resume`` to ``load_state`` and go on.
No ``set_epoch``: a pass that runs to its end starts the next epoch, and ``loader.epoch`` after
``load_state`` is the epoch the run goes on in.

Each rank appends JSON lines to ``OUT/rank{r}.jsonl``, flushed at once:

* ``{"kind": "prepared", "same": bool}``: whether ``accelerator.prepare`` handed the loader back
  as it was;
* ``{"kind": "loaded", "state": state_dict()}`` after ``load_state``;
* ``{"kind": "train", "epoch": loader epoch, "step": global step, "ids": [sample ids]}`` for
  every step;
* ``{"kind": "saved", "step": global step}`` after each ``save_state``.

Usage: python accelerate_train.py --endpoint tcp://127.0.0.1:PORT --out DIR [options]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from dataflow.client import DataLoader

IMAGE_FEATURES = 3 * 8 * 8  # the integration demo data's image shape (conftest.SMALL_IMAGE)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--out", required=True, help="folder for the per-rank records")
    p.add_argument("--ckpt", required=True, help="folder of the Accelerate checkpoint")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, help="steps between checkpoints (none without)")
    p.add_argument("--stop-after", type=int, help="exit after this many steps (a crash)")
    p.add_argument("--resume", action="store_true", help="load_state from --ckpt first")
    args = p.parse_args(argv)

    accelerator = Accelerator(cpu=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = (out / f"rank{accelerator.process_index}.jsonl").open("a", encoding="utf-8")

    def record(**fields: Any) -> None:
        records.write(json.dumps(fields) + "\n")
        records.flush()

    model = torch.nn.Linear(IMAGE_FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(args.endpoint, batch_size=args.batch_size, seed=3, timeout=30)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    record(kind="prepared", same=prepared is loader)
    accelerator.register_for_checkpointing(loader)
    step = 0
    if args.resume:
        accelerator.load_state(args.ckpt)
        record(kind="loaded", state=loader.state_dict())
    with loader:
        for _ in range(loader.epoch, args.epochs):
            for batch in loader:
                loss = model(batch["image"].flatten(1).float() / 255).pow(2).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                record(kind="train", epoch=loader.epoch, step=step, ids=batch["id"].tolist())
                if args.every and step % args.every == 0:
                    accelerator.save_state(args.ckpt)
                    record(kind="saved", step=step)
                if step == args.stop_after:
                    return 0
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
