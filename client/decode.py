"""Decoding encoded images on the trainer, per field: the DataLoader's ``decode`` setting.

A field of encoded images (JPEG bytes: a variable-length bytes field, ``batch[f]`` the values
and ``batch[f + ".offsets"]``) is shipped as bytes, about 7x smaller than its pixels, and
decoded by the trainer into uint8 images of shape ``(batch, 3, height, width)`` (RGB, CHW):

    DataLoader(..., decode={"jpg": ImageDecode(size=224, crop="random", flip=True)})

* :class:`ImageDecode`: what one field becomes (crop size, random or center crop, flips, the
  output field's name).
* :class:`Decode`: every decoded field, the decoder (``backend``) and the CPU decoder's
  threads; a plain mapping stands for ``Decode(fields)``.
* :class:`BatchDecoder`: the stage a DataLoader runs on each batch before the batch is
  yielded (and counted as consumed): it checks the fields, decodes every sample with a backend
  of :mod:`dataflow.client.imaging` (nvJPEG on the loader's device, or Pillow on the CPU),
  crops and flips with :mod:`dataflow.client.augment`'s seeded draws, and with a CUDA device
  issues every copy on its own CUDA stream, which the consumer's stream waits for. While the
  consumer holds a batch, the next one, when it has arrived, is decoded ahead on the stage's
  own thread (:meth:`BatchDecoder.ahead`): the consumer's next batch is then ready or nearly,
  and the decode (torchvision's holds a process-wide lock and the calling thread's CPU) runs
  beside the consumer's work instead of after it. A batch decoded ahead is the same as one
  decoded at its turn (same rows, tag and draws), and its error is raised at its turn.

Errors are :class:`~dataflow.errors.DecodeError`, naming the field, the sample's position in
the batch, the batch (epoch, global batch index) and the sample's shard; never a skip.
"""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dataflow.checks import check_int
from dataflow.client.augment import box, draws, place, place_all
from dataflow.client.imaging import Backend, backend_for
from dataflow.errors import ConfigError, DecodeError
from dataflow.wire import BatchTag

CROPS = ("random", "center")
BACKENDS = ("auto", "pillow", "nvjpeg")
MAX_THREADS = 64
DEFAULT_THREADS = 8
HELD_BATCHES = 3  # host inputs kept alive behind the decode stream (see BatchDecoder)

# A decoded batch, and on a CUDA device the event of its copies (see BatchDecoder._prepare).
Prepared = tuple[dict[str, torch.Tensor], "torch.cuda.Event | None"]


def _size(value: object) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, tuple | list) and len(value) == 2:
        return (check_int("size[0] (height)", value[0], 1),
                check_int("size[1] (width)", value[1], 1))
    if isinstance(value, tuple | list):
        raise ConfigError(f"`size` must be an int or a (height, width) pair. Found: {value!r}")
    n = check_int("size", value, 1)
    return (n, n)


@dataclass(frozen=True)
class ImageDecode:
    """How the trainer decodes one field of encoded images.

    Attributes:
        size: the crop, ``(height, width)`` or one int for a square; None: whole images (every
            image of a batch must then have the same size). An image smaller than the crop
            is an error.
        crop: ``"random"`` (seeded per batch, :mod:`dataflow.client.augment`) or
            ``"center"``; only with ``size``.
        flip: flip each image left-right with probability 1/2 (seeded the same way).
        output: the name of the decoded images in the batch; None: the encoded field's own
            name (its ``.offsets`` is removed either way).
    """

    size: int | tuple[int, int] | None = None
    crop: str = "random"
    flip: bool = False
    output: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size(self.size))
        if self.crop not in CROPS:
            raise ConfigError(f"`crop` must be one of {CROPS}. Found: {self.crop!r}")
        if self.crop != "random" and self.size is None:
            raise ConfigError(f"`crop` {self.crop!r} needs a `size`")
        if not isinstance(self.flip, bool):
            raise ConfigError(f"`flip` must be True or False. Found: {self.flip!r}")
        if self.output is not None and (not isinstance(self.output, str) or not self.output
                                        or self.output.endswith(".offsets")):
            raise ConfigError("`output` must be None or a field name (not ending in "
                              f"'.offsets'). Found: {self.output!r}")

    @property
    def crop_size(self) -> tuple[int, int] | None:
        """``size`` as ``(height, width)`` (normalized on construction)."""
        return self.size  # type: ignore[return-value]


