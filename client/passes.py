"""What one iterator of a DataLoader reads: its pass, planned, and the pass read ahead after it.

A pass (:class:`~dataflow.client.cursor.Pass`) is planned with :mod:`dataflow.plan` into this
rank's batches and their transform tags. Its batches are a stretch of one hand-off generation
(:mod:`dataflow.client.handoff`): the generation started for it, or the one the pass before it
was reading when this pass was appended to it ahead of time (:class:`Ahead`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dataflow.client.config import LoaderConfig
from dataflow.client.cursor import Pass
from dataflow.client.handoff import Tags
from dataflow.errors import InternalError
from dataflow.plan import Batches, epoch_size, rank_batches
from dataflow.transform import global_batch_index


@dataclass
class Run:
    """The batches one iterator yields, valid while the loader's generation is ``gen``: ``n``
    batches of pass ``span``, batches ``base``... of the hand-off's generation ``stream``
    (once requested: ``pending`` until then)."""

    gen: int
    n: int
    yielded: int = 0
    span: Pass = Pass(0, 0)
    stream: int = 0
    base: int = 0
    ahead: bool = False  # the pass after it was appended to ``stream``
    pending: bool = False  # not requested yet: planned and requested at its first ``next()``


@dataclass(frozen=True)
class Ahead:
    """Pass ``span`` (its ``batches``) was appended to the hand-off's generation ``stream``
    from batch ``base`` on: read while the pass before it ended."""

    span: Pass
    batches: Batches
    stream: int
    base: int


T = TypeVar("T")


class PassIterator(Generic[T]):
    """One pass's iterator over ``batches`` (a generator) that, once it raised, raises the
    same error on every later ``next()``: a generator that raised only stops, so a loop that
    caught the error and went on would see a short epoch."""

    def __init__(self, batches: Iterator[T]) -> None:
        self._batches = batches
        self._error: Exception | None = None

    def __iter__(self) -> PassIterator[T]:
        return self

    def __next__(self) -> T:
        if self._error is not None:
            raise self._error
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except Exception as e:
            self._error = e
            raise


def after(span: Pass) -> Pass:
    """The pass that follows ``span`` once it completes: the next epoch, from its start."""
    return Pass(span.epoch + 1, 0)


def plan_pass(cfg: LoaderConfig, sizes: Sequence[int], span: Pass) -> tuple[Batches, Tags]:
    """This rank's batches of ``span`` (over shards of ``sizes`` samples) and their tags.

    Raises:
        InternalError: the plan does not have the epoch size's batch count.
    """
    batches = rank_batches(sizes, world_size=cfg.world_size, rank=cfg.rank, epoch=span.epoch,
                           seed=cfg.seed, batch_size=cfg.batch_size, drop_last=cfg.drop_last,
                           start=span.start, shuffle=cfg.shuffle)
    expected = epoch_size(sum(sizes), world_size=cfg.world_size, batch_size=cfg.batch_size,
                          drop_last=cfg.drop_last, start=span.start).batches_per_rank
    if len(batches) != expected:
        raise InternalError(f"plan has {len(batches)} batches; expected {expected}")
    return batches, Tags(cfg.seed, span.epoch, global_batch_index(
        start=span.start, batch_size=cfg.batch_size, world_size=cfg.world_size, rank=cfg.rank,
        index=0), cfg.world_size)
