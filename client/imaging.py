"""Image decoders for :mod:`dataflow.client.decode`: Pillow on the CPU, nvJPEG on a GPU.

A :class:`Backend` turns one batch's encoded images (the uint8 values of a bytes field on the
host and its offsets) into a list of decoded ``(3, H, W)`` uint8 RGB tensors, in batch order,
and maps the per-sample crop placement (:func:`dataflow.client.decode.assemble`):

* :class:`PillowBackend` (the CPU fallback, and the only decoder without CUDA + torchvision):
  each image is opened from its slice of the values (one memcpy into Pillow's file object),
  decoded and converted to RGB in a pool of ``threads`` threads (Pillow and torch's copies
  release the GIL). It reads any format Pillow reads.
* :class:`NvjpegBackend`: ``torchvision.io.decode_jpeg(list, device=cuda)``, one batched call
  over views of the values (no copies), on the caller's current CUDA stream (the decode
  stage's own). JPEG only. Runs only with CUDA and a torchvision whose ``decode_jpeg`` takes
  a ``device`` (tested under ``tests/cuda``).

:func:`backend_for` picks one for a ``Decode.backend`` setting.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from dataflow.errors import ConfigError, DecodeError

T = TypeVar("T")
Fail = Callable[[int | None, str], DecodeError]  # sample i (None: the batch), cause


class Backend(Protocol):
    """Decodes the images of one field of one batch.

    Attributes:
        name: ``"pillow"`` or ``"nvjpeg"``.
        reason: why :func:`backend_for` chose it (``"auto: ..."``), for logs and reports.
    """

    name: str
    reason: str

    def decode(self, values: torch.Tensor, offsets: Sequence[int],
               fail: Fail) -> list[torch.Tensor]:
        """Every sample's image, ``(3, H, W)`` uint8 RGB (any strides), in batch order.

        Args:
            values: uint8, 1-D, on the CPU: the samples' bytes back to back.
            offsets: ``n + 1`` ints; sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``.
            fail: the error to raise for sample ``i`` (None: the whole batch), with a cause.

        Raises:
            DecodeError: a sample is not a decodable image (the first in batch order).
        """
        ...

    def map(self, fn: Callable[[int], T], items: Iterable[int]) -> Iterator[T]:
        """``fn`` over ``items``, in order (possibly in threads)."""
        ...

    def close(self) -> None:
        """Release threads (idempotent)."""
        ...


def _pillow_rgb(data: memoryview) -> np.ndarray:
    """Decode one image to an HWC uint8 RGB array."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        return np.array(rgb)  # writable: torch.from_numpy takes it


class PillowBackend:
    """Pillow in a pool of ``threads`` threads (see the module)."""

    name = "pillow"

    def __init__(self, threads: int, reason: str = "pillow") -> None:
        self.reason = reason
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            threads, thread_name_prefix="dataflow-decode") if threads > 1 else None

    def map(self, fn: Callable[[int], T], items: Iterable[int]) -> Iterator[T]:
        return self._pool.map(fn, items) if self._pool is not None else map(fn, items)

    def decode(self, values: torch.Tensor, offsets: Sequence[int],
               fail: Fail) -> list[torch.Tensor]:
        raw = memoryview(values.numpy().data)

        def one(i: int) -> torch.Tensor:
            data = raw[offsets[i] : offsets[i + 1]]
            try:
                hwc = _pillow_rgb(data)
            except Exception as e:
                why = (f"not an image Pillow reads ({len(data)} bytes, starting "
                       f"{bytes(data[:8])!r})" if type(e).__name__ == "UnidentifiedImageError"
                       else str(e))
                raise fail(i, f"{type(e).__name__}: {why}") from e
            return torch.from_numpy(hwc).permute(2, 0, 1)

        return list(self.map(one, range(len(offsets) - 1)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class NvjpegBackend:
    """torchvision's batched ``decode_jpeg`` on ``device`` (see the module).

    Args:
        device: the CUDA device.
        decode_jpeg: ``torchvision.io.decode_jpeg``.
        mode: ``torchvision.io.ImageReadMode.RGB``.
    """

    name = "nvjpeg"

    def __init__(self, device: torch.device, decode_jpeg: Callable[..., Any], mode: Any,
                 reason: str = "nvjpeg") -> None:
        self.reason = reason
        self._device = device
        self._decode_jpeg = decode_jpeg
        self._mode = mode

    def map(self, fn: Callable[[int], T], items: Iterable[int]) -> Iterator[T]:
        return map(fn, items)

    def decode(self, values: torch.Tensor, offsets: Sequence[int],
               fail: Fail) -> list[torch.Tensor]:
        sizes = np.diff(np.asarray(offsets)).tolist()
        datas = list(values[offsets[0] : offsets[-1]].split(sizes)) if sizes else []
        if not datas:
            return []
        try:
            return list(self._decode_jpeg(datas, mode=self._mode, device=self._device))
        except Exception as batch_error:
            # Name the first sample that fails alone; else the batch's own error.
            for i, data in enumerate(datas):
                try:
                    self._decode_jpeg(data, mode=self._mode, device=self._device)
                except Exception as e:
                    raise fail(i, f"{type(e).__name__}: {e}") from e
            raise fail(None, f"the batched decode failed, every image alone did not: "
                             f"{type(batch_error).__name__}: {batch_error}") from batch_error

    def close(self) -> None:
        """Nothing to release."""


def load_nvjpeg() -> tuple[Callable[..., Any], Any] | str:
    """torchvision's ``(decode_jpeg, ImageReadMode.RGB)`` when it loads and ``decode_jpeg``
    takes a ``device``; else why not (a torchvision built for another torch fails to load)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-not-found]
    except Exception as e:  # ModuleNotFoundError, or a torchvision of another torch build
        return f"torchvision does not load ({type(e).__name__}: {e})"
    try:
        params = inspect.signature(decode_jpeg).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "device" not in params:
        return "torchvision's decode_jpeg takes no `device` (torchvision >= 0.19 does)"
    return decode_jpeg, ImageReadMode.RGB


def backend_for(setting: str, device: torch.device | None, threads: int) -> Backend:
    """The decoder for ``Decode.backend`` ``setting`` on a loader delivering to ``device``.

    Raises:
        ConfigError: ``"nvjpeg"`` without a CUDA device, or without a torchvision that
            decodes on one.
    """
    if setting == "pillow":
        return PillowBackend(threads, "pillow (asked for)")
    if device is None:
        if setting == "nvjpeg":
            raise ConfigError("`backend` 'nvjpeg' needs a CUDA `device` for the DataLoader")
        return PillowBackend(threads, "pillow (auto: the loader delivers CPU tensors)")
    found = load_nvjpeg()
    if isinstance(found, str):
        if setting == "nvjpeg":
            raise ConfigError(f"`backend` 'nvjpeg' is not available: {found}")
        return PillowBackend(threads, f"pillow (auto: {found})")
    decode_jpeg, mode = found
    return NvjpegBackend(device, decode_jpeg, mode, f"nvjpeg on {device} ({setting})")
