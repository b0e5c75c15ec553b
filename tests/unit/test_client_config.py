"""DataLoader configuration validation and the distributed-environment defaults."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataflow import wire
from dataflow.client.config import READER_CREDITS, LoaderConfig, dist_env, normalize_device
from dataflow.client.discovery import parse_servers
from dataflow.errors import ConfigError
from dataflow.shm import Geometry
from dataflow.shuffle import Shuffle
from dataflow.wire.fields import MAX_SHM_SLOTS


def _cfg(**kw) -> LoaderConfig:
    base = dict(servers=parse_servers("tcp://127.0.0.1:5555"), batch_size=4, rank=0, world_size=1)
    return LoaderConfig(**{**base, **kw})


@pytest.mark.parametrize("kw, field", [
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=True), "batch_size"),
    (dict(batch_size=4.0), "batch_size"),
    (dict(batch_size=(1 << 24) + 1), "batch_size"),
    (dict(rank=2, world_size=2), "rank"),
    (dict(world_size=0), "world_size"),
    (dict(prefetch=0), "prefetch"),
    (dict(timeout=0), "timeout"),
    (dict(grace=-1), "grace"),
    (dict(grace=float("inf")), "grace"),
    (dict(grace="10"), "grace"),
    (dict(grace=True), "grace"),
    (dict(seed=-1), "seed"),
    (dict(seed=np.bool_(True)), "seed"),
    (dict(shuffle="random"), "shuffle"),
    (dict(servers=("tcp://a:1",)), "servers"),
    (dict(resolve_interval=0), "resolve_interval"),
    (dict(resolve_interval=True), "resolve_interval"),
    (dict(resolve_interval=float("inf")), "resolve_interval"),
    (dict(read_ahead=1), "read_ahead"),
    (dict(lineage="yes"), "lineage"),
    (dict(tune_malloc=1), "tune_malloc"),
    (dict(request_timeout=0), "request_timeout"),
    (dict(request_timeout=-1.0), "request_timeout"),
    (dict(request_timeout=float("inf")), "request_timeout"),
    (dict(request_timeout="8"), "request_timeout"),
    (dict(request_timeout=True), "request_timeout"),
    (dict(shared_memory="on"), "shared_memory"),
    (dict(shared_memory=True), "shared_memory"),
    (dict(shared_memory_slot_bytes=4095), "shared_memory_slot_bytes"),
    (dict(shared_memory_slot_bytes=True), "shared_memory_slot_bytes"),
])
def test_config_rejects(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"`{field}`"):
        _cfg(**kw)


@pytest.mark.parametrize("columns, reason", [
    ([], r"must be a list of 1 to 1024 field names. Found: \[\]"),
    ((), r"must be a list of 1 to 1024 field names. Found: \[\]"),
    ("image", r"must be a list of served field names, or None for every field. Found: 'image'"),
    (b"image", r"must be a list of served field names"),
    ({"id", "image"}, r"must be a list of served field names"),
    (3, r"must be a list of served field names"),
    (["id", "image", "id"], r"names field 'id' twice. Found: \['id', 'image', 'id'\]"),
    (["id", 3], r"field names must be non-empty strings of at most 256 characters; 3 is not"),
    (["id", None], r"field names must be non-empty strings .*; None is not"),
    (["id", ""], r"field names must be non-empty strings .*; '' is not"),
    (["x" * 257], r"field names must be non-empty strings of at most 256 characters"),
    ([f"c{i}" for i in range(1025)], r"must be a list of 1 to 1024 field names"),
])
def test_config_rejects_columns_naming_the_problem(columns: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=r"^`columns` " + reason):
        _cfg(columns=columns)


def test_batch_size_and_columns_are_said_in_the_hello() -> None:
    """The HELLO asks a credit for each reader a server may have (the scheduler uses
    ``prefetch`` of them, or one per reader), or ``prefetch``, if more."""
    assert _cfg().columns is None
    assert _cfg().hello("rank 0") == wire.Hello(256, "rank 0", batch_size=4, group=8)
    cfg = _cfg(columns=["id", "image.bytes"], prefetch=3, batch_size=7, batches_per_request=1)
    assert cfg.columns == ("id", "image.bytes")
    assert cfg.hello("rank 1/2") == wire.Hello(256, "rank 1/2", batch_size=7,
                                               columns=("id", "image.bytes"))
    assert _cfg(prefetch=300).hello("r").credits == 300


def test_batches_per_request_sizes_the_requests() -> None:
    """"auto": up to 8 batches sized to a 32 MiB reply; to a 16 MiB one, at most a slot, where
    replies land in shared memory; an integer: that many, always."""
    assert _cfg().request_group == (8, 32 * 2**20, 16 * 2**20)
    assert _cfg(shared_memory_slot_bytes=2**20).request_group == (8, 32 * 2**20, 2**20)
    assert _cfg(shared_memory="off").request_group == (8, 32 * 2**20, None)
    assert _cfg(batches_per_request=np.int64(3)).request_group == (3, None, None)
    assert _cfg(batches_per_request=3).hello("r").group == 3
    for bad in (0, 65, "many", 2.0, True):
        with pytest.raises(ConfigError, match="batches_per_request"):
            _cfg(batches_per_request=bad)


def test_numpy_and_torch_integers_are_kept_as_ints() -> None:
    """Integers of any kind are accepted and stored as ``int``: the HELLO is JSON."""
    cfg = _cfg(batch_size=np.int64(7), prefetch=torch.tensor(300), seed=np.uint32(5))
    assert [type(v) for v in (cfg.batch_size, cfg.prefetch, cfg.seed)] == [int] * 3
    assert wire.decode(wire.encode(cfg.hello("r"))) == wire.Hello(300, "r", batch_size=7,
                                                                  group=8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_device_without_cuda() -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        _cfg(device=normalize_device("cuda"))


class _Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        while True:
            yield 0


def test_normalizers() -> None:
    assert parse_servers("tcp://x:1").endpoints == ("tcp://x:1",)
    assert parse_servers(["tcp://x:1", "tcp://y:1"]).endpoints == ("tcp://x:1", "tcp://y:1")
    for wrong in (_Endless(), [1, 2], None, {"tcp://x:1"}):
        with pytest.raises(ConfigError, match="`servers`"):
            parse_servers(wrong)
    assert normalize_device(None) is None and normalize_device("cpu") is None


def test_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist_env(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert dist_env(None, None) == (3, 8)
    assert dist_env(1, None) == (1, 8)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK"):
        dist_env(None, None)


def test_the_request_timeout_is_the_timeout_unless_given() -> None:
    assert _cfg(timeout=8).request_limit == 8.0
    assert _cfg(timeout=8, request_timeout=120).request_limit == 120.0


def test_the_shuffle_is_one_value_and_the_plan_inputs_carry_it_by_the_state_s_names() -> None:
    assert _cfg().shuffle == Shuffle() and _cfg(shuffle=False).shuffle == Shuffle("none")
    with pytest.raises(ConfigError, match="`shuffle_window`"):
        _cfg(shuffle=Shuffle(shuffle_window=0))
    cfg = _cfg(shuffle=Shuffle("block", block_size=4, window=2), seed=3, drop_last=True)
    assert cfg.plan_inputs() == {"seed": 3, "batch_size": 4, "shuffle": "block",
                                 "shuffle_window": Shuffle().shuffle_window, "block_size": 4,
                                 "window": 2, "drop_last": True}


@pytest.mark.parametrize("value", [0, -1, 65, True, 1.5, "2", None])
def test_io_threads_must_be_an_integer_from_1_to_64(value: object) -> None:
    with pytest.raises(ConfigError, match=r"`io_threads` must be an integer in \[1, 64\]\. "
                       r"Found: "):
        _cfg(io_threads=value)


def test_io_threads_default_and_accepted() -> None:
    assert _cfg().io_threads == 1
    assert _cfg(io_threads=64).io_threads == 64
    assert _cfg(io_threads=np.int64(4)).io_threads == 4


def test_shared_memory_slots_are_twice_the_requests_plus_three_of_the_slot_size_in_pages(
        ) -> None:
    """A slot for each request the loader may keep at a server (one per reader, up to the
    credits it asks for) and as many replies plus three held; capped by the wire's limit."""
    assert _cfg().most_requests == _cfg().hello("t").credits == READER_CREDITS
    assert _cfg().shm_geometry == Geometry(2 * READER_CREDITS + 3, 32 * 2**20)
    assert (_cfg(prefetch=2, shared_memory_slot_bytes=5000).shm_geometry
            == Geometry(2 * READER_CREDITS + 3, 8192))
    assert _cfg(prefetch=300).most_requests == _cfg(prefetch=300).hello("t").credits == 300
    assert _cfg(prefetch=300).shm_geometry == Geometry(603, 32 * 2**20)
    assert _cfg(prefetch=5000).shm_geometry == Geometry(MAX_SHM_SLOTS, 32 * 2**20)
    big = 2**31  # slots of 2 GiB: no more than 64 GiB of address space, or 2 x prefetch + 3
    assert _cfg(shared_memory_slot_bytes=big).shm_geometry == Geometry(32, big)
    assert _cfg(prefetch=20, shared_memory_slot_bytes=big).shm_geometry == Geometry(43, big)
    assert _cfg(shared_memory="off").shm_geometry is None
    for slot_bytes in (4096, 5000, 12345, 32 * 2**20 + 1):  # slots on pages of their own
        geo = _cfg(shared_memory_slot_bytes=slot_bytes).shm_geometry
        assert geo.slot_bytes >= slot_bytes
        assert all(geo.offset(k) % 4096 == 0 for k in range(geo.slots + 1))