def _threads() -> int:
    """The CPUs this process may use, at most :data:`DEFAULT_THREADS`."""
    usable = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    return max(1, min(DEFAULT_THREADS, usable))


@dataclass(frozen=True)
class Decode:
    """Every field a DataLoader decodes, and how.

    Attributes:
        fields: encoded field name -> :class:`ImageDecode` (a mapping; stored as sorted pairs).
        backend: ``"auto"`` (nvJPEG through torchvision on the loader's CUDA device when
            torchvision loads and its ``decode_jpeg`` takes a ``device``, else Pillow on the
            CPU), ``"pillow"`` or ``"nvjpeg"`` (refused without a CUDA device and such a
            torchvision).
        threads: the CPU decoder's threads (Pillow releases the GIL while it decodes); None:
            the CPUs this process may use, at most 8.
    """

    fields: Mapping[str, ImageDecode] | tuple[tuple[str, ImageDecode], ...]
    backend: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        items = self.fields.items() if isinstance(self.fields, Mapping) else None
        if items is None:
            raise ConfigError("`decode` fields must be a mapping of field name -> ImageDecode. "
                              f"Found: {self.fields!r}")
        pairs = tuple(sorted(items))
        if not pairs:
            raise ConfigError("`decode` must name at least one field")
        for name, spec in pairs:
            if not isinstance(name, str) or not name or name.endswith(".offsets"):
                raise ConfigError(f"`decode` keys must be field names. Found: {name!r}")
            if not isinstance(spec, ImageDecode):
                raise ConfigError(f"`decode[{name!r}]` must be an ImageDecode. Found: {spec!r}")
        outputs = [spec.output or name for name, spec in pairs]
        twice = sorted({o for o in outputs if outputs.count(o) > 1})
        if twice:
            raise ConfigError(f"`decode` writes field {twice[0]!r} twice: give each decoded "
                              "field its own `output`")
        object.__setattr__(self, "fields", pairs)
        if self.backend not in BACKENDS:
            raise ConfigError(f"`backend` must be one of {BACKENDS}. Found: {self.backend!r}")
        threads = _threads() if self.threads is None else self.threads
        object.__setattr__(self, "threads", check_int("threads", threads, 1, MAX_THREADS))

    @property
    def thread_count(self) -> int:
        """``threads`` (normalized on construction)."""
        return self.threads  # type: ignore[return-value]

    def items(self) -> tuple[tuple[str, ImageDecode], ...]:
        """``(field, ImageDecode)`` pairs, sorted by field."""
        return self.fields  # type: ignore[return-value]


def as_decode(value: object) -> Decode | None:
    """The DataLoader's ``decode`` argument as a :class:`Decode` (None stays None).

    Raises:
        ConfigError: neither None, a :class:`Decode` nor a mapping of field -> ImageDecode.
    """
    if value is None or isinstance(value, Decode):
        return value
    if isinstance(value, Mapping):
        return Decode(value)
    raise ConfigError("`decode` must be None, a mapping of field name -> ImageDecode, or a "
                      f"Decode. Found: {value!r}")


@dataclass(frozen=True)
class Where:
    """Which batch a :class:`BatchDecoder` is decoding, to name a failing sample.

    Attributes:
        tag: its (seed, epoch, global batch index).
        rows: its ``(shard, start, stop)`` ranges in plan order (int64, ``(ranges, 3)``).
        shards: shard names by index, relative to the dataset root.
    """

    tag: BatchTag
    rows: np.ndarray
    shards: Sequence[str]

    def sample(self, position: int, n: int) -> tuple[str | None, int | None]:
        """The shard and in-shard index of sample ``position`` of a batch of ``n`` samples;
        ``(None, None)`` when the batch is not its plan's length (samples were skipped as
        damaged, so positions no longer match the ranges)."""
        lengths = self.rows[:, 2] - self.rows[:, 1]
        if int(lengths.sum()) != n:
            return None, None
        k = int(np.searchsorted(np.cumsum(lengths), position, side="right"))
        shard, start, _ = self.rows[k].tolist()
        return self.shards[shard], start + position - int(lengths[:k].sum())

    def error(self, field: str, position: int | None, cause: str, *, n: int) -> DecodeError:
        """The :class:`DecodeError` of ``field`` at ``position`` (None: the whole field)."""
        batch = f"batch {self.tag.batch} of epoch {self.tag.epoch}"
        if position is None:
            return DecodeError(f"decode of field {field!r} in {batch}: {cause}", field=field)
        shard, sample = self.sample(position, n)
        at = f" ({shard}, sample {sample})" if shard is not None else ""
        return DecodeError(f"decode of field {field!r} failed at sample {position} of {batch}"
                           f"{at}: {cause}", field=field, position=position, shard=shard,
                           sample=sample)


