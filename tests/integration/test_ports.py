"""Fixed ports (``--data-ports``): the readers listen where they are told, a reader that dies is
replaced on its port, a port taken stops the start naming it, and a client that cannot reach the
readers' data ports (only the control port published, as ``docker run -p 5555:5555``) says so."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from srvtools import Forwarder, free_ports, scrape, wait_for

from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable
from dataflow.server import launch


def _epoch_ids(endpoint: str) -> list[int]:
    with DataLoader(endpoint, batch_size=16, rank=0, world_size=1, timeout=30) as dl:
        return [i for batch in dl for i in batch["id"].tolist()]


@pytest.mark.timeout(90)
def test_readers_listen_on_the_data_ports_and_a_replacement_keeps_its_port(demo_data,
                                                                           servers) -> None:
    demo = demo_data("arrow")
    first = free_ports(3)
    server = servers([str(p) for p in demo.paths], workers=2, bind=f"tcp://127.0.0.1:{first}",
                     extra_args=["--data-ports", str(first + 1), "--metrics-port", "0"])
    assert server.endpoint == f"tcp://127.0.0.1:{first}"
    assert server.ready["data_endpoints"] == [f"tcp://127.0.0.1:{first + 1}",
                                              f"tcp://127.0.0.1:{first + 2}"]
    ids = _epoch_ids(server.endpoint)
    assert sorted(ids) == list(range(sum(demo.sizes)))

    os.kill(server.ready["worker_pids"][1], signal.SIGKILL)
    wait_for(lambda: scrape(server.ready["metrics_port"])[
        ("dataflow_worker_restarts_total", ())] == 1, 30, "the reader's replacement")
    ids = _epoch_ids(server.endpoint)
    assert sorted(ids) == list(range(sum(demo.sizes)))
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("127.0.0.1", first + 2))  # the replacement listens there again


@pytest.mark.timeout(60)
def test_a_taken_data_port_stops_the_start_naming_it(demo_data) -> None:
    demo = demo_data("arrow")
    first = free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))
        taken.listen()
        with pytest.raises(ServerUnavailable) as info:
            launch([str(p) for p in demo.paths], workers=2, timeout=60,
                   bind=f"tcp://127.0.0.1:{first}", extra_args=["--data-ports", str(first + 1)])
    assert (f"ServerStartError: --data-ports (reader 1): port {first + 2} on 127.0.0.1 is taken"
            in str(info.value))


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) to publish a port on")
def test_a_client_that_cannot_reach_the_data_ports_names_them(demo_data, servers) -> None:
    """A server in a container with only its control port published: the client reaches the
    server through the published port (here ``[::1]:P`` forwarded to the server's IPv4 port)
    and its INDEX, but not the readers' data ports at that host (nothing listens on ``::1``
    there); the error names each data endpoint it could not reach, and why that usually is. The
    server listens on 0.0.0.0 (as in a container) on fixed ports, for the seconds of the test."""
    demo = demo_data("arrow")
    first = free_ports(3, "0.0.0.0")
    server = servers([str(p) for p in demo.paths], workers=2, bind=f"tcp://0.0.0.0:{first}",
                     extra_args=["--data-ports", str(first + 1)])
    with Forwarder(("::1", 0), ("127.0.0.1", first), socket.AF_INET6) as published:
        with pytest.raises(ServerUnavailable) as info:
            DataLoader(f"tcp://[::1]:{published.port}", batch_size=16, rank=0, world_size=1,
                       timeout=3)
    said = str(info.value)
    assert (f"INDEX received, no answer yet on 2 of 2 reader data endpoint(s) "
            f"tcp://[::1]:{first + 1}, tcp://[::1]:{first + 2}: unreachable from this host?"
            in said), said
    assert "--data-ports" in said
    assert sorted(_epoch_ids(server.endpoint.replace("0.0.0.0", "127.0.0.1"))) == list(
        range(sum(demo.sizes)))
