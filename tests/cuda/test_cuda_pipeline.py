"""The overlapped CUDA pipeline yields the same tensors as a fully synchronized one."""

from __future__ import annotations

import pytest
import torch

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.server import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.timeout(120)
def test_overlapped_equals_synchronized(tmp_path) -> None:
    demo = make_demo(str(tmp_path), DemoSpec(shards=4, samples_per_shard=64), progress=None)
    with launch(list(demo.paths), workers=2) as server:
        kw = dict(batch_size=16, rank=0, world_size=1, seed=1, timeout=30)
        with DataLoader(server.endpoint, device="cuda", **kw) as fast, \
                DataLoader(server.endpoint, **kw) as slow:
            n = 0
            for a, b in zip(fast, slow, strict=True):
                # Work on the consumer stream right away: it must see the finished copy.
                doubled = {k: v * 2 for k, v in a.items() if v.dtype != torch.bool}
                ref = {k: v.cuda() for k, v in b.items()}
                torch.cuda.synchronize()
                assert a.keys() == ref.keys()
                for k, v in a.items():
                    assert v.is_cuda and torch.equal(v, ref[k]), k
                    if k in doubled:
                        assert torch.equal(doubled[k], ref[k] * 2), k
                n += 1
            assert n == len(fast) > 0
