"""DataLoader configuration validation and the distributed-environment defaults."""

from __future__ import annotations

import pytest
import torch

from dataflow import wire
from dataflow.client.buffers import HostSink, typed_views
from dataflow.client.config import LoaderConfig, dist_env, normalize_device
from dataflow.client.discovery import parse_servers
from dataflow.errors import ConfigError


def _cfg(**kw) -> LoaderConfig:
    base = dict(servers=parse_servers("tcp://127.0.0.1:5555"), batch_size=4, rank=0, world_size=1)
    return LoaderConfig(**{**base, **kw})


@pytest.mark.parametrize("kw, field", [
    (dict(batch_size=0), "batch_size"),
    (dict(rank=2, world_size=2), "rank"),
    (dict(world_size=0), "world_size"),
    (dict(prefetch=0), "prefetch"),
    (dict(timeout=0), "timeout"),
    (dict(grace=-1), "grace"),
    (dict(grace=float("inf")), "grace"),
    (dict(grace="10"), "grace"),
    (dict(grace=True), "grace"),
    (dict(seed=-1), "seed"),
    (dict(shuffle="random"), "shuffle"),
    (dict(shuffle_window=0), "shuffle_window"),
    (dict(servers=("tcp://a:1",)), "servers"),
    (dict(resolve_interval=0), "resolve_interval"),
    (dict(resolve_interval=True), "resolve_interval"),
    (dict(resolve_interval=float("inf")), "resolve_interval"),
])
def test_config_rejects(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"`{field}`"):
        _cfg(**kw)


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


def test_host_sink_views_are_typed_and_fresh() -> None:
    specs = (wire.ArraySpec("a", "int64", (3,)), wire.ArraySpec("b", "bool", (3, 2)),
             wire.ArraySpec("c", "float16", (3,)))
    msg = wire.BatchMsg(1, 3, specs)
    layout = wire.BatchLayout.of(msg)
    assert all(o % wire.ALIGN == 0 for o in layout.offsets) and layout.nbytes >= 24 + 6 + 6
    sink = HostSink(pin=False)
    one, two = sink.land(layout), sink.land(layout)
    assert one.array.ctypes.data != two.array.ctypes.data
    one.array[:] = 0
    views = typed_views(one.host, specs, one.offsets)
    assert views["a"].dtype == torch.int64 and views["a"].shape == (3,)
    assert views["b"].dtype == torch.bool and views["b"].shape == (3, 2)
    assert views["c"].dtype == torch.float16


def test_host_pool_reuses_a_buffer_only_after_its_batch_is_gone() -> None:
    specs = (wire.ArraySpec("x", "uint8", (4, 100_000)),)
    sink = HostSink(pin=False, pool_capacity=2)
    msg = wire.BatchMsg(1, 4, specs)
    layout = wire.BatchLayout.of(msg)
    first = sink.finish(sink.land(layout), msg).tensors["x"]
    first.fill_(7)
    second = sink.finish(sink.land(layout), msg).tensors["x"]
    assert first.data_ptr() != second.data_ptr()
    assert sink.pool.idle == 0
    address = first.data_ptr()
    del first
    assert sink.pool.idle == 1
    third = sink.finish(sink.land(layout), msg).tensors["x"]
    assert third.data_ptr() == address
    assert sink.pool.idle == 0
    del second, third
    assert sink.pool.idle == 2
