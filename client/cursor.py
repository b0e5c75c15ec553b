"""Where a DataLoader is in its epochs: the iteration semantics, as a pure state machine.

The rules (the semantics of torch's DataLoader with a DistributedSampler, made safe for
resume):

* Every pass (``iter(loader)``, a ``for`` loop) is one full pass over the current epoch,
  whatever earlier passes did: a pass abandoned after a few batches (a peek, a ``break``, a
  validation sanity check) consumes nothing for the next one, so every rank yields the same
  number of batches.
* Once a pass has yielded its last batch, the next pass starts the next epoch (each pass
  reshuffles, even without :meth:`set_epoch`); :meth:`set_epoch` chooses the epoch explicitly.
* After :meth:`load`, passes of the saved epoch start where the state was taken, until one
  completes; a following :meth:`set_epoch` with the state's epoch keeps that position (the
  usual loop calls ``set_epoch(epoch)`` right after ``load_state_dict``), another epoch drops
  it. A state taken right after an epoch's last batch resumes as "epoch complete": the next
  pass is the next epoch, or an empty pass after ``set_epoch`` of the saved epoch.

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
        self._completed = False
        self._yielded = 0
        self._active = False

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass cover ``epoch`` (keeping a loaded position of that epoch)."""
        if epoch != self.epoch:
            self._start = 0
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
        self._completed = start == self._total and start > 0
        self._yielded = 0
        self._active = False

    def begin(self) -> Pass:
        """Start a pass; returns what it covers."""
        if self._completed:
            self.epoch += 1
            self._start = 0
            self._completed = False
        self._yielded = 0
        self._active = True
        return Pass(self.epoch, self._start)

    def yielded(self, last: bool) -> None:
        """The current pass yielded a batch (``last``: its final one)."""
        if not self._active:
            raise InternalError("a batch was yielded outside a pass")
        self._yielded += 1
        if last:
            self.end()

    def end(self) -> None:
        """The current pass yielded its final batch (or had none)."""
        self._active = False
        self._completed = True

    @property
    def position(self) -> tuple[int, int, int]:
        """``(epoch, start, batches)``: the current pass's epoch and start and the batches it
        yielded — ``(epoch, total, 0)`` once the epoch is complete."""
        if self._completed:
            return self.epoch, self._total, 0
        return self.epoch, self._start, self._yielded
