"""Train a small torch model from local loader servers, with checkpoints and resume.

    python examples/train.py --out /tmp/train-demo                  # 2 epochs, checkpoints
    python examples/train.py --out /tmp/train-demo --stop-after 30  # "crash" after 30 steps
    python examples/train.py --out /tmp/train-demo --resume         # go on from the checkpoint

Writes demo WebDataset shards (3x64x64 images, a label, a unique id) under ``--out`` once,
starts two loader servers on them, and trains a small CNN on CPU, or on CUDA when present
(batches then land on the GPU through the loader's pinned ring). Every ``--every`` steps it
saves the model, the optimizer and the loader's position in one checkpoint; ``--resume``
restores all three and goes on from the next batch, on any world size. Prints one JSON line:
the steps run, the first and last loss, and the sample ids read per epoch in this run (with
the ids the checkpoint says were already read, an epoch is every id exactly once).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.server import launch


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(8 * 16, 10))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the shards and the checkpoint")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this many steps")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint")
    args = p.parse_args(argv)
    out = Path(args.out)
    shards = sorted(str(s) for s in out.glob("shards/*.tar"))
    if not shards:
        demo = make_demo(str(out / "shards"), DemoSpec(fmt="tar", shards=4,
                                                       samples_per_shard=100), progress=None)
        shards = [str(s) for s in demo.paths]
    device = "cuda" if torch.cuda.is_available() else None
    net = model().to(device or "cpu")
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ckpt_path = out / "ckpt.pt"
    with launch(shards, workers=1) as a, launch(shards, workers=1) as b, DataLoader(
            [a.endpoint, b.endpoint], batch_size=args.batch_size, seed=0, device=device,
            rank=0, world_size=1) as loader:
        start, before = 0, {}
        if args.resume:
            ckpt = torch.load(ckpt_path)
            net.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            loader.load_state_dict(ckpt["loader"])
            start, before = ckpt["epoch"], ckpt["ids"]
        steps, losses, ids = 0, [], {}
        for epoch in range(start, args.epochs):
            loader.set_epoch(epoch)
            seen = ids.setdefault(epoch, [])
            for batch in loader:
                x = batch["image"].float() / 255
                loss = nn.functional.cross_entropy(net(x), batch["label"].long() % 10)
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                losses.append(loss.item())
                seen += batch["id"].tolist()
                if steps % args.every == 0:
                    done = {e: before.get(e, []) + ids.get(e, []) for e in {*before, *ids}}
                    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                                "loader": loader.state_dict(), "epoch": epoch, "ids": done},
                               ckpt_path)
                if steps == args.stop_after:
                    break
            if steps == args.stop_after:
                break
    print(json.dumps({"steps": steps, "first_loss": losses[0], "last_loss": losses[-1],
                      "device": device or "cpu", "ids": {str(e): v for e, v in ids.items()},
                      "checkpoint_ids": {str(e): v for e, v in before.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
