"""Decode on the trainer's GPU (nvJPEG through torchvision) against the CPU decode.

Runs only with CUDA and a torchvision whose ``decode_jpeg`` takes a ``device``. nvJPEG and
libjpeg-turbo may round a few pixel values differently, so the GPU images are held to the
Pillow ones within a small mean difference; the crop boxes and flips, which come from the same
seeded draws, must match (a box off by one pixel on these gradients differs by 4-9 levels a
pixel).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import webdataset
from PIL import Image

from dataflow.client import DataLoader, Decode, ImageDecode
from dataflow.client.imaging import load_nvjpeg
from dataflow.errors import DecodeError
from dataflow.server import launch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(isinstance(load_nvjpeg(), str), reason="needs torchvision with GPU decode"),
]

CROP, BATCH = 24, 8
FIELDS = {"jpg": ImageDecode(size=CROP, flip=True, output="image")}


def _shards(out, n: int = 64, bad: int | None = None, equal: bool = False) -> list[str]:
    """Two shards of ``n`` JPEGs of random sizes (``equal``: all 40x48, the batches then
    cropped in one gather), sample ``bad`` cut short."""
    rng = np.random.default_rng(0)
    paths = []
    for s in range(2):
        path = str(out / f"gpu-{s}.tar")
        with webdataset.TarWriter(path) as w:
            for i in range(n // 2):
                sid = s * (n // 2) + i
                h, wd = (40, 48) if equal else (int(v) for v in rng.integers(CROP, 64, 2))
                y, x = np.mgrid[0:h, 0:wd]
                pix = np.stack([(x * 9 + y * 4 + c * 60) % 256 for c in range(3)], -1)
                buf = io.BytesIO()
                # 4:4:4: no chroma upsampling, where nvJPEG and libjpeg-turbo differ most
                Image.fromarray(pix.astype(np.uint8)).save(buf, format="JPEG", quality=95,
                                                           subsampling=0)
                data = buf.getvalue()
                w.write({"__key__": f"{sid:06d}", "jpg": data[:30] if sid == bad else data,
                         "id": str(sid).encode()})
        paths.append(path)
    return paths


@pytest.mark.timeout(120)
@pytest.mark.parametrize("equal", [False, True])
def test_gpu_decode_matches_the_cpu_decode(tmp_path, equal) -> None:
    paths = _shards(tmp_path, equal=equal)
    kw = dict(batch_size=BATCH, rank=0, world_size=1, seed=3, timeout=30)
    with launch(paths, workers=2) as server, \
            DataLoader(server.endpoint, device="cuda", decode=FIELDS, **kw) as gpu, \
            DataLoader(server.endpoint, device="cuda", decode=Decode(FIELDS, backend="pillow"),
                       **kw) as pinned, \
            DataLoader(server.endpoint, decode=FIELDS, **kw) as cpu:
        assert gpu.decode_backend is not None and gpu.decode_backend.startswith("nvjpeg")
        n = 0
        for a, b, c in zip(gpu, pinned, cpu, strict=True):
            doubled = a["image"].float() * 2  # on the consumer stream right away
            torch.cuda.synchronize()
            assert a["image"].is_cuda and a["id"].is_cuda and b["image"].is_cuda
            assert torch.equal(a["id"].cpu(), c["id"]) and torch.equal(b["id"].cpu(), c["id"])
            assert a["image"].shape == c["image"].shape == (BATCH, 3, CROP, CROP)
            assert torch.equal(b["image"].cpu(), c["image"])  # Pillow on a CUDA loader
            diff = (a["image"].cpu().float() - c["image"].float()).abs().mean().item()
            assert diff < 2.0, diff
            assert torch.equal(doubled, a["image"].float() * 2)
            n += 1
        assert n == len(gpu) > 0


@pytest.mark.timeout(120)
def test_gpu_decode_names_a_corrupt_jpeg(tmp_path) -> None:
    paths = _shards(tmp_path, bad=35)  # shard 1, sample 3: batch 4, position 3 unshuffled
    with launch(paths, workers=1) as server, DataLoader(
            server.endpoint, batch_size=BATCH, rank=0, world_size=1, shuffle=False,
            device="cuda", decode=Decode(FIELDS, backend="nvjpeg"), timeout=30) as dl:
        it = iter(dl)
        for _ in range(4):
            next(it)
        with pytest.raises(DecodeError) as e:
            next(it)
    assert (e.value.field, e.value.position, e.value.shard, e.value.sample) == (
        "jpg", 3, "gpu-1.tar", 3)
