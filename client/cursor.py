"""Where a DataLoader is in its epochs: the iteration semantics, as a pure state machine.

The rules (the semantics of torch's DataLoader with a DistributedSampler, made safe for
resume):

* Every pass (``iter(loader)``, a ``for`` loop) is one full pass over the current epoch,
  whatever earlier passes did: a pass abandoned before its iterator reached its end (a peek, a
  ``break``, a validation sanity check) consumes nothing for the next one, so every rank yields
  the same number of batches.
* A pass is complete when its iterator reached its end (``next()`` raised StopIteration, as a
  ``for`` loop that runs out does), not when it yielded its last batch: a peek at an epoch of
  one batch does not complete it. The pass after a complete one starts the next epoch (each
  pass reshuffles, even without :meth:`set_epoch`); :meth:`set_epoch` chooses the epoch
  explicitly (the whole epoch, even one completed before).
* After :meth:`load`, passes of the saved epoch start where the state was taken, until one
  completes; a following :meth:`set_epoch` with the state's epoch keeps that position (the
  usual loop calls ``set_epoch(epoch)`` right after ``load_state_dict``), another epoch drops
  it, and once a pass from it completed, ``set_epoch`` of that epoch again means the whole
  epoch, as for a loader that never resumed. A state taken right after an epoch's last batch
  resumes as "epoch complete": the next pass is the next epoch, or an empty pass after
  ``set_epoch`` of the saved epoch.
* The position (:attr:`EpochCursor.position`) counts the batches of the current pass only
  while its iterator can still go on (the caller says so: the program still holds it), so a
  state taken after a peek whose iterator is gone describes what the next pass yields.

Positions are counted in samples of the epoch's global order (:mod:`dataflow.plan`):
``start`` samples were consumed before the current pass, and after ``k`` batches of a pass
on ``W`` ranks, :func:`dataflow.plan.consumed` gives the consumed prefix, whatever ``W``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.errors import InternalError


@dataclass(frozen=True)
class Pass:
    """One pass: epoch ``epoch`` from sample ``start`` of its global order."""

    epoch: int
    start: int


class EpochCursor:
    """The epoch and position of one loader (pure; no I/O).

    Args:
        total: samples in one epoch's global order (the end position).
    """

    def __init__(self, total: int) -> None:
        self._total = total
        self.epoch = 0
        self._start = 0
        self._resumed = False  # ``_start`` is a loaded position no pass completed from yet
        self._completed = False
        self._yielded = 0
        self._active = False

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass cover ``epoch`` (keeping a loaded position of that epoch that no
        pass completed from yet)."""
        if epoch != self.epoch or not self._resumed:
            self._start = 0
            self._resumed = False
        self.epoch = epoch
        self._completed = False
        self._yielded = 0
        self._active = False

    def load(self, epoch: int, start: int) -> None:
        """Resume: the next passes of ``epoch`` start at ``start`` (``total``: it is complete).

        Raises:
            InternalError: ``start`` is outside ``[0, total]`` (callers validate first).
        """
        if not 0 <= start <= self._total:
            raise InternalError(f"start {start} outside [0, {self._total}]")
        self.epoch = epoch
        self._start = start
        self._resumed = True
        self._completed = start == self._total and start > 0
        self._yielded = 0
        self._active = False

    def begin(self) -> Pass:
        """Start a pass; returns what it covers."""
        if self._completed:
            self.epoch += 1
            self._start = 0
            self._resumed = False
            self._completed = False
        self._yielded = 0
        self._active = True
        return Pass(self.epoch, self._start)

    def yielded(self) -> None:
        """The current pass yielded a batch."""
        if not self._active:
            raise InternalError("a batch was yielded outside a pass")
        self._yielded += 1

    def end(self) -> None:
        """The current pass's iterator reached its end: the pass is complete."""
        if not self._active:
            raise InternalError("a pass ended that was not under way")
        self._active = False
        self._completed = True
        self._resumed = False

    def position(self, live: bool) -> tuple[int, int, int]:
        """``(epoch, start, batches)``: the current pass's epoch and start, and the batches it
        yielded when ``live`` (its iterator can still go on; else 0: the next pass starts
        over) — ``(epoch, total, 0)`` once the epoch is complete."""
        if self._completed:
            return self.epoch, self._total, 0
        return self.epoch, self._start, self._yielded if live and self._active else 0
