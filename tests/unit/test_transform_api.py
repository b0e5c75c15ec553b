"""The public transform API: per-batch seeds, the context, the global batch index, arity."""

from __future__ import annotations

import pytest

from dataflow.errors import ConfigError
from dataflow.plan import rank_batches
from dataflow.transform import (
    TransformContext,
    batch_seed,
    global_batch_index,
    takes_context,
)


def test_batch_seed_is_a_pure_function_of_the_triple() -> None:
    seeds = {batch_seed(s, e, b) for s in range(3) for e in range(3) for b in range(40)}
    assert len(seeds) == 3 * 3 * 40
    assert batch_seed(1, 2, 3) == batch_seed(1, 2, 3)
    assert all(0 <= s < 2**63 for s in seeds)
    # Values past 32 bits are two words each: (2**32, 0) and (0, 1) are different inputs.
    assert batch_seed(2**32, 0, 0) != batch_seed(0, 1, 0)
    assert batch_seed(0, 2**32, 0) != batch_seed(0, 0, 1)


def test_batch_seed_is_pinned() -> None:
    # The value a transform sees must not change between releases or machines.
    assert batch_seed(0, 0, 0) == 2635072618980576772
    assert batch_seed(1, 2, 3) == 3004212637268043712


@pytest.mark.parametrize("bad", [-1, 2**63, 1.0, True, "1"])
def test_batch_seed_and_context_refuse_bad_values(bad) -> None:
    with pytest.raises(ConfigError, match="`epoch` must be an integer"):
        batch_seed(0, bad, 0)
    with pytest.raises(ConfigError, match="`batch_index` must be an integer"):
        TransformContext(0, 0, bad)


def test_context_rng_and_description() -> None:
    ctx = TransformContext(batch_seed(7, 1, 5), 1, 5,
                           (("a.tar", 0, 4), ("b.tar", 2, 3), ("c", 0, 1), ("d", 0, 1),
                            ("e", 0, 1)))
    assert ctx.rng().integers(0, 2**32, 8).tolist() == ctx.rng().integers(0, 2**32, 8).tolist()
    text = ctx.describe()
    assert text.startswith("batch 5 of epoch 1 (a.tar[0:4], b.tar[2:3], c[0:1], d[0:1]")
    assert text.endswith("... 1 more range(s))")
    assert TransformContext(0, 0, 3).describe() == "batch 3 of epoch 0"


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("start", [0, 8, 24])
def test_global_batch_index_names_the_position_in_the_epoch_order(world, start) -> None:
    sizes, batch = [13, 7, 20], 4
    one = rank_batches(sizes, world_size=1, rank=0, epoch=1, seed=3, batch_size=batch,
                       drop_last=True)
    for rank in range(world):
        batches = rank_batches(sizes, world_size=world, rank=rank, epoch=1, seed=3,
                               batch_size=batch, drop_last=True, start=start)
        for j in range(len(batches)):
            g = global_batch_index(start=start, batch_size=batch, world_size=world, rank=rank,
                                   index=j)
            # The same samples as batch g of a single rank reading the whole epoch.
            assert batches[j] == one[g]


def _one(batch):
    return batch


def _two(batch, ctx):
    return batch


def _star(*args):
    return args[0]


def _option(batch, scale=1.0):
    return batch


def test_takes_context_by_signature() -> None:
    assert takes_context(_two) and takes_context(_star) and takes_context(lambda b, c: b)
    assert not takes_context(_one) and not takes_context(_option)
    assert not takes_context(dict)  # a class: called with the batch alone
