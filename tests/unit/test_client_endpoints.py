"""Reader data endpoints advertised with a wildcard host are reached at the server's host."""

import pytest

from dataflow.client.handshake import reachable


@pytest.mark.parametrize(
    "advertised, server, expected",
    [
        ("tcp://0.0.0.0:4001", "tcp://loader-b:5555", "tcp://loader-b:4001"),
        ("tcp://*:4001", "tcp://loader-a:5555", "tcp://loader-a:4001"),
        ("tcp://[::]:4001", "tcp://[fe80::1]:5555", "tcp://[fe80::1]:4001"),
        ("tcp://127.0.0.1:4001", "tcp://localhost:5555", "tcp://127.0.0.1:4001"),
        ("ipc:///tmp/x.w0", "ipc:///tmp/x", "ipc:///tmp/x.w0"),
    ],
)
def test_reachable(advertised: str, server: str, expected: str) -> None:
    assert reachable(advertised, server) == expected
