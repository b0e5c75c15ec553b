"""One request to a server, from when the scheduler decides it until its reply."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dataflow import wire
from dataflow.errors import ProtocolError

NO_ROWS = np.empty((0, 3), dtype=np.int64)
NO_ROWS.flags.writeable = False


def announced(batches: Iterable[np.ndarray], limit: int) -> np.ndarray:
    """The first ``limit`` samples of ``batches`` (each int64 ``(shard, start, stop)`` rows,
    in the order they are read), as one ``(m, 3)`` array: what a REQUEST announces its
    session reads next (its ``ahead``); its last range is cut to end at the limit."""
    out: list[np.ndarray] = []
    left = limit
    if left > 0:
        for rows in batches:
            sizes = rows[:, 2] - rows[:, 1]
            total = int(sizes.sum())
            if total < left:
                out.append(rows)
                left -= total
                continue
            ends = np.cumsum(sizes)
            k = int(np.searchsorted(ends, left))  # the range holding the last sample kept
            part = rows[:k + 1].copy()
            part[k, 2] = part[k, 1] + left - (int(ends[k - 1]) if k else 0)
            out.append(part)
            break
    return np.concatenate(out) if out else NO_ROWS


@dataclass(frozen=True, eq=False)
class Slot:
    """Request ``req_id`` to server number ``server``, for batch ``index`` of stream
    generation ``gen`` (and the batches after it of ``parts``); it goes on the wire as
    :meth:`request`.

    Attributes:
        ranges: int64 array of shape ``(n, 3)``: the batches' ``(shard, start, stop)`` rows.
        tag: the (first) batch's (seed, epoch, global batch index), for the server's
            transform.
        retry: the batch was requested before (from a lost server, or after a request that
            took longer than ``request_timeout``).
        sent: when the request was sent (the scheduler's clock).
        queued: the requests its server held when it was sent, itself counted (for the
            server's service time, :mod:`dataflow.client.shares`).
        parts: the batches ``index, index + 1, ...`` the request carries, 2 or more (their
            rows of ``ranges`` and their tags), or empty: batch ``index`` alone.
        ahead: the rows the session reads after these batches, announced to the server's
            cache (:func:`announced`), or empty: none.
        indexes: the stream indexes of the batches the request carries.
        samples: samples the batches hold (the sum of their ranges' ``stop - start``).
    """

    server: int
    req_id: int
    gen: int
    index: int
    ranges: np.ndarray
    tag: wire.BatchTag
    retry: bool
    sent: float
    queued: int = 1
    parts: tuple[wire.Part, ...] = ()
    ahead: np.ndarray = field(default_factory=lambda: NO_ROWS)

    indexes: range = field(init=False, repr=False)
    samples: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "indexes",
                           range(self.index, self.index + max(1, len(self.parts))))
        object.__setattr__(self, "samples", int((self.ranges[:, 2] - self.ranges[:, 1]).sum()))

    def request(self) -> wire.Request:
        """The REQUEST message."""
        if self.parts:
            return wire.Request(self.req_id, self.ranges, parts=self.parts, ahead=self.ahead)
        return wire.Request(self.req_id, self.ranges, self.tag, ahead=self.ahead)

    def check_size(self, endpoint: str, msg: wire.BatchMsg) -> None:
        """Check BATCH ``msg`` for this request: it carries as many batches, and each one's
        samples served plus those left out (damaged, server ``--on-error skip``) are the
        samples asked for, ``msg.skipped`` in all.

        Raises:
            ProtocolError: naming the endpoint, the request and the counts.
        """
        if len(msg.parts) != (len(self.parts) if self.parts else 0):
            raise ProtocolError(f"{endpoint}: BATCH {self.req_id} carries "
                                f"{max(1, len(msg.parts))} batches; the request asked for "
                                f"{max(1, len(self.parts))}")
        if msg.size + msg.skipped != self.samples:
            raise ProtocolError(f"{endpoint}: BATCH {self.req_id} has {msg.size} samples and "
                                f"{msg.skipped} skipped; the request asked for {self.samples}")
        row = 0
        for j, (part, size) in enumerate(zip(self.parts, msg.parts, strict=True)):
            rows = self.ranges[row : row + part.rows]
            asked = int((rows[:, 2] - rows[:, 1]).sum())
            if size > asked:
                raise ProtocolError(f"{endpoint}: BATCH {self.req_id} has {size} samples in "
                                    f"its batch {j}; the request asked for {asked}")
            row += part.rows

    def left_out(self, msg: wire.BatchMsg) -> list[tuple[int, ...] | None]:
        """Per batch of BATCH ``msg`` (checked with :meth:`check_size`), which of its planned
        samples the server left out: positions in the batch's plan, from ``msg.left_out``;
        None for a short batch when the server did not say which."""
        served = msg.parts or (msg.size,)
        if not msg.skipped:
            return [()] * len(served)
        bounds = [0]
        row = 0
        for part in self.parts or (wire.Part(len(self.ranges), self.tag),):
            rows = self.ranges[row : row + part.rows]
            bounds.append(bounds[-1] + int((rows[:, 2] - rows[:, 1]).sum()))
            row += part.rows
        if not msg.left_out:
            return [None if b - a > n else () for a, b, n in zip(bounds[:-1], bounds[1:], served,
                                                                  strict=True)]
        runs = msg.left_out
        left = np.concatenate([np.arange(a, b) for a, b in zip(runs[::2], runs[1::2],
                                                                strict=True)])
        cuts = np.searchsorted(left, bounds)
        return [tuple((left[i:j] - a).tolist()) for a, i, j in zip(bounds, cuts, cuts[1:],
                                                                   strict=False)]
