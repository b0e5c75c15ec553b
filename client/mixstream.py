"""A mixture's stream of batches as each source's stream of parts. Pure, no sockets.

A :class:`~dataflow.client.mixture.MixtureLoader` reads one stream of mixture batches
(:class:`~dataflow.client.stream.Stream` of :class:`MixturePass`: its passes, generations and
read-ahead are a DataLoader's), and each source's servers read that source's parts of them
(:mod:`dataflow.mixture`): one :class:`~dataflow.client.stream.Demand` per source, of its
:class:`SourcePass` of each mixture pass, numbered on from the parts of the passes before.
A :class:`Projection` keeps the sources' demands in step with the mixture's, and says where a
mixture batch's parts are in the sources' streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.client.cursor import Pass
from dataflow.client.stream import Demand
from dataflow.errors import InternalError
from dataflow.mixture import MixtureBatches, Part
from dataflow.plan import Batches
from dataflow.wire import BatchTag


@dataclass(frozen=True)
class SourcePass:
    """One source's parts of a mixture pass, what its servers read: part ``i`` reads
    ``rows(i)``, of the pass's batch ``index[i]`` (global batch ``first + index[i] *
    stride``), tagged with the source's own seed (:func:`dataflow.mixture.source_seed`)."""

    span: Pass
    parts: Batches
    index: np.ndarray
    runs: np.ndarray
    seed: int
    first: int
    stride: int

    def __len__(self) -> int:
        return len(self.parts)

    def rows(self, i: int) -> np.ndarray:
        """Part ``i``'s ``(shard, start, stop)`` rows: int64 of shape ``(ranges, 3)``."""
        return self.parts.rows(i)

    def tag(self, i: int) -> BatchTag:
        """Part ``i``'s (source seed, epoch, global batch index), for the server's transform."""
        return BatchTag(self.seed, self.span.epoch, self.first + int(self.index[i]) * self.stride)

    def run_end(self, i: int) -> int:
        """One past the last part one request from part ``i`` may carry: within one pass over
        the source (:attr:`dataflow.mixture.MixtureBatches.runs`)."""
        return int(self.runs[i])


@dataclass(frozen=True)
class MixturePass:
    """This rank's batches of one mixture pass (``span``: a mixture epoch from a consumed slot
    count), and each source's parts of them."""

    span: Pass
    batches: MixtureBatches
    sources: tuple[SourcePass, ...]

    @classmethod
    def of(cls, span: Pass, batches: MixtureBatches, seeds: Sequence[int]) -> MixturePass:
        return cls(span, batches, tuple(
            SourcePass(span, batches.parts[k], batches.index[k], batches.runs[k], seeds[k],
                       batches.first, batches.stride) for k in range(batches.sources)))

    def __len__(self) -> int:
        return len(self.batches)

    def parts(self, j: int) -> list[tuple[Part, int]]:
        """Batch ``j``'s parts, in source order, each with its number among its source's
        parts of this pass."""
        return [(part, self.batches.part_of(part.source, j)) for part in self.batches.batch(j)]


class Projection:
    """Each source's demand of the mixture's latest demand (see the module).

    Args:
        sources: the number of sources.

    Thread invariant: used by the consumer's thread only.
    """

    def __init__(self, sources: int) -> None:
        self._sources = sources
        self.demand: Demand[MixturePass] = Demand()
        self._firsts = [0] * sources  # where demand.passes[0]'s parts start, per source

    def project(self, demand: Demand[MixturePass]) -> list[Demand[SourcePass]]:
        """The sources' demands once the mixture's is ``demand`` (the same generation grown,
        or advanced past its first passes; or a new generation from batch 0).

        Raises:
            InternalError: ``demand`` does not follow the last one so.
        """
        last = self.demand
        if demand.gen != last.gen:
            if demand.first != 0:
                raise InternalError(f"generation {demand.gen} starts at batch {demand.first}")
            self._firsts = [0] * self._sources
        else:
            at, passes = last.first, list(last.passes)
            while at < demand.first and passes:
                dropped = passes.pop(0)
                at += len(dropped)
                self._firsts = [f + len(s) for f, s in zip(self._firsts, dropped.sources,
                                                           strict=True)]
            if at != demand.first:
                raise InternalError(f"mixture demand of generation {demand.gen} from batch "
                                    f"{demand.first} after one from {last.first}")
        self.demand = demand
        return [Demand(demand.gen, tuple(p.sources[k] for p in demand.passes), self._firsts[k])
                for k in range(self._sources)]

    def locate(self, index: int) -> tuple[MixturePass, int, list[int]]:
        """Mixture batch ``index`` of the current demand: its pass, its number in that pass,
        and where that pass's parts start in each source's stream.

        Raises:
            InternalError: ``index`` is not a batch of the current demand.
        """
        d, at, firsts = self.demand, self.demand.first, list(self._firsts)
        for p in d.passes:
            if at <= index < at + len(p):
                return p, index - at, firsts
            at += len(p)
            firsts = [f + len(s) for f, s in zip(firsts, p.sources, strict=True)]
        raise InternalError(f"mixture batch {index} is outside generation {d.gen}'s batches "
                            f"[{d.first}, {d.end})")
