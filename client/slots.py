"""One request to a server, from when the scheduler decides it until its reply."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow import wire
from dataflow.errors import ProtocolError


@dataclass(frozen=True, eq=False)
class Slot:
    """Request ``req_id`` to server number ``server``, for batch ``index`` of stream
    generation ``gen``; it goes on the wire as :meth:`request`.

    Attributes:
        ranges: int64 array of shape ``(n, 3)``: the batch's ``(shard, start, stop)`` rows.
        tag: the batch's (seed, epoch, global batch index), for the server's transform.
        retry: the batch was requested before (from a lost server, or after a request that
            took longer than ``request_timeout``).
        sent: when the request was sent (the scheduler's clock).
        queued: the requests its server held when it was sent, itself counted (for the
            server's service time, :mod:`dataflow.client.shares`).
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

    @property
    def samples(self) -> int:
        """Samples the batch holds (the sum of its ranges' ``stop - start``)."""
        return int((self.ranges[:, 2] - self.ranges[:, 1]).sum())

    def request(self) -> wire.Request:
        """The REQUEST message."""
        return wire.Request(self.req_id, self.ranges, self.tag)

    def check_size(self, endpoint: str, size: int, skipped: int) -> None:
        """Check a BATCH for this request: ``size`` samples served plus ``skipped`` left out
        (damaged, server ``--on-error skip``) must be the samples asked for.

        Raises:
            ProtocolError: naming the endpoint, the request and the counts.
        """
        if size + skipped != self.samples:
            raise ProtocolError(f"{endpoint}: BATCH {self.req_id} has {size} samples and "
                                f"{skipped} skipped; the request asked for {self.samples}")
