"""The server's memory bound as a function of its flags (docs/architecture.md, Memory)."""

from __future__ import annotations

import dataclasses

import pytest

from dataflow.server.config import ServerConfig
from dataflow.server.memory import memory_bound

KiB, MiB = 1024, 1024 * 1024


def test_the_formula_for_small_flags() -> None:
    cfg = ServerConfig(data=("x",), workers=2, worker_queue=2, max_sessions=8, max_credits=4,
                       max_inbound_total=8 * MiB, max_window_samples=1024,
                       max_request_samples=256, max_reply_bytes=MiB,
                       max_unsent_bytes=4 * MiB, max_inbound_bytes=8 * MiB)
    c, h = 2 * 8 + 64, 2 * 4 + 16  # connections per process, messages queued for one peer
    frontend = (33 * (8 * MiB + c * 4 * KiB) + c * h * 2 * KiB + 8 * (48 * 1024 + h * 512)
                + 2 * 2 * 24 * 256)
    readers = 4 * MiB + 2 * 3 * MiB + 2 * (33 * MiB + c * h * KiB) + 2 * 128 * MiB
    bound = memory_bound(cfg)
    assert (bound.frontend, bound.readers) == (frontend, readers)


@pytest.mark.parametrize("flag,more", [
    ("max_sessions", 512), ("max_credits", 128), ("max_inbound_total", 64 * MiB),
    ("max_window_samples", 1 << 20), ("max_request_samples", 1 << 16), ("workers", 4),
    ("worker_queue", 4), ("max_reply_bytes", 2 * 1024**3 - 1), ("max_unsent_bytes", 1 << 32),
    ("cache_memory", 1 << 30),
])
def test_the_bound_grows_with_every_flag_it_depends_on(flag: str, more: int) -> None:
    base = ServerConfig(data=("x",), max_request_samples=1024)
    raised = dataclasses.replace(base, **{flag: more})
    before, after = memory_bound(base), memory_bound(raised)
    assert after.frontend >= before.frontend and after.readers >= before.readers
    assert (after.frontend, after.readers) != (before.frontend, before.readers)


def test_the_readers_caches_add_their_flag_shared_equally() -> None:
    base = ServerConfig(data=("x",), workers=3)
    cached = dataclasses.replace(base, cache_memory=3 * MiB + 2)
    assert cached.reader_cache_memory == MiB
    assert memory_bound(cached).readers - memory_bound(base).readers == 3 * MiB
    assert memory_bound(cached).frontend == memory_bound(base).frontend


def test_announced_windows_add_to_both_processes() -> None:
    base = ServerConfig(data=("x",), workers=2, worker_queue=3, max_sessions=8, max_credits=4,
                        cache_memory=MiB)
    planned = dataclasses.replace(base, cache_plan_window=1000)
    h = 2 * 4 + 16
    assert (memory_bound(planned).frontend - memory_bound(base).frontend
            == 8 * h * 48 * 1000 + 2 * 3 * 24 * 1000)
    assert memory_bound(planned).readers - memory_bound(base).readers == 2 * 8 * 256 * 1000
