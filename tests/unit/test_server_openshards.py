"""``--max-open-shards``: how many shards each reader keeps open, decided once the dataset is
indexed (:mod:`dataflow.server.openshards`)."""

from __future__ import annotations

import itertools

import pytest

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ServerStartError
from dataflow.readers import open_shard
from dataflow.readers.tar import TarOptions
from dataflow.server.openshards import (
    AUTO_CAP,
    INDEX_DESCRIPTORS,
    SHARD_DESCRIPTORS,
    member_index_bytes,
    open_shards,
)


@pytest.mark.parametrize(("setting", "shards", "others", "hard"), list(itertools.product(
    (None, 1, 8, 1024), (1, 7, 8, 4096, 100_000), (256, 336, 1256), (None, 2000, 20_000))))
def test_open_shards_over_a_grid(setting: int | None, shards: int, others: int,
                                 hard: int | None) -> None:
    own = others
    room = (hard - own) // SHARD_DESCRIPTORS if hard else AUTO_CAP
    want = setting if setting is not None else min(shards, AUTO_CAP, room)
    if hard is not None and own + SHARD_DESCRIPTORS * want > hard or want < 1:
        with pytest.raises(ServerStartError, match=r"ulimit -Hn\) is \d+"):
            open_shards(setting, shards, others, hard)
        return
    got = open_shards(setting, shards, others, hard)
    assert got.count == want and got.descriptors == own + SHARD_DESCRIPTORS * want
    assert hard is None or got.descriptors <= hard
    # Each open tar may map its index shared where the hard limit leaves two more descriptors.
    spare = want if hard is None else (hard - got.descriptors) // INDEX_DESCRIPTORS
    assert got.shared_indexes == min(want, spare)
    assert got.reserve == got.descriptors + INDEX_DESCRIPTORS * got.shared_indexes
    assert hard is None or got.reserve <= hard
    # Advice exactly when a batch of the default shuffle would reopen shards, naming the count
    # every shard open needs.
    assert (got.advice is None) == (shards <= want)
    if got.advice is not None:
        assert f"{shards} shards" in got.advice and f"--max-open-shards {shards}" in got.advice


def test_auto_keeps_every_shard_open_within_the_hard_limit_and_says_which_bound_it() -> None:
    assert open_shards(None, 4096, 1000, None).count == 4096
    assert open_shards(None, 4096, 1000, 20_000).count == 4096
    capped = open_shards(None, 4096, 1000, 3000)
    assert capped.count == (3000 - 1000) // SHARD_DESCRIPTORS
    assert capped.advice is not None and "hard limit (ulimit -Hn) 3000" in capped.advice
    huge = open_shards(None, 10 * AUTO_CAP, 1000, None)
    assert huge.count == AUTO_CAP and huge.advice is not None and str(AUTO_CAP) in huge.advice
    given = open_shards(1024, 4096, 1000, None)
    assert given.count == 1024 and given.advice is not None
    assert "--max-open-shards 1024 open" in given.advice


def test_member_index_bytes_are_what_an_open_tar_s_index_holds(tmp_path) -> None:
    demo = make_demo(str(tmp_path / "d"), DemoSpec(fmt="tar", shards=1, samples_per_shard=37,
                                                   uneven=False),
                     progress=None)
    with open_shard(str(demo.paths[0]), cache_dir=str(tmp_path / "c"),
                    tar=TarOptions(keys=False)) as reader:
        ix = reader._index
        held = ix.offsets.nbytes + ix.sizes.nbytes + ix.ints.nbytes + ix.headers.nbytes
        fields, n = len(ix.schema), len(ix)
    assert n == 37
    assert member_index_bytes([37], fields, 1) - 8 * 37 == held  # 8 a sample: a key's offset
    assert member_index_bytes([5, 37, 20], fields, 2) == member_index_bytes([57], fields, 1)
    assert member_index_bytes([5, 37, 20], fields, 0) == 0
