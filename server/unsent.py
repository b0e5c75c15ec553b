"""Bytes of replies the readers hold that ZeroMQ has not written to a client yet.

A reader says SENT (with the reply's bytes) just before it hands a reply to ZeroMQ, and DONE
once ZeroMQ let go of it (written to the client's connection, or dropped with a connection the
kernel closed) or the reader dropped it. In between, the bytes are in the reader's memory,
whatever happened to the request's credit or session: a client that does not read its data
connection keeps them there until the kernel closes that connection (``TCP_USER_TIMEOUT``).

:class:`Unsent` counts them per reader and session (to forget a dead reader's), per peer
address and in total. The frontend hands no request to a reader while the total is at
``limit``, nor one of an address at ``address_limit`` (:meth:`Unsent.blocked`): such requests
wait in their queue. So the readers hold at most ``limit`` bytes of replies written or being
written, plus the replies of the requests handed to them before the gate closed (at most
``workers x worker_queue`` replies). A reader's own count is its ZeroMQ I/O thread's backlog:
of two readers with room, a request goes to the one with less
(:func:`~dataflow.server.pool.least_loaded`).

Pure bookkeeping: no sockets, no clock. Thread invariant: used only by the frontend's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from dataflow.errors import InternalError

K = TypeVar("K")


@dataclass
class _Held:
    address: str
    nbytes: int = 0


class Unsent:
    """Reply bytes held by readers, by (reader, session token), by address and in total.

    Args:
        limit: bytes over all readers beyond which no request is dispatched.
        address_limit: bytes of one peer address beyond which its requests are not dispatched.
    """

    def __init__(self, limit: int, address_limit: int) -> None:
        self.limit = limit
        self.address_limit = address_limit
        self.total = 0
        self._held: dict[tuple[bytes, bytes], _Held] = {}
        self._by_address: dict[str, int] = {}
        self._by_reader: dict[bytes, int] = {}

    def of_address(self, address: str) -> int:
        return self._by_address.get(address, 0)

    def of_reader(self, reader: bytes) -> int:
        """Bytes ``reader`` holds: replies its ZeroMQ I/O thread has yet to write."""
        return self._by_reader.get(reader, 0)

    def full(self) -> bool:
        """Whether no request may be dispatched at all."""
        return self.total >= self.limit

    def blocked(self, address: str) -> bool:
        """Whether requests of peer ``address`` may not be dispatched."""
        return self.of_address(address) >= self.address_limit

    def add(self, reader: bytes, token: bytes, address: str, nbytes: int) -> None:
        """``reader`` holds ``nbytes`` more for session ``token`` of peer ``address``."""
        held = self._held.setdefault((reader, token), _Held(address))
        held.nbytes += nbytes
        self._count(reader, held.address, nbytes)

    def release(self, reader: bytes, token: bytes, nbytes: int) -> None:
        """``reader`` let go of ``nbytes`` it held for session ``token``.

        Raises:
            InternalError: it held less for that session (a reader reports only what it
                reported SENT, in order, on one connection).
        """
        held = self._held.get((reader, token))
        if held is None or held.nbytes < nbytes:
            raise InternalError(f"reader {reader!r} released {nbytes} bytes of session "
                                f"{token[:8]!r}... while holding "
                                f"{0 if held is None else held.nbytes}")
        held.nbytes -= nbytes
        self._count(reader, held.address, -nbytes)
        if not held.nbytes:
            del self._held[(reader, token)]

    def drop_reader(self, reader: bytes) -> int:
        """Forget what dead ``reader`` held; returns its bytes."""
        gone = [key for key in self._held if key[0] == reader]
        freed = 0
        for key in gone:
            held = self._held.pop(key)
            self._count(reader, held.address, -held.nbytes)
            freed += held.nbytes
        return freed

    def _count(self, reader: bytes, address: str, nbytes: int) -> None:
        self.total += nbytes
        _add(self._by_address, address, nbytes)
        _add(self._by_reader, reader, nbytes)


def _add(counts: dict[K, int], key: K, nbytes: int) -> None:
    """Add ``nbytes`` to ``counts[key]``, keeping no zero entries."""
    left = counts.get(key, 0) + nbytes
    if left:
        counts[key] = left
    else:
        del counts[key]
