"""The session handshake with one server as a pure state machine: INDEX, then a HEARTBEAT
answered on every reader connection; benign messages before it; the dataset it must serve."""

from __future__ import annotations

import pytest

from dataflow import wire
from dataflow.client.handshake import Join
from dataflow.errors import DatasetMismatchError, ProtocolError, RemoteError
from dataflow.index import DatasetIndex


def _dataset(sizes: tuple[int, ...] = (3, 4)) -> DatasetIndex:
    return DatasetIndex(tuple(f"s{i}" for i in range(len(sizes))), sizes, (),
                        tuple(f"id{i}" for i in range(len(sizes))))


def _index(data: tuple[str, ...], credits: int = 3, session: str = "tok",
           dataset: DatasetIndex | None = None) -> wire.Index:
    return wire.Index(credits, len(data), (dataset or _dataset()).to_json(), session, data)


def test_done_after_the_index_and_every_reader() -> None:
    join = Join("tcp://a:1")
    assert join.on_control(_index(("tcp://a:7", "tcp://a:8"))) == ["tcp://a:7", "tcp://a:8"]
    join.on_data(1, wire.Heartbeat())
    assert not join.done
    join.on_data(0, wire.Heartbeat())
    assert join.done and join.index is not None and join.index.credits == 3
    assert join.fingerprint == _dataset().fingerprint


def test_the_wait_names_the_reader_endpoints_not_answered_yet() -> None:
    """What a join that never finishes says (a server in a container whose data ports are not
    published): every reader endpoint still silent, as this client connects to it."""
    join = Join("tcp://127.0.0.1:5555")
    assert join.unanswered() == "HELLO sent, no INDEX yet"
    join.on_control(_index(("tcp://0.0.0.0:5556", "tcp://0.0.0.0:5557")))
    said = join.unanswered()
    assert "no answer yet on 2 of 2 reader data endpoint(s) tcp://127.0.0.1:5556, " \
           "tcp://127.0.0.1:5557: unreachable from this host?" in said
    assert "--data-ports" in said
    join.on_data(0, wire.Heartbeat())
    assert "1 of 2 reader data endpoint(s) tcp://127.0.0.1:5557:" in join.unanswered()
    join.on_data(1, wire.Heartbeat())
    assert join.unanswered() == "INDEX received, every reader connection answered"


def test_wildcard_reader_endpoints_are_reached_at_the_server_host() -> None:
    join = Join("tcp://loader-b:5555")
    assert join.on_control(_index(("tcp://0.0.0.0:4001",))) == ["tcp://loader-b:4001"]


def test_a_probe_or_the_same_session_s_index_again_is_benign() -> None:
    """A server probes a silent session with a HEARTBEAT (after --client-ttl); a HELLO sent
    again (a join given up, then tried again) is answered with the same session's INDEX."""
    join = Join("tcp://a:1")
    assert join.on_control(wire.Heartbeat()) == []
    assert join.on_control(_index(("tcp://a:7",))) == ["tcp://a:7"]
    assert join.on_control(wire.Heartbeat()) == []
    assert join.on_control(_index(("tcp://a:7",))) == []
    join.on_data(0, wire.Heartbeat())
    assert join.done


def test_errors_and_unexpected_messages() -> None:
    join = Join("tcp://a:1")
    with pytest.raises(RemoteError, match="tcp://a:1: ServerBusy: full") as info:
        join.on_control(wire.ErrorMsg(-1, wire.ErrorKind.SERVER_BUSY, "full"))
    assert info.value.kind is wire.ErrorKind.SERVER_BUSY and info.value.remote_message == "full"
    with pytest.raises(ProtocolError, match="tcp://a:1: expected INDEX, got STATS_REPLY"):
        join.on_control(wire.StatsReply({}))
    with pytest.raises(ProtocolError, match="no reader data endpoints"):
        join.on_control(_index(()))
    with pytest.raises(ProtocolError, match="tcp://a:1: INDEX carries no valid dataset index"):
        join.on_control(wire.Index(1, 1, "{}", "tok", ("tcp://a:7",)))
    join.on_control(_index(("tcp://a:7",)))
    with pytest.raises(ProtocolError, match="second INDEX"):
        join.on_control(_index(("tcp://a:7",), session="other"))
    with pytest.raises(ProtocolError, match="expected HEARTBEAT"):
        join.on_data(3, wire.Heartbeat())
    with pytest.raises(RemoteError, match="ReadFailed"):
        join.on_data(0, wire.ErrorMsg(-1, wire.ErrorKind.READ_FAILED, "x"))


def test_a_join_after_the_first_needs_the_same_dataset() -> None:
    same, other = _dataset((3, 4)), _dataset((3, 5))
    assert same.fingerprint != other.fingerprint
    join = Join("tcp://a:1", fingerprint=same.fingerprint)
    assert join.on_control(_index(("tcp://0.0.0.0:7",), dataset=same)) == ["tcp://a:7"]
    with pytest.raises(DatasetMismatchError, match=f"tcp://a:1 serves dataset "
                                                   f"{other.fingerprint}, not "
                                                   f"{same.fingerprint}"):
        Join("tcp://a:1", fingerprint=same.fingerprint).on_control(
            _index(("tcp://a:7",), dataset=other))
    first = Join("tcp://a:1")  # the first join decides the dataset
    first.on_control(_index(("tcp://a:7",), dataset=other))
    assert first.fingerprint == other.fingerprint
