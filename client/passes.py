"""A pass planned for this rank, and the iterator a DataLoader hands out for one.

A pass (:class:`~dataflow.client.cursor.Pass`: an epoch from a start position) is planned with
:mod:`dataflow.plan` into this rank's batches, each with the tag its server's transform sees
(:class:`~dataflow.wire.BatchTag`): a :class:`PassPlan`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from dataflow.client.cursor import Pass
from dataflow.errors import InternalError
from dataflow.plan import Batches, epoch_size, rank_batches
from dataflow.transform import global_batch_index
from dataflow.wire import BatchTag

if TYPE_CHECKING:
    from dataflow.client.config import LoaderConfig


@dataclass(frozen=True)
class PassPlan:
    """This rank's batches of pass ``span``: batch ``i`` reads ``batches.rows(i)`` and is
    global batch ``first + i * stride`` of the epoch (:func:`dataflow.transform.
    global_batch_index`), read under the loader's ``seed``."""

    span: Pass
    batches: Batches
    seed: int = 0
    first: int = 0
    stride: int = 1
    count: int = field(init=False, repr=False, compare=False)  # its batches (immutable)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", len(self.batches))

    def __len__(self) -> int:
        return self.count

    def rows(self, i: int) -> np.ndarray:
        """Batch ``i``'s ``(shard, start, stop)`` rows: int64 of shape ``(ranges, 3)``."""
        return self.batches.rows(i)

    def tag(self, i: int) -> BatchTag:
        """Batch ``i``'s (seed, epoch, global batch index)."""
        return BatchTag(self.seed, self.span.epoch, self.first + i * self.stride)

    def run_end(self, i: int) -> int:
        """A request may carry batches up to the pass's end (within an epoch each sample is
        read once, but for the padded tail)."""
        return self.count


def plan_pass(cfg: LoaderConfig, sizes: Sequence[int], span: Pass) -> PassPlan:
    """This rank's plan of ``span`` over shards of ``sizes`` samples.

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
    first = global_batch_index(start=span.start, batch_size=cfg.batch_size,
                               world_size=cfg.world_size, rank=cfg.rank, index=0)
    return PassPlan(span, batches, cfg.seed, first, cfg.world_size)


def after(span: Pass) -> Pass:
    """The pass that follows ``span`` once it completes: the next epoch, from its start."""
    return Pass(span.epoch + 1, 0)


T = TypeVar("T")


class PassIterator(Generic[T]):
    """One pass's iterator over ``batches`` (a generator) that, once it raised, raises the
    same error on every later ``next()``: a generator that raised only stops, so a loop that
    caught the error and went on would see a short epoch. ``finish`` (the user's
    ``collate_fn``) makes what ``next()`` returns of each batch; an error it raises is the
    caller's for that batch only: the next ``next()`` goes on."""

    def __init__(self, batches: Iterator[T], finish: Callable[[T], Any] | None = None) -> None:
        self._batches = batches
        self._finish = finish
        self._error: Exception | None = None

    def __iter__(self) -> PassIterator[T]:
        return self

    def __next__(self) -> Any:
        if self._error is not None:
            raise self._error
        try:
            batch = next(self._batches)
        except StopIteration:
            raise
        except Exception as e:
            self._error = e
            raise
        return batch if self._finish is None else self._finish(batch)