def _encoded(batch: Mapping[str, torch.Tensor], field: str, where: Where
             ) -> tuple[torch.Tensor, list[int]]:
    """``field``'s values (uint8, on the CPU) and offsets (a list of ``n + 1`` ints).

    Raises:
        DecodeError: the field is missing or not a variable-length bytes field.
    """
    values, offsets = batch.get(field), batch.get(field + ".offsets")
    if values is None:
        have = ", ".join(sorted(k for k in batch if not k.endswith(".offsets")))
        raise where.error(field, None, f"the batch has no such field (it has: {have}); check "
                                       "`columns` and the servers' --transform", n=0)
    if offsets is None or values.dtype != torch.uint8 or values.dim() != 1:
        kind = "variable-length" if offsets is not None else "fixed-size"
        raise where.error(field, None, f"not a bytes field: a {kind} {values.dtype} field of "
                                       f"shape {tuple(values.shape)}", n=0)
    if values.device.type != "cpu":
        raise where.error(field, None, f"its bytes are on {values.device}, not the CPU", n=0)
    return values, offsets.tolist()


def assemble(images: Sequence[torch.Tensor], u: np.ndarray, spec: ImageDecode,
             fail: Callable[[int, str], DecodeError],
             run: Callable[[Callable[[int], None], Iterable[int]], Iterable[None]] = map,
             ) -> torch.Tensor:
    """Crop and flip decoded ``images`` into one batch tensor.

    Args:
        images: each ``(3, H, W)`` uint8 (CHW, any strides), all on one device.
        u: the batch's draws (:func:`dataflow.client.augment.draws`), ``(n, 3)``.
        spec: the field's settings.
        fail: the error of sample ``i`` with a cause.
        run: how to map the per-sample placement (a thread pool's ``map``, or ``map``).

    Returns:
        uint8 ``(n, 3, h, w)``, contiguous, on the images' device.

    Raises:
        DecodeError: an image is smaller than the crop, or (no ``size``) not the size of the
            batch's first.
    """
    n = len(images)
    size = spec.crop_size
    if size is None:
        size = (int(images[0].shape[-2]), int(images[0].shape[-1])) if n else (0, 0)
        for i, image in enumerate(images):
            if tuple(image.shape[-2:]) != size:
                raise fail(i, f"the image is {image.shape[-2]}x{image.shape[-1]}, sample 0's "
                              f"{size[0]}x{size[1]}: give `size` to crop them to one size")
    boxes = []
    for i, image in enumerate(images):
        try:
            boxes.append(box(u[i], image.shape[-2], image.shape[-1], size, spec.crop,
                             spec.flip))
        except ValueError as e:
            raise fail(i, str(e)) from None
    device = images[0].device if n else torch.device("cpu")
    if device.type != "cpu" and len({tuple(image.shape) for image in images}) == 1:
        return place_all(torch.stack(list(images)), boxes, size)
    out = torch.empty((n, 3, *size), dtype=torch.uint8, device=device)

    def one(i: int) -> None:
        place(out[i], images[i], boxes[i])

    for _ in run(one, range(n)):
        pass
    return out


