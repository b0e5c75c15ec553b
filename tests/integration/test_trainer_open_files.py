"""A loader raises the trainer's soft open-file limit as far as its connections need: under
a limit too low for a server's reader connections, an epoch is served whole."""

from __future__ import annotations

import os
import resource

import pytest

from dataflow.client import DataLoader


@pytest.mark.timeout(120)
def test_a_loader_makes_room_for_its_connections_under_a_low_soft_limit(demo_data,
                                                                        servers) -> None:
    demo = demo_data("tar")
    server = servers([str(p) for p in demo.paths], workers=8)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Room for the loader's own sockets and threads, not for 8 reader connections (~35).
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 24, hard))
    try:
        with DataLoader(server.endpoint, batch_size=32, rank=0, world_size=1,
                        timeout=60) as loader:
            ids = [i for batch in loader for i in batch["id"].tolist()]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sorted(ids) == list(range(demo.total))
