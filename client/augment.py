"""Seeded crops and horizontal flips of decoded images, reproducible like server transforms.

The draws of a batch are a pure function of (the loader's ``seed``, epoch, global batch index,
field name), the inputs of a server transform's :func:`dataflow.transform.batch_seed`, so a
resumed run, a failover re-request or another number of ranks crops and flips every sample of
a global batch the same way. The field name keys an independent stream (two decoded fields of
one batch, or a server transform drawing from the same batch seed, never share draws)::

    rng = Generator(PCG64(SeedSequence(batch_seed(seed, epoch, batch), spawn_key=(crc32(field),))))
    u = rng.random((n, 3))        # sample i draws row u[i], whatever n or the image sizes

Sample ``i`` of height ``H`` and width ``W`` cropped to ``(h, w)``: ``top = floor(u[i, 0] *
(H - h + 1))`` and ``left = floor(u[i, 1] * (W - w + 1))`` for a random crop, ``(H - h) // 2``
and ``(W - w) // 2`` for a center crop; flipped left-right when ``u[i, 2] < 0.5`` (and flips
are on). Computed on the host (numpy), so the CPU and GPU decoders crop alike.

:func:`place` crops, flips and writes one CHW image into its slot of the batch: with torch ops
on a GPU, through numpy views on the CPU; :func:`place_all` crops a whole batch of equal-size
images in one gather (the GPU path: a few kernel launches a batch instead of two or three a
sample). The CPU suite tests every one on CPU tensors.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dataflow.transform import batch_seed


class Box(NamedTuple):
    """Where sample ``i``'s crop lies in its image, and whether it is flipped left-right."""

    top: int
    left: int
    flip: bool


def draws(seed: int, epoch: int, batch: int, field: str, n: int) -> np.ndarray:
    """The uniform draws of ``n`` samples of global batch ``batch`` of ``epoch`` for ``field``.

    Returns:
        float64 of shape ``(n, 3)`` in ``[0, 1)``; row ``i`` is sample ``i``'s, the same for
        any ``n > i``.
    """
    entropy = batch_seed(seed, epoch, batch)
    key = zlib.crc32(field.encode("utf-8"))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(key,))))
    return rng.random((n, 3))


def box(u: np.ndarray, height: int, width: int, size: tuple[int, int] | None, crop: str,
        flip: bool) -> Box:
    """Sample's crop box from its draws ``u`` (a row of :func:`draws`), see the module.

    Args:
        u: the sample's 3 draws.
        height: the decoded image's height.
        width: its width.
        size: the crop's ``(height, width)``; None: the whole image.
        crop: ``"random"`` or ``"center"``.
        flip: flips are on.

    Raises:
        ValueError: the image is smaller than ``size`` (the caller names the sample).
    """
    h, w = (height, width) if size is None else size
    if h > height or w > width:
        raise ValueError(f"the image is {height}x{width} (height x width), smaller than the "
                         f"crop {h}x{w}")
    if crop == "center":
        top, left = (height - h) // 2, (width - w) // 2
    else:
        top, left = int(u[0] * (height - h + 1)), int(u[1] * (width - w + 1))
    return Box(top, left, bool(flip and u[2] < 0.5))


def place(dst: torch.Tensor, image: torch.Tensor, where: Box) -> None:
    """Write ``image``'s crop at ``where`` into ``dst``, flipped left-right if it says so.

    CPU tensors are copied through numpy views (:func:`place_numpy`): torch's copy of a strided
    uint8 tensor spreads over its intra-op threads, which, called from the CPU decoder's pool
    threads, oversubscribes the cores (measured 5x slower on 2 cores). Other devices use torch
    ops (:func:`place_torch`).

    Args:
        dst: ``(C, h, w)``, the sample's slot of the batch.
        image: ``(C, H, W)`` (any strides: a CHW view of an HWC array is fine), on ``dst``'s
            device.
    """
    if dst.device.type == "cpu":
        place_numpy(dst.numpy(), image.numpy(), where)
    else:
        place_torch(dst, image, where)


def place_torch(dst: torch.Tensor, image: torch.Tensor, where: Box) -> None:
    """:func:`place` with torch ops (any device)."""
    h, w = dst.shape[-2:]
    part = image[:, where.top : where.top + h, where.left : where.left + w]
    dst.copy_(part.flip(-1) if where.flip else part)


def place_all(images: torch.Tensor, boxes: Sequence[Box], size: tuple[int, int]) -> torch.Tensor:
    """Every image's crop at its box, flipped where it says so, as one batch: :func:`place`
    of each image into its slot, in one gather on the images' device.

    Args:
        images: ``(n, C, H, W)``, equal-size images.
        boxes: ``n`` boxes, each within ``(H, W)`` for a crop of ``size``.
        size: the crop's ``(height, width)``.

    Returns:
        ``(n, C, h, w)``, contiguous, on the images' device.
    """
    n, c, height, width = images.shape
    h, w = size
    device = images.device
    where = torch.tensor([tuple(b) for b in boxes], dtype=torch.int64).reshape(n, 3).to(device)
    rows = where[:, :1] + torch.arange(h, device=device)
    cols = torch.arange(w, device=device)
    cols = torch.where(where[:, 2:].bool(), w - 1 - cols, cols) + where[:, 1:2]
    index = (rows[:, :, None] * width + cols[:, None, :]).reshape(n, 1, h * w)
    flat = images.reshape(n, c, height * width)
    return flat.gather(2, index.expand(n, c, h * w)).reshape(n, c, h, w)


def place_numpy(dst: np.ndarray, image: np.ndarray, where: Box) -> None:
    """:func:`place` on numpy arrays (a flip is a negative-stride view, copied once)."""
    h, w = dst.shape[-2:]
    part = image[:, where.top : where.top + h, where.left : where.left + w]
    np.copyto(dst, part[:, :, ::-1] if where.flip else part)
