"""DataLoader configuration and the one place that reads the distributed environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dataflow.checks import check_int
from dataflow.client.decode import Decode, as_decode
from dataflow.client.discovery import DEFAULT_RESOLVE_INTERVAL, ServerSource
from dataflow.client.shmring import PAGE_BYTES, VIEWS
from dataflow.errors import ConfigError, FieldError
from dataflow.security import ClientCurve, client_curve
from dataflow.shm import Geometry
from dataflow.shuffle import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_SHUFFLE_WINDOW,
    DEFAULT_WINDOW,
    Shuffle,
    as_shuffle,
    shuffle_mode,
)
from dataflow.wire import Hello
from dataflow.wire.fields import (
    MAX_BATCH_SIZE,
    MAX_GROUP,
    MAX_MESSAGE_BYTES,
    MAX_SHM_SLOTS,
    column_names,
)

SHARED_MEMORY = ("auto", "off")
DEFAULT_SLOT_BYTES = 32 * 2**20

# ZeroMQ I/O threads of a loader's own context: they receive the servers' bytes from the
# kernel (one TCP connection is served by one of them). Two receive large batches faster, also
# on 2 cores, but cost small ones trainer CPU (bench/RESULTS.md, "The default io_threads stays
# 1"); raise it for large batches.
DEFAULT_IO_THREADS = 1
MAX_IO_THREADS = 64

# batches_per_request="auto": requests carry up to AUTO_GROUP batches, as many as make a reply of
# at most GROUP_BYTES (while any server's replies land in shared memory, SHM_GROUP_BYTES and at
# most a slot: a reply fits one with room), for batches small enough that 4 fit
# (bench/RESULTS.md: "Page faults in the receive", 4 MiB batches 4 a request moved 0.61 -> 0.76
# of raw pyzmq's rate on 2 cores; "Eight 4 MiB batches a request", sent apart by the reader;
# for larger batches the per-batch costs saved are small).
AUTO_GROUP = 8
GROUP_BYTES = 32 * 2**20
SHM_GROUP_BYTES = 16 * 2**20

# A HELLO asks each server for this many credits (or `prefetch`, if more): a server grants at
# most its --max-credits (64 by default), and the loader uses `prefetch` of them, or one per
# reader of a server with more readers (client/scheduler.py), so that every reader can work
# (bench/RESULTS.md: "A request per reader"). As many as a server may have readers.
READER_CREDITS = 256
# The most address space a shared-memory segment spans (sparse: memory is taken only as its
# slots are written; the client and the server's readers each map it whole).
SEGMENT_SPAN = 64 * 2**30


def dist_env(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in ``rank`` / ``world_size`` when None.

    Sources, in order: an initialized ``torch.distributed`` process group, the torchrun
    environment (``RANK``, ``WORLD_SIZE``), else rank 0 of 1.

    Raises:
        ConfigError: ``RANK`` or ``WORLD_SIZE`` is set but not an integer.
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        env_rank, env_world = dist.get_rank(), dist.get_world_size()
    else:
        try:
            env_rank = int(os.environ.get("RANK", "0"))
            env_world = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError as e:
            raise ConfigError(f"RANK and WORLD_SIZE must be integers. Found: RANK="
                              f"{os.environ.get('RANK')!r}, WORLD_SIZE="
                              f"{os.environ.get('WORLD_SIZE')!r}") from e
    return (env_rank if rank is None else rank, env_world if world_size is None else world_size)


def _columns(value: object) -> tuple[str, ...] | None:
    """``value`` (None, or a sequence of field names) as the tuple a HELLO carries.

    Raises:
        ConfigError: not a sequence of names, none, a name twice, a name that is not a
            non-empty string, or more than the wire allows.
    """
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError("`columns` must be a list of served field names, or None for every "
                          f"field. Found: {value!r}")
    try:
        return column_names(list(value))
    except FieldError as e:
        raise ConfigError(f"`columns` {e}. Found: {list(value)!r}"[:400]) from None


@dataclass(frozen=True)
class LoaderConfig:
    """Validated settings of one DataLoader (see :class:`client.DataLoader` for meanings).

    ``device`` is normalized: None for CPU tensors, else a CUDA device string; ``shuffle`` is
    a :class:`~dataflow.shuffle.Shuffle` (a mode alone, a name or a bool, gets the default
    knobs); ``columns`` a tuple; ``decode`` a :class:`~dataflow.client.decode.Decode` (a
    mapping stands for its fields). ``request_timeout`` None stands for ``timeout`` (see
    :attr:`request_limit`).
    """

    servers: ServerSource
    batch_size: int
    rank: int
    world_size: int
    shuffle: Shuffle = Shuffle()
    seed: int = 0
    drop_last: bool = False
    device: str | None = None
    pin_memory: bool = True
    prefetch: int = 4
    timeout: float = 60.0
    grace: float = 10.0
    curve: ClientCurve | None = None
    resolve_interval: float = DEFAULT_RESOLVE_INTERVAL
    columns: Sequence[str] | None = None
    read_ahead: bool = True
    request_timeout: float | None = None
    collate_fn: Callable[[dict[str, torch.Tensor]], Any] | None = None
    decode: Decode | None = None
    io_threads: int = DEFAULT_IO_THREADS
    shared_memory: str = "auto"
    shared_memory_slot_bytes: int = DEFAULT_SLOT_BYTES
    batches_per_request: int | str = "auto"
    lineage: bool = False
    tune_malloc: bool = True

    @classmethod
    def of(cls, servers: ServerSource, *, batch_size: int, rank: int | None = None,
           world_size: int | None = None, shuffle: bool | str = True, seed: int = 0,
           drop_last: bool = False, device: str | torch.device | None = None,
           pin_memory: bool = True, prefetch: int = 4, timeout: float = 60.0,
           grace: float = 10.0, shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
           block_size: int = DEFAULT_BLOCK_SIZE, window: int = DEFAULT_WINDOW,
           curve_key: str | os.PathLike | None = None,
           server_key: str | os.PathLike | None = None,
           resolve_interval: float = DEFAULT_RESOLVE_INTERVAL,
           columns: Sequence[str] | None = None, read_ahead: bool = True,
           request_timeout: float | None = None,
           collate_fn: Callable[[dict[str, torch.Tensor]], Any] | None = None,
           decode: Any = None, io_threads: int = DEFAULT_IO_THREADS,
           shared_memory: str = "auto", shared_memory_slot_bytes: int = DEFAULT_SLOT_BYTES,
           batches_per_request: int | str = "auto", lineage: bool = False,
           tune_malloc: bool = True) -> LoaderConfig:
        """The configuration of a DataLoader's arguments (the same names and defaults; see
        :class:`client.DataLoader`): ``rank`` and ``world_size`` from the environment when
        None (:func:`dist_env`), the shuffle's knobs as one :class:`~dataflow.shuffle.Shuffle`,
        the key files read."""
        rank, world_size = dist_env(rank, world_size)
        return cls(
            servers=servers, batch_size=batch_size, rank=rank, world_size=world_size,
            shuffle=Shuffle(shuffle_mode(shuffle), shuffle_window, block_size, window),
            seed=seed, drop_last=drop_last, device=normalize_device(device),
            pin_memory=pin_memory, prefetch=prefetch, timeout=timeout, grace=grace,
            curve=client_curve(curve_key, server_key), resolve_interval=resolve_interval,
            columns=columns, read_ahead=read_ahead, request_timeout=request_timeout,
            collate_fn=collate_fn, decode=as_decode(decode), io_threads=io_threads,
            shared_memory=shared_memory, shared_memory_slot_bytes=shared_memory_slot_bytes,
            batches_per_request=batches_per_request, lineage=lineage, tune_malloc=tune_malloc)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", as_decode(self.decode))
        object.__setattr__(self, "shuffle", as_shuffle(self.shuffle))
        object.__setattr__(self, "columns", _columns(self.columns))
        if not isinstance(self.servers, ServerSource):
            raise ConfigError(f"`servers` must be a ServerSource. Found: {self.servers!r}")
        if (isinstance(self.resolve_interval, bool) or not isinstance(self.resolve_interval,
                                                                      (int, float))
                or not 0 < self.resolve_interval < float("inf")):
            raise ConfigError("`resolve_interval` must be a number of seconds > 0. "
                              f"Found: {self.resolve_interval!r}")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise ConfigError("`collate_fn` must be a function of a batch, or None. "
                              f"Found: {self.collate_fn!r}")
        if self.shared_memory not in SHARED_MEMORY:
            raise ConfigError(f"`shared_memory` must be one of {list(SHARED_MEMORY)}. "
                              f"Found: {self.shared_memory!r}")
        object.__setattr__(self, "shared_memory_slot_bytes",
                           check_int("shared_memory_slot_bytes",
                                     self.shared_memory_slot_bytes, 4096, MAX_MESSAGE_BYTES))
        if self.batches_per_request != "auto":
            object.__setattr__(self, "batches_per_request",
                               check_int("batches_per_request", self.batches_per_request, 1,
                                         MAX_GROUP))
        for flag in ("read_ahead", "lineage", "tune_malloc"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"`{flag}` must be True or False. Found: "
                                  f"{getattr(self, flag)!r}")
        for name, lo, hi in (("batch_size", 1, MAX_BATCH_SIZE), ("world_size", 1, None),
                             ("rank", 0, None), ("seed", 0, None), ("prefetch", 1, None),
                             ("io_threads", 1, MAX_IO_THREADS)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo, hi))
        if self.rank >= self.world_size:
            raise ConfigError(f"`rank` must be < world_size ({self.world_size}). "
                              f"Found: {self.rank}")
        if not self.timeout > 0:
            raise ConfigError(f"`timeout` must be > 0 seconds. Found: {self.timeout!r}")
        if self.request_timeout is not None and (
                isinstance(self.request_timeout, bool)
                or not isinstance(self.request_timeout, (int, float))
                or not 0 < self.request_timeout < float("inf")):
            raise ConfigError("`request_timeout` must be None (the `timeout`) or a number of "
                              f"seconds > 0. Found: {self.request_timeout!r}")
        if isinstance(self.grace, bool) or not (isinstance(self.grace, (int, float))
                                                and 0 <= self.grace < float("inf")):
            raise ConfigError(f"`grace` must be a number of seconds >= 0. Found: {self.grace!r}")
        if self.device is not None and not self.device.startswith("cuda"):
            raise ConfigError(f"`device` must be None, 'cpu' or a CUDA device. "
                              f"Found: {self.device!r}")
        if self.device is not None and not torch.cuda.is_available():
            raise ConfigError(f"`device` is {self.device!r} but CUDA is not available")

    @property
    def shm_geometry(self) -> Geometry | None:
        """Slots of the shared-memory segment offered to each server: ``2 x requests + 3``
        slots (:attr:`most_requests`, a loader's most requests at a server, each lending a
        slot, and as many replies plus three more held as views of their slots or read by
        device copies, :data:`~dataflow.client.shmring.VIEWS`) of ``shared_memory_slot_bytes``
        rounded up to whole pages of :data:`PAGE_BYTES` bytes (fewer slots where they would
        span more than :data:`SEGMENT_SPAN`, never fewer than ``2 x prefetch + 3``, nor
        more than the wire allows); None when ``shared_memory`` is off. The segment is
        sparse: a slot takes memory as it is written (and is pinned, on pages of its own, as
        a CUDA ``device``'s copies first read it)."""
        if self.shared_memory == "off":
            return None
        slot_bytes = -(-self.shared_memory_slot_bytes // PAGE_BYTES) * PAGE_BYTES
        spanned = max(2 * self.prefetch + VIEWS, SEGMENT_SPAN // slot_bytes)
        return Geometry(min(2 * self.most_requests + VIEWS, spanned, MAX_SHM_SLOTS), slot_bytes)

    @property
    def request_group(self) -> tuple[int, int | None, int | None]:
        """The most batches a request carries, the reply's bytes they are sized to from the
        first batch received (None: that many always), and those of a reply that lands in
        shared memory (None: the same); see ``batches_per_request``."""
        if self.batches_per_request != "auto":
            return int(self.batches_per_request), None, None
        geometry = self.shm_geometry
        return (AUTO_GROUP, GROUP_BYTES,
                min(SHM_GROUP_BYTES, geometry.slot_bytes) if geometry else None)

    @property
    def request_limit(self) -> float:
        """Seconds a request may go unanswered before its batch is asked of another server
        (``request_timeout``, or ``timeout`` when None)."""
        return float(self.timeout if self.request_timeout is None else self.request_timeout)

    def plan_inputs(self) -> dict[str, str | int | bool]:
        """The inputs of this loader's plans that its resume state keeps (by the state's names,
        :data:`dataflow.client.state.PLAN_FIELDS`)."""
        return {"seed": self.seed, "batch_size": self.batch_size, **self.shuffle.fields(),
                "drop_last": self.drop_last}

    @property
    def most_requests(self) -> int:
        """The most requests the loader keeps at a server (the credits its HELLO asks for):
        ``prefetch``, or :data:`READER_CREDITS`, for a server with more readers."""
        return max(self.prefetch, READER_CREDITS)

    def hello(self, name: str) -> Hello:
        """The HELLO said to every server: :data:`READER_CREDITS` credits asked (the loader
        uses ``prefetch`` of those granted, or one per reader), the client's description
        ``name``, its ``batch_size`` (no REQUEST of it is larger: a server whose
        ``--max-request-samples`` is smaller refuses the HELLO, naming it) and its ``columns``."""
        return Hello(self.most_requests, name, batch_size=self.batch_size,
                     columns=None if self.columns is None else tuple(self.columns),
                     group=self.request_group[0])


def normalize_device(device: str | torch.device | None) -> str | None:
    """None for CPU, else the device as a string (``cuda`` becomes ``cuda:<current>``)."""
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return str(dev)
