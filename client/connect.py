"""Opening a loader's sessions with its servers: the I/O thread of one configuration, started,
and the INDEX of the first server that admitted it. A DataLoader has one; a MixtureLoader one
per source."""

from __future__ import annotations

import functools
import socket

import torch

from dataflow import wire
from dataflow.client.buffers import CudaSink, HostSink
from dataflow.client.config import LoaderConfig
from dataflow.client.discovery import first_lookup, lookup
from dataflow.client.iothread import IOThread
from dataflow.heap import THREAD_HEAP_BYTES, keep_freed_memory

GET_POLL_S = 0.5


def start_io(cfg: LoaderConfig, what: str = "") -> IOThread:
    """A started I/O thread for ``cfg``'s servers: it connects to them, says HELLO and keeps
    the sessions (:mod:`dataflow.client.iothread`); ``what`` is added to the client's
    description the servers see (``rank 0/2 on HOST``), e.g. a mixture source's name. With
    ``cfg.tune_malloc`` the process's malloc keeps freed receive buffers first
    (:mod:`dataflow.heap`).

    Raises:
        ServerUnavailable: a name or a registry named no server within ``cfg.timeout``.
    """
    if cfg.tune_malloc:
        keep_freed_memory(top_pad=THREAD_HEAP_BYTES)
    source = cfg.servers
    find = functools.partial(lookup, source)
    endpoints = first_lookup(source, find, cfg.timeout)
    if cfg.device is not None and cfg.decode is None:
        sink: HostSink | CudaSink = CudaSink(torch.device(cfg.device))
    elif cfg.device is not None:  # the decode stage copies to the device (client/decode.py)
        sink = HostSink(pin=True)
    else:
        sink = HostSink(pin=cfg.pin_memory and torch.cuda.is_available())
    name = f"rank {cfg.rank}/{cfg.world_size} on {socket.gethostname()}"
    io = IOThread(endpoints, cfg.hello(f"{name} {what}" if what else name), cfg.prefetch,
                  cfg.timeout, cfg.grace, sink, cfg.curve,
                  find if source.dynamic else None, cfg.resolve_interval,
                  cfg.request_limit, cfg.io_threads, cfg.shm_geometry, cfg.request_group)
    io.start()
    return io


def first_index(io: IOThread) -> wire.Index:
    """The INDEX of the first server that admitted ``io``'s loader (the I/O thread makes sure
    every later one serves the same dataset); raises the I/O thread's failure
    (``ServerUnavailable`` when none did within the loader's ``timeout``)."""
    return io.handoff.hello(GET_POLL_S, io.is_alive)
