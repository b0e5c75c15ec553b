"""Two servers x three ranks: exactly-once epochs, equal batch counts, deterministic order."""

from __future__ import annotations

from collections import Counter

import pytest
from srvtools import run_ranks

from dataflow.client import DataLoader
from dataflow.plan import epoch_size

WORLD = 3
BATCH = 16


def _epoch_ids(endpoints: list[str], *, epochs: int = 1, **kwargs) -> list[list[list[int]]]:
    """Per rank, per epoch, the sample ids the rank received (ranks as concurrent threads)."""

    def run(rank: int) -> list[list[int]]:
        out = []
        with DataLoader(endpoints, batch_size=BATCH, rank=rank, world_size=WORLD,
                        timeout=20, **kwargs) as dl:
            for _ in range(epochs):
                ids: list[int] = []
                n = 0
                for batch in dl:
                    n += 1
                    ids.extend(batch["id"].tolist())
                    assert batch["image"].shape[1:] == (3, 8, 8)
                    offs = batch["text.offsets"]
                    assert offs.shape == (len(batch["id"]) + 1,)
                    assert int(offs[-1]) == batch["text"].numel()
                assert n == len(dl)
                out.append(ids)
        return out

    return run_ranks(WORLD, run, 90)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fmt", ["arrow", "tar"])
def test_every_sample_once_per_epoch(fmt: str, demo_data, servers) -> None:
    demo = demo_data(fmt)
    endpoints = [servers([str(p) for p in demo.paths]).endpoint for _ in range(2)]
    ids = _epoch_ids(endpoints, epochs=2, seed=5)
    size = epoch_size(demo.total, world_size=WORLD, batch_size=BATCH, drop_last=False)
    for epoch in range(2):
        per_rank = [ids[r][epoch] for r in range(WORLD)]
        assert {len(x) for x in per_rank} == {size.samples_per_rank}
        counts = Counter(i for x in per_rank for i in x)
        assert set(counts) == set(range(demo.total))
        assert sum(counts.values()) - demo.total == size.repeated
        assert all(c <= 2 for c in counts.values())
    assert ids[0][0] != ids[0][1], "epochs 0 and 1 have the same order"
    again = _epoch_ids(endpoints, epochs=1, seed=5)
    assert [again[r][0] for r in range(WORLD)] == [ids[r][0] for r in range(WORLD)]


@pytest.mark.timeout(60)
def test_drop_last_and_unshuffled(demo_data, servers) -> None:
    demo = demo_data("arrow")
    endpoint = servers([str(p) for p in demo.paths], workers=2).endpoint
    ids = _epoch_ids([endpoint], drop_last=True, shuffle=False)
    size = epoch_size(demo.total, world_size=WORLD, batch_size=BATCH, drop_last=True)
    # Unshuffled, global batch g is samples [g * B, (g + 1) * B) and rank g % W reads it.
    rounds = [ids[g % WORLD][0][(g // WORLD) * BATCH : (g // WORLD + 1) * BATCH]
              for g in range(WORLD * size.batches_per_rank)]
    flat = [i for batch in rounds for i in batch]
    assert flat == list(range(demo.total - size.dropped))
