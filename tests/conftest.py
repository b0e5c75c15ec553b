"""Fixtures shared across test layers, and ZeroMQ hygiene for every test.

ZeroMQ discipline (as pyzmq's own test suite keeps it): every socket a test opens in this
process on the global context (``zmq.Context.instance()``, the one context per process) is
closed by the end of the test, else the test fails; at the end of the session that context
must terminate within ``TERM_TIMEOUT_S``, else the session fails. A socket left open, or closed
with a linger on unsent messages, makes ``term()`` hang: in a real process, at exit.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq

from dataflow.batch import Ragged, concat
from dataflow.readers import read_ranges

TERM_TIMEOUT_S = 10.0


def _global_context() -> zmq.Context | None:
    """The process's live ``zmq.Context.instance()``, without creating one."""
    ctx = zmq.Context._instance
    return None if ctx is None or ctx.closed else ctx


def _open_sockets(ctx: zmq.Context | None) -> list[zmq.Socket]:
    """Sockets of ``ctx`` still open (pyzmq tracks a context's sockets in a WeakSet)."""
    return [] if ctx is None else [s for s in list(ctx._sockets) if not s.closed]


@pytest.fixture(autouse=True)
def zmq_sockets_closed() -> Iterator[None]:
    """Fail the test if a ZeroMQ socket it opened on the global context is still open.

    Garbage is collected first, so only sockets something still references count. Leaked
    sockets are left alone (a thread may still be using them, and a ZeroMQ socket must not be
    closed under its user); later tests do not count them again, and the session-end check
    then reports that the context cannot terminate.
    """
    before = weakref.WeakSet(_open_sockets(_global_context()))
    yield
    leaked = [s for s in _open_sockets(_global_context()) if s not in before]
    if leaked:  # collect garbage only when needed: a collection per test costs ~40 ms
        del leaked
        gc.collect()
        leaked = [s for s in _open_sockets(_global_context()) if s not in before]
    if leaked:
        pytest.fail(f"{len(leaked)} ZeroMQ socket(s) opened by this test still open at its "
                    f"end: {', '.join(map(repr, leaked))}; close every socket (linger=0) in "
                    "the test or its fixture", pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def zmq_context_terminates() -> Iterator[None]:
    """At session end, terminate the global context within ``TERM_TIMEOUT_S`` or fail."""
    yield
    ctx = _global_context()
    if ctx is None:
        return
    done = threading.Thread(target=ctx.term, name="zmq-term", daemon=True)
    done.start()
    done.join(TERM_TIMEOUT_S)
    if done.is_alive():
        zmq.Context._instance = None
        pytest.fail(f"zmq.Context.instance().term() did not return within {TERM_TIMEOUT_S} s: "
                    f"{len(_open_sockets(ctx))} socket(s) still open, or closed with a linger "
                    "on unsent messages", pytrace=False)


def _rows_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, Ragged):
            assert isinstance(y, Ragged) and x.kind == y.kind, name
            assert [x[i] for i in range(len(x))] == [y[i] for i in range(len(y))], name
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture
def assert_ranges_match() -> Callable:
    """``check(reader)``: reads of assorted ranges equal the same rows of a full read, also
    when gathered as runs of a batch spanning shards (``read_ranges``: into a shared sink)."""

    def check(reader, seed: int = 0) -> None:
        n = len(reader)
        full = reader.read(0, n)
        rng = np.random.default_rng(seed)
        ranges = [(0, 0), (0, min(1, n)), (max(n - 1, 0), n), (0, n), (n // 3, n // 2)]
        ranges += [tuple(sorted(rng.integers(0, n + 1, size=2).tolist())) for _ in range(8)]
        for start, stop in ranges:
            part = reader.read(start, stop)
            want = {}
            for name, col in full.items():
                if isinstance(col, Ragged):
                    want[name] = Ragged(
                        col.values[col.offsets[start] : col.offsets[stop]],
                        col.offsets[start : stop + 1] - col.offsets[start], col.kind,
                    )
                else:
                    want[name] = col[start:stop]
            _rows_equal(part, want)
        singles = [(r, r + 1) for r in rng.integers(0, n, size=min(n, 5)).tolist()]
        runs = [(k % 3, a, b) for k, (a, b) in enumerate([*ranges, *singles])]
        got = read_ranges(lambda _: reader, np.array(runs, dtype=np.int64))
        _rows_equal(got, concat([reader.read(a, b) for _, a, b in runs]))

    return check
