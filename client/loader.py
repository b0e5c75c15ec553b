"""The trainer-side DataLoader: iterate batches served by one or more loader servers."""

from __future__ import annotations

import os
import queue
import weakref
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch

from dataflow.client.buffers import CudaSink, HostSink, hand_over
from dataflow.client.config import LoaderConfig, dist_env, normalize_device, normalize_servers
from dataflow.client.transport import IOThread, Item
from dataflow.errors import DataflowError
from dataflow.index import DatasetIndex
from dataflow.plan import DEFAULT_BLOCK_SIZE, DEFAULT_WINDOW, epoch_size, plan, split_batches

GET_POLL_S = 0.5
STATE_FIELDS = ("seed", "world_size", "rank", "batch_size", "shuffle", "drop_last",
                "block_size", "window")


class DataLoader:
    """Batches of a dataset served by dataflow loader servers, for one trainer rank.

    Each epoch's order is a deterministic function of (dataset index, world size, rank, epoch,
    seed) computed with :mod:`dataflow.plan`, so ranks agree without talking. Every rank yields
    ``len(loader)`` batches per epoch; over all ranks every sample appears exactly once per
    epoch, plus ``EpochSize.repeated`` repeats when ``drop_last=False`` pads the last batches
    (minus ``EpochSize.dropped`` samples when ``drop_last=True``).

    Batches are ``dict[str, torch.Tensor]``:

    * a fixed-size field ``name`` -> tensor of shape ``(batch, *shape)``;
    * a variable-length field ``name`` -> ``batch[name]``, a 1-D tensor of all samples' values
      back to back (uint8 UTF-8 / raw bytes for str / bytes fields), and
      ``batch[name + ".offsets"]``, int64 of shape ``(batch + 1,)``: sample ``i`` is
      ``batch[name][offsets[i]:offsets[i + 1]]``.

    On CPU (``device`` None) tensors are fresh per batch and may be kept; they are pinned when
    CUDA is available and ``pin_memory``. With a CUDA ``device`` the host-to-device copies run
    on a dedicated stream, and the current stream waits for them before the batch is returned.

    Iterating continues the current epoch where the previous iterator stopped; once an epoch
    is complete, the next iterator starts the next epoch (unless :meth:`set_epoch` was called).
    ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch. One iterator is active
    at a time: starting a new one invalidates the previous. After an error is raised the loader
    can only be closed.

    Args:
        servers: one endpoint (``tcp://host:port``) or a list; batches are spread over them.
        batch_size: samples per batch.
        rank: this trainer's rank; default from torch.distributed, else ``RANK``, else 0.
        world_size: number of ranks; default from torch.distributed, else ``WORLD_SIZE``,
            else 1.
        shuffle: shuffle shards and blocks of samples each epoch.
        seed: non-negative seed shared by all ranks.
        drop_last: drop the remainder instead of padding ranks with repeated samples.
        device: None / "cpu" for CPU tensors, or a CUDA device.
        pin_memory: pin CPU batches (only when CUDA is available).
        prefetch: requests kept outstanding per server.
        timeout: seconds without progress from a server (or without an answer to HELLO)
            before :class:`~dataflow.errors.ServerUnavailable` is raised.
        block_size: samples per shuffled block (see :func:`dataflow.plan.plan`).
        window: shards whose blocks are shuffled together.

    Raises:
        ConfigError: an argument is invalid.
        ServerUnavailable: a server did not answer HELLO within ``timeout``.
        DataflowError: the servers serve different datasets.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        pin_memory: bool = True,
        prefetch: int = 4,
        timeout: float = 60.0,
        block_size: int = DEFAULT_BLOCK_SIZE,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        rank, world_size = dist_env(rank, world_size)
        self.config = LoaderConfig(
            endpoints=normalize_servers(servers), batch_size=batch_size, rank=rank,
            world_size=world_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            device=normalize_device(device), pin_memory=pin_memory, prefetch=prefetch,
            timeout=timeout, block_size=block_size, window=window,
        )
        cfg = self.config
        if cfg.device is not None:
            sink: HostSink | CudaSink = CudaSink(torch.device(cfg.device))
        else:
            sink = HostSink(pin=pin_memory and torch.cuda.is_available())
        self._io = IOThread(cfg.endpoints, cfg.prefetch, cfg.timeout, sink,
                            f"rank {cfg.rank}/{cfg.world_size} pid {os.getpid()}")
        self._finalizer = weakref.finalize(self, self._io.stop)
        self._io.start()
        self._epoch = 0
        self._yielded = 0
        self._gen = 0
        try:
            self.index = self._handshake()
        except BaseException:
            self.close()
            raise
        self.epoch_size = epoch_size(self.index.total, world_size=cfg.world_size,
                                     batch_size=cfg.batch_size, drop_last=cfg.drop_last)

    def _handshake(self) -> DatasetIndex:
        item = self._get()
        indexes = item.indexes
        fingerprints = {}
        parsed = []
        for endpoint, msg in zip(self.config.endpoints, indexes, strict=True):
            idx = DatasetIndex.from_json(msg.index_json)
            fingerprints[endpoint] = idx.fingerprint
            parsed.append(idx)
        if len(set(fingerprints.values())) > 1:
            raise DataflowError("servers serve different datasets (fingerprints "
                                + ", ".join(f"{e}: {f}" for e, f in fingerprints.items()) + ")")
        return parsed[0]

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the I/O thread and close every socket (idempotent)."""
        self._gen += 1
        self._finalizer()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- epochs ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch (identical on every rank)."""
        return self.epoch_size.batches_per_rank

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iterator start epoch ``epoch`` from its first batch."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise DataflowError(f"`epoch` must be an integer >= 0. Found: {epoch!r}")
        self._epoch = epoch
        self._yielded = 0
        self._gen += 1

    def plan_batches(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        """This rank's batches of ``epoch`` as lists of ``(shard, start, stop)`` ranges."""
        cfg = self.config
        ranges = plan(self.index.sizes, world_size=cfg.world_size, rank=cfg.rank, epoch=epoch,
                      seed=cfg.seed, batch_size=cfg.batch_size, shuffle=cfg.shuffle,
                      drop_last=cfg.drop_last, block_size=cfg.block_size, window=cfg.window)
        return split_batches(ranges, cfg.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if not self._finalizer.alive:
            raise DataflowError("DataLoader is closed")
        if len(self) > 0 and self._yielded >= len(self):
            self._epoch += 1
            self._yielded = 0
        self._gen += 1
        batches = self.plan_batches(self._epoch)
        if len(batches) != len(self):
            raise DataflowError(f"plan has {len(batches)} batches; expected {len(self)}")
        self._io.taken = 0
        self._io.command("epoch", self._gen, batches[self._yielded :], self._yielded)
        return self._iterate(self._gen)

    def _iterate(self, gen: int) -> Iterator[dict[str, torch.Tensor]]:
        while self._yielded < len(self):
            if gen != self._gen:
                raise DataflowError("this iterator was invalidated: a newer iterator was "
                                    "started, set_epoch/load_state_dict was called, or the "
                                    "loader was closed")
            item = self._get()
            if item.gen != gen:
                continue
            self._io.taken += 1
            self._io.wake()
            if item.index != self._yielded or item.ready is None:
                raise DataflowError(f"internal: got batch {item.index}, expected "
                                    f"{self._yielded}")
            self._yielded += 1
            yield hand_over(item.ready)

    def _get(self) -> Item:
        """Next item from the I/O thread; re-raises errors it reports."""
        while True:
            try:
                item = self._io.out.get(timeout=GET_POLL_S)
            except queue.Empty:
                if not self._io.is_alive():
                    raise DataflowError("the DataLoader's I/O thread has stopped") from None
                continue
            if item.error is not None:
                raise item.error from item.error.__cause__
            return item

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Resume state: a few scalars (epoch, batches yielded in it, plan inputs)."""
        cfg = self.config
        return {"epoch": self._epoch, "batches_yielded": self._yielded,
                "fingerprint": self.index.fingerprint,
                **{name: getattr(cfg, name) for name in STATE_FIELDS}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next iterator yields exactly the batches not yet yielded.

        Raises:
            DataflowError: ``state`` is from another dataset or configuration (names the field).
        """
        expected = self.state_dict()
        for name in ("fingerprint", *STATE_FIELDS):
            if name not in state:
                raise DataflowError(f"state_dict is missing `{name}`")
            if state[name] != expected[name]:
                raise DataflowError(f"state_dict `{name}` is {state[name]!r} but this loader "
                                    f"has {expected[name]!r}")
        epoch, done = state.get("epoch"), state.get("batches_yielded")
        if not isinstance(epoch, int) or epoch < 0:
            raise DataflowError(f"state_dict `epoch` must be an integer >= 0. Found: {epoch!r}")
        if not isinstance(done, int) or not 0 <= done <= len(self):
            raise DataflowError(f"state_dict `batches_yielded` must be in [0, {len(self)}]. "
                                f"Found: {done!r}")
        self._epoch = epoch
        self._yielded = done
        self._gen += 1
