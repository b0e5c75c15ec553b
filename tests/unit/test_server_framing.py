"""The server's sends: a multipart message goes whole or not at all."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import zmq

from dataflow.server.framing import NOBLOCK, SendResult, recv_parts, send_parts, try_send


@pytest.fixture
def pair():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        name = f"inproc://test-framing-{uuid.uuid4().hex}"  # a closed socket's name lingers
        a.bind(name)
        b.connect(name)
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)


def test_every_kind_of_buffer_goes_as_one_message_in_order(pair) -> None:
    a, b = pair
    big = np.arange(100_000, dtype=np.uint8)  # above pyzmq's zero-copy threshold
    send_parts(a, [b"head", memoryview(b"mid"), zmq.Frame(b"frame"), big], copy=False)
    send_parts(a, [b"alone"], NOBLOCK)
    got = recv_parts(b)
    assert got[:3] == [b"head", b"mid", b"frame"] and got[3] == big.tobytes()
    assert recv_parts(b, NOBLOCK) == [b"alone"]
    with pytest.raises(zmq.Again):
        recv_parts(b, NOBLOCK)


def test_a_frame_that_is_no_buffer_sends_nothing(pair) -> None:
    a, b = pair
    with pytest.raises(TypeError):
        send_parts(a, [b"head", "text is no buffer", b"tail"])
    send_parts(a, [b"next", b"message"])
    assert b.recv_multipart() == [b"next", b"message"]  # no half message before it


def test_try_send_to_a_peer_not_connected_is_gone() -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind(f"inproc://test-framing-{uuid.uuid4().hex}")
        assert try_send(router, b"nobody", [b"x"]) is SendResult.GONE
    finally:
        router.close(linger=0)
