"""Same-host shared memory on a GPU: the segment is registered with ``cudaHostRegister``, CUDA
batches are copied to the device from their slot in place, pinned CPU batches are views of it;
every batch equals the one TCP frames bring."""

from __future__ import annotations

import pytest
import torch

from dataflow.client import DataLoader
from dataflow.client.shmring import cuda_register
from dataflow.demo import DemoSpec, make_demo
from dataflow.server import launch
from dataflow.shm import Geometry, Segment

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_segment_registers_and_unregisters() -> None:
    seg = Segment(Geometry(2, 1 << 20))
    try:
        unregister = cuda_register(seg.buf)
        assert unregister is not None
        unregister()
    finally:
        seg.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", ["cuda", None])
def test_shared_memory_batches_equal_tcp_batches(device, tmp_path) -> None:
    demo = make_demo(str(tmp_path), DemoSpec(shards=4, samples_per_shard=64), progress=None)
    with launch(list(demo.paths), workers=2) as server:
        kw = dict(batch_size=16, rank=0, world_size=1, seed=1, timeout=30, device=device,
                  pin_memory=True, read_ahead=False)  # every batch received is delivered
        with DataLoader(server.endpoint, **kw) as shm, \
                DataLoader(server.endpoint, shared_memory="off", **kw) as tcp:
            n = 0
            for a, b in zip(shm, tcp, strict=True):
                doubled = {k: v * 2 for k, v in a.items() if v.dtype != torch.bool}
                torch.cuda.synchronize()
                assert a.keys() == b.keys()
                for k, v in a.items():
                    assert v.is_cuda == (device == "cuda") and torch.equal(v, b[k]), k
                    if device is None:
                        assert v.is_pinned(), k
                    if k in doubled:
                        assert torch.equal(doubled[k], b[k] * 2), k
                n += 1
            assert n == len(shm) > 0
            stats = shm.stats()
            assert stats["shm_sessions"] == 1 and stats["shm_batches"] == stats["delivered"]
