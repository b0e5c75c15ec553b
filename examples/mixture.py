"""A weighted mixture of two datasets, resumed exactly, with the lineage of every sample.

    python examples/mixture.py --out /tmp/mixture-demo

writes two demo datasets of different formats and sizes, ``web`` (Arrow, 400 samples) and
``books`` (WebDataset tar, 40 samples), starts a loader server on each, and reads two epochs
of 200 samples of a 70/30 mixture of them with :class:`dataflow.client.MixtureLoader` in
batches of 10:

* every batch holds 7 ``web`` and 3 ``books`` samples (70% and 30% of 10: exact per batch);
* ``books``, weighed far above its share of the data, repeats whole passes (each of its
  samples once per pass); ``web`` reads a seeded part of its first pass each epoch, each
  sample at most once;
* a loader stopped midway (its ``state_dict()``) and a new one resumed from it read exactly
  the batches of the uninterrupted run;
* with ``lineage=True`` every batch says where each sample came from: what to log when a
  batch's loss spikes (``loader.lineage(batch)``: source, shard, row).

It prints one JSON line: the samples of each source per batch, whether the resumed run read
the uninterrupted batches, how many passes over ``books`` and whether ``web`` was read at most
once, and the origin of the first samples of the last batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from dataflow.demo import DemoSpec, make_demo

BATCH = 10
EPOCHS = 2


def main(argv: list[str] | None = None) -> int:
    """Write the datasets, serve them, read the mixture, print a summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the shards")
    args = p.parse_args(argv)

    from dataflow.client import MixtureLoader, Source
    from dataflow.server import launch

    web = make_demo(str(args.out / "web"), DemoSpec(fmt="arrow", shards=4,
                                                    samples_per_shard=100, uneven=False,
                                                    image_shape=(3, 8, 8)), progress=None)
    books = make_demo(str(args.out / "books"), DemoSpec(fmt="tar", shards=2,
                                                        samples_per_shard=20, uneven=False,
                                                        image_shape=(3, 8, 8)), progress=None)
    with launch(list(web.paths), workers=1) as web_server, \
            launch(list(books.paths), workers=1) as books_server:
        sources = [Source(web_server.endpoint, 0.7, name="web"),
                   Source(books_server.endpoint, 0.3, name="books")]

        def loader() -> MixtureLoader:
            return MixtureLoader(sources, batch_size=BATCH, seed=0, rank=0, world_size=1,
                                 samples_per_epoch=200, lineage=True)

        with loader() as ml:
            whole = []
            for epoch in range(EPOCHS):
                ml.set_epoch(epoch)
                for batch in ml:
                    whole.append([(o.source, o.shard, o.row) for o in ml.lineage(batch)])
            stats = ml.stats()
            last = ml.lineage(batch)[:3]
        with loader() as ml:  # stopped after 7 batches of epoch 1, then resumed
            ml.set_epoch(1)
            it = iter(ml)
            head = [[(o.source, o.shard, o.row) for o in ml.lineage(next(it))]
                    for _ in range(7)]
            state = ml.state_dict()
        with loader() as ml:
            ml.load_state_dict(state)
            ml.set_epoch(1)
            rest = [[(o.source, o.shard, o.row) for o in ml.lineage(b)] for b in ml]
    mixes = {tuple(sorted(Counter(s for s, _, _ in b).items())) for b in whole}
    web_seen = Counter((shard, row) for b in whole for s, shard, row in b if s == "web")
    books_seen = Counter((shard, row) for b in whole for s, shard, row in b if s == "books")
    print(json.dumps({
        "per_batch": dict(mixes.pop()) if len(mixes) == 1 else sorted(mixes),
        "resumed_equal": head + rest == whole[len(whole) // EPOCHS:],
        "books_passes": min(books_seen.values()), "web_once": max(web_seen.values()) == 1,
        "samples": {name: s["samples"] for name, s in stats["sources"].items()},
        "last_batch_origins": [list(o) for o in last]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
