"""Host-to-device copy of a batch, the same for every loader the bench compares."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def identity(batch: Mapping[str, object]) -> Mapping[str, object]:
    """The ``to_device`` hook of the CPU step modes: the batch stays where it is."""
    return batch


class CopyToDevice:
    """Copies every tensor of a batch to a CUDA device on a dedicated copy stream.

    The copy is enqueued on ``copy_stream`` (asynchronous when the host tensor is pinned) and
    the current (default) stream is made to wait for it, so the step that follows starts only
    once its data has arrived, while the copy itself may overlap the previous step still
    running on the GPU. ``record_stream`` tells the caching allocator the device tensors are
    used on the default stream, so their memory is not reused under a pending step. Non-tensor
    values (lists of strings) stay on the host.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)

    def __call__(self, batch: Mapping[str, object]) -> dict[str, object]:
        consumer = torch.cuda.current_stream(self.device)
        out: dict[str, object] = {}
        with torch.cuda.stream(self.copy_stream):
            for name, value in batch.items():
                if isinstance(value, torch.Tensor):
                    out[name] = value.to(self.device, non_blocking=True)
                else:
                    out[name] = value
        consumer.wait_stream(self.copy_stream)
        for value in out.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(consumer)
        return out
