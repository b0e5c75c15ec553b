"""What the frontend admits: a HELLO (a session, its credits and request size) and a
REQUEST's ranges. Pure: no sockets, no clock; :mod:`dataflow.server.clients` does the I/O.

Credits of admitted requests are the ledger's (:mod:`dataflow.server.ledger`); when a session
ends is :mod:`dataflow.server.sessions`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.server.config import ServerConfig
from dataflow.subset import unmatched
from dataflow.wire import ErrorKind, Hello

FEW_RANGES = 8  # a request of at most this many ranges is checked without numpy


@dataclass(frozen=True)
class Grant:
    """A HELLO admitted.

    Attributes:
        credits: credits granted to the session.
        max_samples: most samples one of its REQUESTs may name.
        group: most batches one of its REQUESTs may carry (its HELLO's ``group``, at most
            as many batches of its ``batch_size`` as ``max_samples`` holds, at least 1).
    """

    credits: int
    max_samples: int
    group: int = 1


@dataclass(frozen=True)
class Refused:
    """A HELLO refused: the ERROR that answers it, and the STATS counter that counts it."""

    kind: ErrorKind
    counter: str
    message: str


def admit_hello(msg: Hello, config: ServerConfig, served: Sequence[str], *, renewing: bool,
                sessions: int, of_address: int) -> Grant | Refused:
    """Whether HELLO ``msg`` opens a session (or renews its connection's, ``renewing``). Pure.

    A HELLO asking for more than this server serves (a ``batch_size`` over
    ``--max-request-samples``, ``columns`` naming a field not in ``served``) is refused as a
    protocol error. A new session is refused as busy while the server holds ``sessions`` of
    ``--max-sessions``, or its peer address ``of_address`` of ``--max-sessions-per-address``.
    A session may name ``batch_size x group`` samples a request (a REQUEST carries up to
    ``group`` batches), at most ``--max-request-samples`` (also without a ``batch_size``), and
    is granted its ``credits``, at most ``--max-credits`` and at most
    ``--max-window-samples`` samples' worth, at least one.
    """
    cap = config.max_request_samples
    if msg.batch_size is not None and msg.batch_size > cap:
        return Refused(ErrorKind.PROTOCOL, "refused", f"HELLO `batch_size` {msg.batch_size} "
                       f"exceeds this server's --max-request-samples {cap}")
    unknown = unmatched(msg.columns or (), served)
    if unknown:
        return Refused(ErrorKind.PROTOCOL, "refused", f"HELLO `columns` names field(s) "
                       f"{unknown} this server does not serve; it serves {list(served)}")
    if not renewing and sessions >= config.max_sessions:
        return Refused(ErrorKind.SERVER_BUSY, "sessions_refused",
                       f"this server holds its maximum of {sessions} sessions "
                       "(--max-sessions); use another server or retry later")
    if not renewing and of_address >= config.address_sessions:
        return Refused(ErrorKind.SERVER_BUSY, "address_sessions_refused",
                       f"this server holds {of_address} sessions of this client's address, "
                       "the most one address may (--max-sessions-per-address); use another "
                       "server or retry later")
    max_samples = min(msg.batch_size * msg.group, cap) if msg.batch_size else cap
    credits = min(msg.credits, config.max_credits,
                  max(1, config.max_window_samples // max_samples))
    group = max(1, min(msg.group, max_samples // msg.batch_size)) if msg.batch_size else 1
    return Grant(credits, max_samples, group)


def ahead_problem(ahead: np.ndarray, sizes: np.ndarray, shards: Sequence[str],
                  window: int) -> str | None:
    """Why ``ahead`` (a REQUEST's announced rows, int64 (m, 3)) is not a valid announcement of
    at most ``window`` samples of shards ``shards`` of ``sizes`` samples, or None. Pure.
    Rows may repeat (a window may reach into the next epoch)."""
    if not len(ahead):
        return None
    if not window:
        return ("`ahead` announces rows to a server that takes none (its INDEX has no "
                "`ahead`; --cache-plan-window 0)")
    if len(ahead) > window:
        return (f"`ahead` of {len(ahead)} ranges exceeds the server's --cache-plan-window "
                f"{window} samples")
    problem = _bounds_problem(ahead, sizes, shards)
    if problem is not None:
        return f"`ahead` {problem}"
    total = int((ahead[:, 2] - ahead[:, 1]).sum())
    if total > window:
        return (f"`ahead` of {total} samples exceeds the server's --cache-plan-window "
                f"{window} samples")
    return None


def _shard_problem(i: int, shard: int, shards: int) -> str:
    return f"range {i}: shard {shard} not in [0, {shards})"


def _row_problem(i: int, start: int, stop: int, name: str, size: int) -> str:
    return (f"range {i}: [{start}, {stop}) is empty or outside shard {name} of {size} "
            "samples")


def _total_problem(total: int, max_samples: int) -> str:
    return (f"request of {total} samples exceeds this session's {max_samples} samples "
            "a request (its HELLO `batch_size`, else --max-request-samples)")


def _bounds_problem(ranges: np.ndarray, sizes: np.ndarray, shards: Sequence[str]) -> str | None:
    """Why a row of ``ranges`` is not a non-empty range of its shard, or None."""
    shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    bad_shard = (shard < 0) | (shard >= len(sizes))
    if bad_shard.any():
        i = int(np.flatnonzero(bad_shard)[0])
        return _shard_problem(i, int(shard[i]), len(sizes))
    size = sizes[shard]
    bad = (start < 0) | (stop <= start) | (stop > size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return _row_problem(i, int(start[i]), int(stop[i]), shards[int(shard[i])],
                            int(size[i]))
    return None


def range_problem(ranges: np.ndarray, sizes: np.ndarray, shards: Sequence[str],
                  max_samples: int) -> str | None:
    """Why ``ranges`` (int64, (n, 3) ``(shard, start, stop)`` rows) is not a valid request of
    at most ``max_samples`` samples of shards ``shards`` of ``sizes`` samples, or None. Pure.

    Each sample may be named once: no two ranges overlap (ranges that meet are fine). A plan
    never names a sample twice in a batch, even padded (``drop_last=False`` repeats samples
    only in other ranks' batches); a request that does would make the readers read and send
    the same data any number of times.
    """
    if len(ranges) > max_samples:
        return (f"request of {len(ranges)} ranges exceeds this session's "
                f"{max_samples} samples a request")
    if len(ranges) <= FEW_RANGES:  # a batch of consecutive samples, or a run of them
        return _few_ranges_problem(ranges.tolist(), sizes, shards, max_samples)
    return _ranges_problem(ranges, sizes, shards, max_samples)


def _few_ranges_problem(rows: list[list[int]], sizes: np.ndarray, shards: Sequence[str],
                        max_samples: int) -> str | None:
    """:func:`_ranges_problem` of a few ``rows``, with Python ints (the same checks in the
    same order, so the same message)."""
    for i, (shard, _, _) in enumerate(rows):
        if not 0 <= shard < len(sizes):
            return _shard_problem(i, shard, len(sizes))
    for i, (shard, start, stop) in enumerate(rows):
        size = int(sizes[shard])
        if start < 0 or stop <= start or stop > size:
            return _row_problem(i, start, stop, shards[shard], size)
    total = sum(stop - start for _, start, stop in rows)
    if total > max_samples:
        return _total_problem(total, max_samples)
    order = sorted(range(len(rows)), key=lambda k: (rows[k][0], rows[k][1]))  # stable
    for a, b in zip(order, order[1:], strict=False):
        if rows[b][0] == rows[a][0] and rows[b][1] < rows[a][2]:
            i, j = sorted((a, b))
            return (f"ranges {i} [{rows[i][1]}, {rows[i][2]}) and {j} [{rows[j][1]}, "
                    f"{rows[j][2]}) of shard {shards[rows[i][0]]} overlap: a request names "
                    "each sample at most once")
    return None


def _ranges_problem(ranges: np.ndarray, sizes: np.ndarray, shards: Sequence[str],
                    max_samples: int) -> str | None:
    """:func:`range_problem` of a request of any number of ranges."""
    problem = _bounds_problem(ranges, sizes, shards)
    if problem is not None:
        return problem
    shard, start, stop = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    total = int((stop - start).sum())
    if total > max_samples:
        return _total_problem(total, max_samples)
    order = np.lexsort((start, shard))
    overlap = (shard[order][1:] == shard[order][:-1]) & (start[order][1:] < stop[order][:-1])
    if overlap.any():
        k = int(np.flatnonzero(overlap)[0])
        i, j = sorted((int(order[k]), int(order[k + 1])))
        return (f"ranges {i} [{int(start[i])}, {int(stop[i])}) and {j} [{int(start[j])}, "
                f"{int(stop[j])}) of shard {shards[int(shard[i])]} overlap: a request names "
                "each sample at most once")
    return None
