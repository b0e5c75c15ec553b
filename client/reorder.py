"""In-order delivery of batches that arrive in any order. Pure, no sockets."""

from __future__ import annotations

from typing import Generic, TypeVar

from dataflow.errors import InternalError

T = TypeVar("T")


class Reorder(Generic[T]):
    """Holds early batches of one stream generation and releases them in order.

    Args:
        first: index of the first batch to release.
        capacity: most batches held at once (the scheduler's depth); more is a bug.

    Thread invariant: used by the I/O thread only.
    """

    def __init__(self, first: int, capacity: int) -> None:
        self.next = first
        self._capacity = capacity
        self._early: dict[int, T] = {}

    def grow(self, capacity: int) -> None:
        """Hold up to ``capacity`` batches from now on (the depth grew; it never shrinks)."""
        if capacity < self._capacity:
            raise InternalError(f"reorder capacity {self._capacity} cannot shrink to {capacity}")
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._early)

    def add(self, index: int, item: T) -> list[tuple[int, T]]:
        """Accept batch ``index``; return the ``(index, item)`` pairs now due, in order.

        Raises:
            InternalError: ``index`` was already released or is held, or the buffer would
                exceed its capacity.
        """
        if index < self.next or index in self._early:
            raise InternalError(f"batch {index} arrived twice (next due: {self.next})")
        if len(self._early) >= self._capacity:
            raise InternalError(f"reorder buffer over its capacity {self._capacity} "
                                f"(next due: {self.next}, holding {sorted(self._early)[:8]})")
        self._early[index] = item
        out = []
        while self.next in self._early:
            out.append((self.next, self._early.pop(self.next)))
            self.next += 1
        return out

    def clear(self) -> list[T]:
        """Drop every held batch; returns them (so their buffers can be released)."""
        held = list(self._early.values())
        self._early.clear()
        return held
