"""The public API of server-side transforms (``dataflow-server --transform module:function``).

A transform is a function run by the server's reader processes on every batch before it is
sent to the trainer::

    def decode(batch: Batch, ctx: TransformContext) -> Batch: ...

* ``batch`` is a :data:`~dataflow.batch.Batch`: ``dict[str, numpy.ndarray | Ragged]``, every
  column holding the same number of samples ``n`` (a fixed field is an array of shape
  ``(n, *shape)``, a variable-length field a :class:`~dataflow.batch.Ragged`). The transform
  may change, add or remove fields and change dtypes and shapes, but must return a dict of the
  same ``n`` samples in the same order (the client checks the count).
* ``ctx`` is a :class:`TransformContext`: the epoch, the global batch index and a per-batch
  seed derived from (the DataLoader's ``seed``, epoch, global batch index). Random
  augmentations drawn from ``ctx.rng()`` are the same on any server, with any number of reader
  processes, on a re-request after a server loss, and after a resume.
* A one-argument function ``f(batch)`` is called without the context (see
  :func:`takes_context`).

A transform may instead be split in two stages, a :class:`Stages` named by ``--transform``
(``module:NAME`` where ``NAME`` is a ``Stages``): a deterministic ``decode`` whose output for a
sample depends on that sample only (the server may cache it, keyed by the shard, the row and
the stage's identity) and a random ``augment`` run on the assembled batch with the context as
above. A plain function is one stage, never cached.

This module needs numpy only (no torch, no sockets).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataflow.batch import Batch, Column, Ragged
from dataflow.checks import check_int
from dataflow.errors import ConfigError

__all__ = ["Batch", "Column", "Ragged", "Stages", "TransformContext", "batch_seed",
           "global_batch_index", "takes_context"]

SEED_MAX = 2**63 - 1
_WORD = 0xFFFFFFFF


def batch_seed(seed: int, epoch: int, batch_index: int) -> int:
    """The seed of global batch ``batch_index`` of ``epoch`` under the loader's ``seed``.

    A pure function (numpy's ``SeedSequence`` over the three values, each as two 32-bit
    words, so distinct triples never share an input), stable across platforms and numpy
    versions.

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        ConfigError: an argument is not an integer in ``[0, 2**63)``.
    """
    values = [check_int(name, value, 0, SEED_MAX) for name, value in
              (("seed", seed), ("epoch", epoch), ("batch_index", batch_index))]
    words = [w for v in values for w in (v & _WORD, v >> 32)]
    lo, hi = np.random.SeedSequence(words).generate_state(2, np.uint32).tolist()
    return (lo | hi << 32) & SEED_MAX


@dataclass(frozen=True)
class TransformContext:
    """What a transform knows about the batch it is given.

    Attributes:
        seed: the per-batch seed, ``batch_seed(loader seed, epoch, batch_index)``.
        epoch: the epoch the batch belongs to.
        batch_index: the global batch index in the epoch: batch ``g`` holds positions
            ``[g * batch_size, (g + 1) * batch_size)`` of the epoch's order, whatever the
            number of ranks (rank ``r`` of ``W`` reads ``g = r, r + W, ...``).
        shards: the batch's ``(shard path, start, stop)`` sample ranges, shard paths relative
            to the dataset root; for messages and logs.
    """

    seed: int
    epoch: int
    batch_index: int
    shards: tuple[tuple[str, int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("seed", "epoch", "batch_index"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 0, SEED_MAX))

    def rng(self) -> np.random.Generator:
        """A fresh generator seeded with :attr:`seed` (same draws for the same batch)."""
        return np.random.default_rng(self.seed)

    def describe(self, limit: int = 4) -> str:
        """``batch 7 of epoch 2 (a.tar[0:16], b.tar[3:9])``: the batch, for error messages."""
        rows = [f"{path}[{start}:{stop}]" for path, start, stop in self.shards[:limit]]
        if len(self.shards) > limit:
            rows.append(f"... {len(self.shards) - limit} more range(s)")
        where = f" ({', '.join(rows)})" if rows else ""
        return f"batch {self.batch_index} of epoch {self.epoch}{where}"


@dataclass(frozen=True)
class Stages:
    """A transform in two stages: ``decode`` (deterministic, cacheable) then ``augment``.

    ``decode(batch) -> batch`` is given any subset of samples (a batch, or the samples of one
    the server's cache missed) and must return the same samples in the same order; sample
    ``i``'s output must depend on sample ``i`` only (no randomness, no batch statistics, no
    padding to the batch's longest), so that decoding it alone, in another batch or in an
    earlier epoch gives the same columns. ``augment(batch, ctx) -> batch`` (or
    ``augment(batch)``, :func:`takes_context`) runs on the decoded batch, with the batch's
    context as a one-stage transform does; None: none.

    Attributes:
        decode: the deterministic stage.
        augment: the random stage, or None.
        version: part of the decode stage's identity (with its module and qualified name):
            bump it when ``decode`` changes what it returns, so no cached entry of the old
            one is served.
    """

    decode: Callable[[Batch], Batch]
    augment: Callable[..., Batch] | None = None
    version: str = "1"

    def __post_init__(self) -> None:
        if not callable(self.decode):
            raise ConfigError(f"Stages `decode` must be callable. Found: "
                              f"{type(self.decode).__name__}")
        if self.augment is not None and not callable(self.augment):
            raise ConfigError(f"Stages `augment` must be callable or None. Found: "
                              f"{type(self.augment).__name__}")
        if not isinstance(self.version, str) or not self.version:
            raise ConfigError(f"Stages `version` must be a non-empty string. Found: "
                              f"{self.version!r}")

    @property
    def identity(self) -> str:
        """``module:qualname@version`` of the decode stage: what its cached entries are
        keyed by."""
        module = getattr(self.decode, "__module__", None) or "?"
        name = getattr(self.decode, "__qualname__", None) or type(self.decode).__name__
        return f"{module}:{name}@{self.version}"


def global_batch_index(*, start: int, batch_size: int, world_size: int, rank: int,
                       index: int) -> int:
    """The global index of batch ``index`` of rank ``rank`` in a pass that starts ``start``
    samples into the epoch's order (:mod:`dataflow.plan`).

    Rank ``r`` of ``W`` reads global batches ``g = j * W + r`` of the rest of the epoch, so
    counted from the epoch's start it is ``start // batch_size + j * W + r``: batch ``g``
    starts at position ``g * batch_size`` of the order whatever ``W``, also after a resume on
    another number of ranks (``start`` is then a multiple of ``batch_size``).
    """
    return start // batch_size + index * world_size + rank


def takes_context(func: Callable[..., Any]) -> bool:
    """Whether ``func`` is called as ``func(batch, ctx)`` rather than ``func(batch)``.

    It is when its signature has a second positional parameter without a default, or
    ``*args``; ``f(batch, scale=1.0)`` keeps the one-argument call. A callable whose signature
    cannot be read (some builtins) gets one argument.
    """
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty
