"""The session handshake as a pure state machine: INDEX per server, HEARTBEAT per reader."""

from __future__ import annotations

import pytest

from dataflow import wire
from dataflow.client.handshake import Handshake, Join
from dataflow.errors import DatasetMismatchError, ProtocolError, RemoteError, ServerUnavailable
from dataflow.index import DatasetIndex

EPS = ["tcp://a:1", "tcp://0.0.0.0:2"]


def _index(data: tuple[str, ...], credits: int = 3) -> wire.Index:
    return wire.Index(credits, len(data), "{}", "tok", data)


def test_done_after_every_index_and_every_reader() -> None:
    hs = Handshake(EPS, deadline=10.0, timeout=10.0)
    assert hs.on_control(0, _index(("tcp://a:7", "tcp://a:8"))) == ["tcp://a:7", "tcp://a:8"]
    assert hs.on_control(1, _index(("tcp://0.0.0.0:9",))) == ["tcp://0.0.0.0:9"]
    hs.on_data(0, 1, wire.Heartbeat())
    hs.on_data(1, 0, wire.Heartbeat())
    assert not hs.done
    hs.on_data(0, 0, wire.Heartbeat())
    assert hs.done and [i.data for i in hs.indexes] == [("tcp://a:7", "tcp://a:8"),
                                                        ("tcp://0.0.0.0:9",)]


def test_wildcard_reader_endpoints_are_reached_at_the_server_host() -> None:
    hs = Handshake(["tcp://loader-b:5555"], deadline=1.0, timeout=1.0)
    assert hs.on_control(0, _index(("tcp://0.0.0.0:4001",))) == ["tcp://loader-b:4001"]


def test_errors_and_unexpected_messages() -> None:
    hs = Handshake(EPS, deadline=10.0, timeout=10.0)
    with pytest.raises(RemoteError, match="tcp://a:1.*full"):
        hs.on_control(0, wire.ErrorMsg(-1, wire.ErrorKind.PROTOCOL, "full"))
    with pytest.raises(ProtocolError, match="expected INDEX, got HEARTBEAT"):
        hs.on_control(0, wire.Heartbeat())
    with pytest.raises(ProtocolError, match="no reader data endpoints"):
        hs.on_control(0, _index(()))
    hs.on_control(0, _index(("tcp://a:7",)))
    with pytest.raises(ProtocolError, match="second INDEX"):
        hs.on_control(0, _index(("tcp://a:7",)))
    with pytest.raises(ProtocolError, match="expected HEARTBEAT"):
        hs.on_data(0, 3, wire.Heartbeat())
    with pytest.raises(ProtocolError, match="not finished"):
        _ = hs.indexes


def test_deadline_names_the_silent_servers_then_the_silent_readers() -> None:
    hs = Handshake(EPS, deadline=10.0, timeout=10.0)
    hs.on_control(0, _index(("tcp://a:7",)))
    hs.check(9.9)
    assert hs.left(9.0) == pytest.approx(1.0)
    with pytest.raises(ServerUnavailable, match=r"tcp://0.0.0.0:2: no answer to HELLO"):
        hs.check(10.0)
    hs.on_control(1, _index(("tcp://b:7",)))
    hs.on_data(1, 0, wire.Heartbeat())
    with pytest.raises(ServerUnavailable, match=r"tcp://a:1: 1 reader data connection"):
        hs.check(10.0)
    hs.on_data(0, 0, wire.Heartbeat())
    hs.check(99.0)
    assert hs.left(99.0) == 0.0


def _dataset(sizes: tuple[int, ...]) -> DatasetIndex:
    return DatasetIndex(tuple(f"s{i}" for i in range(len(sizes))), sizes, (),
                        tuple(f"id{i}" for i in range(len(sizes))))


def test_join_again_needs_the_same_dataset() -> None:
    same, other = _dataset((3, 4)), _dataset((3, 5))
    assert same.fingerprint != other.fingerprint
    join = Join("tcp://a:1", fingerprint=same.fingerprint)
    good = wire.Index(2, 1, same.to_json(), "tok", ("tcp://0.0.0.0:7",))
    assert join.on_control(good) == ["tcp://a:7"] and not join.done
    join.on_data(0, wire.Heartbeat())
    assert join.done and join.index == good
    bad = wire.Index(2, 1, other.to_json(), "tok", ("tcp://a:7",))
    with pytest.raises(DatasetMismatchError, match=f"tcp://a:1 now serves dataset "
                                                   f"{other.fingerprint}"):
        Join("tcp://a:1", fingerprint=same.fingerprint).on_control(bad)
    first = Join("tcp://a:1")  # the first handshake: the DataLoader compares datasets itself
    first.on_control(bad)
    with pytest.raises(RemoteError, match="ServerBusy"):
        Join("tcp://a:1").on_control(wire.ErrorMsg(-1, wire.ErrorKind.SERVER_BUSY, "full"))
