"""A connection's monitor is polled with the sockets until the connection is up, then apart
from them (:class:`dataflow.client.links.Links`), over real loopback ZeroMQ sockets."""

from __future__ import annotations

import time

import pytest
import zmq

from dataflow.client.links import Links, context


def _wait_change(links: Links, poller: zmq.Poller, watch: bool) -> tuple[int, object, bool]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        events = dict(poller.poll(50))
        for change in links.changes(events, watch):
            return change
    raise AssertionError("no connection change reported within 20 s")


@pytest.mark.timeout(60)
def test_a_monitor_leaves_the_per_batch_poll_once_up_and_returns_when_down() -> None:
    ctx = context(1)
    poller = zmq.Poller()
    server = ctx.socket(zmq.ROUTER)
    endpoint = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
    links = Links(ctx, poller, None, lambda _: endpoint)
    sock = links.open(0, 3, b"rid", endpoint)
    try:
        assert len(poller.sockets) == 2  # the socket and its monitor, awaiting the handshake
        assert _wait_change(links, poller, watch=False) == (0, 3, True)
        assert [s for s, _ in poller.sockets] == [sock]  # the monitor polled apart
        server.close(linger=0)
        assert _wait_change(links, poller, watch=True) == (0, 3, False)
        assert len(poller.sockets) == 2  # down: awaited with the sockets again
    finally:
        links.close(sock, 0)
        server.close(linger=0)
        assert poller.sockets == []
        ctx.term()


@pytest.mark.timeout(60)
def test_each_data_socket_takes_the_io_thread_with_the_fewest_data_sockets() -> None:
    """Data sockets spread over the context's I/O threads (``ZMQ_AFFINITY``), a closed one's
    thread taken next; control sockets are left to libzmq (affinity 0)."""
    ctx = context(3)
    poller = zmq.Poller()
    endpoint = "tcp://127.0.0.1:9"  # never connected: affinity is set before the connect
    links = Links(ctx, poller, None, lambda _: endpoint)
    socks = [links.open(server, reader, b"rid", endpoint)
             for server in range(2) for reader in range(2)]
    control = links.open(0, "control", b"rid", endpoint)
    try:
        assert [s.getsockopt(zmq.AFFINITY) for s in socks] == [1, 2, 4, 1]
        assert control.getsockopt(zmq.AFFINITY) == 0
        links.close(socks[1], 0)
        assert links.open(1, 2, b"rid", endpoint).getsockopt(zmq.AFFINITY) == 2
    finally:
        links.close(control, 0)
        for sock in list(links.data):
            links.close(sock, 0)
        ctx.term()
