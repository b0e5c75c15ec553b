"""The next pass's plan, worked out in the background while the current pass is read.

A rank's plan of an epoch is numpy work over every sample of the epoch's order (0.03 s for
1.28 M samples on 8 ranks, 0.1-0.4 s for 4 M on 8 or 1, 0.8-1.1 s for 10 M on 1:
:func:`dataflow.plan.rank_batches`).
Worked out when the consumer's ``next()`` reaches the end of an epoch, it stalled the training
loop (and the GPU) that long once an epoch. :class:`Planner` works out the pass after the
current one as soon as the current one is sought, on a thread of its own (numpy's large
operations let go of the GIL), and hands it over when the stream asks for it; a pass it was
not asked to prepare (a resume, ``set_epoch``) is worked out on the spot, as before. A plan is
a pure function of its pass, so where it is worked out changes nothing it holds.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Generic, TypeVar

from dataflow.client.cursor import Pass

P = TypeVar("P")


class Planner(Generic[P]):
    """``plan(span)``, prepared ahead for one pass at a time (see the module).

    Thread invariant: :meth:`prepare` and :meth:`__call__` are called by one thread (the
    consumer's); ``plan`` runs on the planner's thread or the caller's.
    """

    def __init__(self, plan: Callable[[Pass], P]) -> None:
        self._plan = plan
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dataflow-plan")
        self._ahead: tuple[Pass, concurrent.futures.Future[P]] | None = None

    def prepare(self, span: Pass) -> None:
        """Start working out ``span``'s plan (one prepared plan is kept: the latest)."""
        if self._ahead is not None and self._ahead[0] == span:
            return
        self._drop()
        self._ahead = (span, self._pool.submit(self._plan, span))

    def __call__(self, span: Pass) -> P:
        """``span``'s plan: the prepared one (waited for), else worked out now.

        Raises:
            Exception: what ``plan`` raised, for the prepared plan as for one worked out now.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == span:
            return ahead[1].result()
        if ahead is not None:
            ahead[1].cancel()
        return self._plan(span)

    def _drop(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def close(self) -> None:
        """Drop the prepared plan and stop the thread (it finishes a plan it is working
        out; idempotent)."""
        self._drop()
        self._pool.shutdown(wait=False, cancel_futures=True)
