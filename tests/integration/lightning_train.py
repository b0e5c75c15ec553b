"""A tiny Lightning DDP training script over dataflow, run by ``test_lightning.py``.

Not a test module: the test copies it into ``tmp_path`` and runs it once per rank with
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, as torchrun (or Lightning's own
``strategy="ddp"`` launcher, for the ranks it starts) would. The loaders take rank and world
size from ``torch.distributed``: they are built in ``train_dataloader()`` /
``val_dataloader()``, after DDP initialized the process group.

Each rank appends JSON lines to ``OUT/rank{r}.jsonl``, flushed at once (an interrupted run keeps
its records):

* ``{"kind": "train" | "sanity" | "val", "epoch": trainer epoch, "loader_epoch": loader epoch,
  "batch_idx": i, "ids": [sample ids]}`` for every batch a step ran on;
* ``{"kind": "loader", "name": "train" | "val", "rank": r, "world_size": w, "len": n}`` when a
  loader is built;
* ``{"kind": "load_state_dict", "state": state, "after": state_dict()}`` when Lightning
  restores the train loader from a checkpoint (a failing load is recorded, then raised).

Usage: python lightning_train.py --endpoint tcp://127.0.0.1:PORT --out DIR [options]
(without ``LOCAL_RANK``, Lightning starts the other ranks itself).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dataflow.client import DataLoader

IMAGE_FEATURES = 3 * 8 * 8  # the integration demo data's image shape (conftest.SMALL_IMAGE)


class Records:
    """Append-only JSON lines for one rank, flushed per line."""

    def __init__(self, out: Path, rank: int) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self._f = (out / f"rank{rank}.jsonl").open("a", encoding="utf-8")

    def write(self, **fields: Any) -> None:
        self._f.write(json.dumps(fields) + "\n")
        self._f.flush()


class RecordingLoader(DataLoader):
    """A DataLoader that records the states Lightning asks it to load."""

    records: Records | None = None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        assert self.records is not None
        try:
            super().load_state_dict(state)
        except Exception as e:
            self.records.write(kind="load_state_dict", state=dict(state), error=repr(e))
            raise
        self.records.write(kind="load_state_dict", state=dict(state), rank=self.config.rank,
                           after=self.state_dict())


class Model(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(IMAGE_FEATURES, 1)
        self._records: Records | None = None
        self._loaders: dict[str, DataLoader] = {}

    @property
    def records(self) -> Records:
        if self._records is None:
            self._records = Records(Path(self.args.out), self.global_rank)
        return self._records

    def _loader(self, name: str, batch_size: int, shuffle: bool) -> DataLoader:
        dl = RecordingLoader(self.args.endpoint, batch_size=batch_size, shuffle=shuffle,
                             seed=self.args.seed, timeout=30)
        dl.records = self.records
        self._loaders[name] = dl
        self.records.write(kind="loader", name=name, rank=dl.config.rank,
                           world_size=dl.config.world_size, len=len(dl))
        return dl

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.args.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.args.val_batch_size, shuffle=False)

    def _record(self, kind: str, name: str, batch: dict[str, torch.Tensor],
                batch_idx: int) -> None:
        self.records.write(kind=kind, epoch=self.current_epoch,
                           loader_epoch=self._loaders[name].epoch, batch_idx=batch_idx,
                           ids=batch["id"].tolist())

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["image"].flatten(1).float() / 255
        return self.layer(x).pow(2).mean()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._record("train", "train", batch, batch_idx)
        return self._loss(batch)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._record("sanity" if self.trainer.sanity_checking else "val", "val", batch,
                     batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def teardown(self, stage: str) -> None:
        for dl in self._loaders.values():
            dl.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--out", required=True, help="folder for the per-rank records")
    p.add_argument("--devices", type=int, default=2, help="DDP ranks (CPU processes)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--val-batch-size", type=int, default=12)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--ckpt-dir", help="save a checkpoint named mid.ckpt here ...")
    p.add_argument("--ckpt-step", type=int, default=0, help="... at this global step")
    p.add_argument("--epoch-ckpt-dir", help="save epoch{N}.ckpt here after each epoch")
    p.add_argument("--resume", help="checkpoint to resume from")
    args = p.parse_args(argv)

    callbacks = []
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, filename="mid",
                                         every_n_train_steps=args.ckpt_step, save_top_k=-1))
    if args.epoch_ckpt_dir:  # Lightning's default timing: after each epoch's validation
        callbacks.append(ModelCheckpoint(dirpath=args.epoch_ckpt_dir, filename="epoch{epoch}",
                                         auto_insert_metric_name=False, save_top_k=-1))
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp",
                         max_epochs=args.max_epochs, max_steps=args.max_steps,
                         num_sanity_val_steps=2, enable_progress_bar=False, logger=False,
                         enable_model_summary=False, enable_checkpointing=bool(callbacks),
                         callbacks=callbacks, use_distributed_sampler=False)
    trainer.fit(Model(args), ckpt_path=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
