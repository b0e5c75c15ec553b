"""A CUDA DataLoader's stall metrics count its batches, their bytes and pending H2D copies."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.server import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.timeout(120)
def test_cuda_batches_are_counted(tmp_path) -> None:
    demo = make_demo(str(tmp_path), DemoSpec(shards=2, samples_per_shard=64), progress=None)
    registry = CollectorRegistry()
    rank = {"rank": "0"}
    with launch(list(demo.paths), workers=2) as server, DataLoader(
            server.endpoint, device="cuda", batch_size=16, rank=0, world_size=1, timeout=30,
            metrics=registry) as dl:
        sizes = [sum(t.nbytes for t in batch.values()) for batch in dl]
        batches = registry.get_sample_value("dataflow_client_batches_total", rank)
        nbytes = registry.get_sample_value("dataflow_client_bytes_total", rank)
        pending = registry.get_sample_value("dataflow_client_h2d_pending_total", rank)
    assert batches == len(sizes) == len(dl) and nbytes == sum(sizes)
    assert pending is not None and 0 <= pending <= batches