class BatchDecoder:
    """Decodes a DataLoader's batches (see the module).

    Args:
        decode: the settings.
        device: the loader's CUDA device, or None for CPU tensors.
        shards: shard names by index (relative to the dataset root), for messages.
        backend: the decoder (default: :func:`dataflow.client.imaging.backend_for`).

    Attributes:
        ahead_used: batches whose decode ahead was used at their turn.

    Thread invariant: called (and :meth:`ahead`, :meth:`close`) from the consumer's thread
    only. A batch's decode runs there or on the stage's decode-ahead thread, one at a time: a
    call waits for the decode ahead before it decodes anything else. The backend's threads
    only run inside a decode.
    """

    def __init__(self, decode: Decode, device: str | None, shards: Sequence[str],
                 backend: Backend | None = None) -> None:
        self.decode = decode
        self._device = None if device is None else torch.device(device)
        self._shards = tuple(shards)
        self.backend = backend if backend is not None else backend_for(
            decode.backend, self._device, decode.thread_count)
        self._stream = torch.cuda.Stream(self._device) if self._device is not None else None
        self._held: deque[tuple[torch.cuda.Event, dict[str, torch.Tensor]]] = deque()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dataflow-decode-ahead")
        self._pending: tuple[object, Future[Prepared]] | None = None
        self.ahead_used = 0

    def close(self) -> None:
        """Wait for a decode ahead, stop the stage's and the backend's threads and wait for
        pending copies (idempotent)."""
        self._drop_pending()
        self._pool.shutdown(wait=True)
        self.backend.close()
        while self._held:
            self._held.popleft()[0].synchronize()

    def ahead(self, key: object, batch: dict[str, torch.Tensor], rows: np.ndarray,
              tag: BatchTag) -> None:
        """Start decoding ``batch`` (host tensors), the batch the consumer takes next, known
        by ``key`` (the object the consumer will pass to :meth:`__call__` with it), on the
        decode-ahead thread. A decode ahead of another key still pending is waited for and
        dropped first."""
        self._drop_pending()
        where = Where(tag, rows, self._shards)
        self._pending = (key, self._pool.submit(self._prepare, batch, where))

    def __call__(self, batch: dict[str, torch.Tensor], rows: np.ndarray,
                 tag: BatchTag, key: object = None) -> dict[str, torch.Tensor]:
        """``batch`` (host tensors) with every decoded field in place of its bytes; on the
        loader's device when it has one, ready for the consumer's current stream. The
        decode ahead of ``key`` when there is one, else decoded now.

        Raises:
            DecodeError: a field is missing or not bytes, or a sample does not decode.
        """
        pending = self._pending
        if pending is not None and key is not None and pending[0] is key:
            try:
                prepared = pending[1].result()
            finally:  # interrupted while it runs, it stays pending: one decode at a time
                if pending[1].done():
                    self._pending = None
            self.ahead_used += 1
        else:
            self._drop_pending()
            prepared = self._prepare(batch, Where(tag, rows, self._shards))
        out, event = prepared
        if event is None:
            return out
        consumer = torch.cuda.current_stream(self._device)
        consumer.wait_event(event)
        for tensor in out.values():
            tensor.record_stream(consumer)
        # The host tensors the copies and the decoder read stay alive until they finished.
        self._held.append((event, batch))
        if len(self._held) > HELD_BATCHES:
            self._held.popleft()[0].synchronize()
        return out

    def _drop_pending(self) -> None:
        """Wait for the decode ahead, if any, and drop it (its error too: its batch was not
        taken, so the error is nobody's)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].exception()

    def _prepare(self, batch: dict[str, torch.Tensor], where: Where) -> Prepared:
        """The decoded batch, and on a CUDA device its tensors there with the event of their
        copies on the stage's stream (any thread)."""
        if self._stream is None:
            return self._decode(batch, where), None
        with torch.cuda.stream(self._stream):
            out = {k: v.to(self._device, non_blocking=True)
                   for k, v in self._decode(batch, where).items()}
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def _decode(self, batch: dict[str, torch.Tensor], where: Where) -> dict[str, torch.Tensor]:
        encoded = {k for field, _ in self.decode.items() for k in (field, field + ".offsets")}
        out = {k: v for k, v in batch.items() if k not in encoded}
        for field, spec in self.decode.items():
            if (spec.output or field) in out:
                raise where.error(field, None, f"its `output` {spec.output!r} is already a "
                                               "field of the batch", n=0)
        for field, spec in self.decode.items():
            values, offsets = _encoded(batch, field, where)
            n = len(offsets) - 1
            fail = functools.partial(where.error, field, n=n)
            images = self.backend.decode(values, offsets, fail)
            u = draws(where.tag.seed, where.tag.epoch, where.tag.batch, field, n)
            out[spec.output or field] = assemble(images, u, spec, fail, self.backend.map)
        return out
