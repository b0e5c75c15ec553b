"""A loader's ZeroMQ context holds more connections than libzmq's default of 1,023 sockets
allows (:func:`dataflow.client.links.context`)."""

from __future__ import annotations

import resource

import pytest
import zmq

from dataflow.client.descriptors import LINK_DESCRIPTORS, reserve
from dataflow.client.links import context

LINKS = 400  # a socket and a monitor each (and libzmq's end of it): past the default's ~340


@pytest.mark.timeout(60)
def test_a_loader_context_opens_hundreds_of_monitored_connections() -> None:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limits[1] != resource.RLIM_INFINITY and limits[1] < LINKS * LINK_DESCRIPTORS + 1024:
        pytest.skip(f"the open-file hard limit {limits[1]} is below what {LINKS} connections "
                    "need")
    ctx = context(1)
    socks: list[zmq.Socket] = []
    try:
        reserve(LINKS)
        for _ in range(LINKS):
            sock = ctx.socket(zmq.DEALER)
            socks += [sock, sock.get_monitor_socket()]
        assert len(socks) == 2 * LINKS
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
