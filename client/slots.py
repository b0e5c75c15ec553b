"""What one outstanding request is for, and one request to send."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.errors import ProtocolError
from dataflow.wire import NO_TAG, BatchTag


@dataclass(frozen=True)
class Slot:
    """What an outstanding request is for: batch ``index`` of epoch generation ``gen``.

    Attributes:
        samples: samples the batch holds (the sum of its ranges' ``stop - start``).
        retry: the request asks again for a batch requested before (from a lost server, or
            after a request that took longer than ``request_timeout``).
        sent: when the request was sent (the scheduler's clock).
        tag: the batch's (seed, epoch, global batch index).
    """

    gen: int
    index: int
    samples: int
    retry: bool = False
    sent: float = field(default=0.0, compare=False)
    tag: BatchTag = field(default=NO_TAG, compare=False)

    def check_size(self, endpoint: str, req_id: int, size: int, skipped: int) -> None:
        """Check a BATCH for this request: ``size`` samples served plus ``skipped`` left out
        (damaged, server ``--on-error skip``) must be the samples asked for.

        Raises:
            ProtocolError: naming the endpoint, the request and the counts.
        """
        if size + skipped != self.samples:
            raise ProtocolError(f"{endpoint}: BATCH {req_id} has {size} samples and {skipped} "
                                f"skipped; the request asked for {self.samples}")


@dataclass(frozen=True)
class Assignment:
    """Send a REQUEST for batch ``index`` to server number ``server``.

    Attributes:
        ranges: int64 array of shape ``(n, 3)``: the batch's ``(shard, start, stop)`` rows.
        retry: the batch was requested before (from a lost server, or a late one).
        tag: the batch's (seed, epoch, global batch index), for the server's transform.
    """

    server: int
    req_id: int
    index: int
    ranges: np.ndarray
    retry: bool
    tag: BatchTag = NO_TAG
