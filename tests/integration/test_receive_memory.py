"""A trainer keeps its freed receive buffers (``DataLoader(tune_malloc=True)``, the default):
checked in fresh trainer processes, by the page faults of memory freed the way ZeroMQ's I/O
thread frees received batches (:mod:`dataflow.heap`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from heapfaults import RECEIVING_THREAD

TRAINER = """
import json, sys
from dataflow.client import DataLoader

with DataLoader(sys.argv[1], batch_size=8, rank=0, world_size=1, shuffle=False, timeout=30,
                tune_malloc=sys.argv[2] == "on") as loader:
    ids = [i for batch in loader for i in batch["id"].tolist()]
""" + RECEIVING_THREAD + """
print(json.dumps({"ids": ids, "faults": faults}))
"""


def _trainer(endpoint: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", TRAINER, endpoint, mode], capture_output=True,
                         text=True, timeout=90, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_loader_keeps_its_processs_freed_receive_memory(demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths])
    on, off = _trainer(server.endpoint, "on"), _trainer(server.endpoint, "off")
    assert sorted(on["ids"]) == sorted(off["ids"]) == list(range(demo.total))
    # Without the setting a thread's emptied heaps are unmapped and fault in again (more than
    # 8 faults even with transparent huge pages); with it they stay mapped.
    assert min(off["faults"][1:]) > 8 >= max(on["faults"][1:])
