"""A server transform that takes a while and no CPU: :func:`sleep` stands in for a decode on
cores of its own, or an object store's wait. This module imports no torch: reader processes
import it."""

from __future__ import annotations

import time

from dataflow.batch import Batch

SLEEP_S = 0.02


def sleep(batch: Batch) -> Batch:
    """``SLEEP_S`` a batch, the batch unchanged."""
    time.sleep(SLEEP_S)
    return batch
