"""A local shard held open by its descriptor and checked against what its dataset index
recorded.

``cp new.tar old.tar`` rewrites a shard in place: the inode stays, so a reader's memory map
sees the new bytes at the indexed offsets (mixed data), and a shorter file raises SIGBUS on
any access past its new end. A reader of a local shard therefore holds the descriptor of the
file it maps and compares ``fstat`` of it (size and mtime: the identity the index recorded)
on open and before and after every read (one ``fstat`` each, about a microsecond). It never
touches the map of a file that changed, and never returns what it read while the file
changed.

Where the kernel grants a read lease (:mod:`dataflow.readers.lease`) the guard holds one, and
no writer gets in while it does: checks need no ``fstat``. Once its lease broke, the guard
reads the file again only after taking the lease again (no writer has it open, no lease on it
is breaking) and finding it unchanged; until then the file counts as changed, named as being
written. A file open for writing when the guard opens it is refused the same way.

A shard replaced by an atomic rename (written elsewhere, then ``mv`` / ``os.replace``) is
another inode: a reader holding the old one keeps serving exactly the indexed content; a
reader opening the shard after the rename finds the new file and refuses it, as it refuses a
file rewritten in place.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dataflow.batch import Schema
from dataflow.errors import ShardChangedError, ShardReadError
from dataflow.readers import lease
from dataflow.storage.cache import stat_identity
from dataflow.storage.sources import local_path

_LEASED: dict[int, FileGuard] = {}
"""This process's guards that hold a lease, by descriptor."""
_OPEN: dict[int, FileGuard] = {}
"""This process's open guards, by descriptor (:func:`every_guard_leased`)."""


@dataclass(frozen=True)
class IndexedShard:
    """What the dataset index recorded of one shard, for the readers that serve it.

    Attributes:
        identity: the shard's identity when it was indexed
            (:func:`~dataflow.storage.cache.identity`).
        samples: its sample count.
        schema: the schema every shard of the dataset serves.
    """

    identity: str
    samples: int
    schema: Schema


def changed(url: str, recorded: str, now: str) -> ShardChangedError:
    """The error of a shard whose identity is ``now``, where ``recorded`` was indexed."""
    return ShardChangedError(url, f"changed since the dataset index was built ({recorded} "
                             f"then, {now} now); restart the server to index it again")


def being_written(url: str) -> ShardChangedError:
    """The error of a shard that a process has open for writing (its lease refused)."""
    return ShardChangedError(url, "open for writing by another process (or about to be: a "
                             "read lease on it is breaking); not read while it may change, "
                             "read again once no writer has it open and it still has the "
                             "identity the dataset index recorded")


class FileGuard:
    """The open descriptor of a local shard, checked against one identity.

    Attributes:
        url: the shard.
        fd: its descriptor (read-only, close-on-exec); -1 once closed.
        size: its size in bytes when opened (the size every check expects).
        identity: the identity every check expects: the one given, which the file had when
            opened.
        leased: whether the guard holds a read lease (checks need no ``fstat``).
        broken: whether its lease broke and was let go: every check first takes it again
            (:meth:`check`).
    """

    def __init__(self, url: str, expect: str | None = None, *,
                 on_break: Callable[[], None] | None = None) -> None:
        """Open ``url``.

        Args:
            url: a local shard.
            expect: the identity it must have (the index's); ``None``: whatever it has now.
            on_break: called when the guard's lease breaks, before the guard lets go of it
                (the file is still unchanged then); the guard is then closed, what it guarded
                no longer read from the file (a private copy of a mapped index).

        Raises:
            ShardReadError: the file cannot be opened.
            ShardChangedError: its identity is not ``expect``, or a process has it open for
                writing (where leases are taken).
        """
        self.url = url
        self.on_break = on_break
        try:
            self.fd = os.open(local_path(url), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ShardReadError(url, f"cannot open shard: {e}", offset=0) from e
        _OPEN[self.fd] = self
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise ShardReadError(url, "cannot open shard: not a regular file", offset=0)
        self.size = st.st_size
        self.identity = stat_identity(st)
        self._mtime_ns = st.st_mtime_ns
        self.leased = self.broken = False
        if expect is not None and self.identity != expect:
            self.close()
            raise changed(url, expect, self.identity)
        taken = lease.take(self.fd, url)
        if taken is lease.Taken.NONE:
            return
        err = self._hold() if taken is lease.Taken.HELD else being_written(url)
        if err is not None:
            self.close()
            raise err

    def _hold(self) -> ShardChangedError | None:
        """Register the lease just taken and check the file, which a write could have changed
        before it was taken.

        Returns:
            ``None``: held, the file unchanged; or why not (the guard is then broken, its
            lease let go).
        """
        self.leased, self.broken = True, False
        _LEASED[self.fd] = self
        if not lease.held(self.fd):  # broken before it was registered
            self._unlease()
            return being_written(self.url)
        st = os.fstat(self.fd)
        if st.st_mtime_ns != self._mtime_ns or st.st_size != self.size:
            self._unlease()
            return changed(self.url, self.identity, stat_identity(st))
        return None

    def _retake(self) -> ShardChangedError | None:
        """For a broken guard: take its lease again and check the file (:meth:`_hold`).

        Returns:
            ``None``: leased again and unchanged; else why the file must not be read.
        """
        taken = lease.take(self.fd, self.url)
        if taken is lease.Taken.HELD:
            return self._hold()
        return being_written(self.url)

    @property
    def path(self) -> str:
        """A path that opens this very file (``/proc/self/fd/N``), whatever was renamed over
        its name since, for libraries that open files by path (pyarrow)."""
        return f"/proc/self/fd/{self.fd}"

    def check(self) -> None:
        """Raise unless the file still has its identity (same size and mtime).

        Raises:
            ShardChangedError: it changed.
        """
        if self.leased and not lease.pending():
            return
        if self.broken:
            err = self._retake()
            if err is not None:
                raise err
            return
        st = os.fstat(self.fd)
        if st.st_mtime_ns != self._mtime_ns or st.st_size != self.size:  # the identity's
            raise changed(self.url, self.identity, stat_identity(st))

    def unchanged(self) -> bool:
        """Whether the file still has its identity: :meth:`check` without the error, for
        callers that leave a changed file to a path that raises or counts."""
        return all_unchanged((self,))

    def _unlease(self) -> None:
        """Let go of the lease: the guard is broken from now on."""
        self.leased, self.broken = False, True
        del _LEASED[self.fd]
        lease.release(self.fd)

    def close(self) -> None:
        """Close the descriptor (idempotent), letting go of its lease first (a map of the
        file would keep it held)."""
        if self.leased:
            self._unlease()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            del _OPEN[fd]
            os.close(fd)


def settle() -> None:
    """After a lease broke (:func:`~dataflow.readers.lease.take_pending`): the guards whose
    lease broke let go of it, so the writers waiting go on, and are broken from then on
    (those with an ``on_break`` are closed after it). Called by a reader's serving loop at
    every turn, between tasks, never during a read: a writer let in then could cut a file
    short under a map a read is using (SIGBUS); the next task reads the file only once its
    guard holds the lease again."""
    if not lease.take_pending():
        return
    for fd, guard in list(_LEASED.items()):
        if not lease.held(fd):
            if guard.on_break is None:
                guard._unlease()
            else:
                guard.on_break()
                guard.close()


def every_guard_leased() -> bool:
    """Whether every open guard of this process holds its lease: then none needs an ``fstat``
    until a lease breaks (:func:`~dataflow.readers.lease.pending`). One comparison, where
    asking each guard of a batch of the sample shuffle costs tens of microseconds."""
    return len(_OPEN) == len(_LEASED)


def all_unchanged(guards: Iterable[FileGuard | None]) -> bool:
    """Whether every one of ``guards`` (``None``: nothing to check) still has its identity:
    :meth:`FileGuard.unchanged` of each, one ``fstat`` each, stopping at the first changed, at
    a fraction of the Python around a method call each (a batch of the sample shuffle checks
    hundreds). A guard holding its lease is unchanged without a system call, unless a lease
    broke since the reader last settled them (:func:`settle`): a lease the kernel takes back
    after ``lease-break-time`` would let a writer in, so then every guard is checked. A
    broken guard first takes its lease again (:meth:`FileGuard.check`)."""
    every = lease.pending()
    if not every and every_guard_leased():
        return True
    fstat = os.fstat
    for guard in guards:
        if guard is not None and (every or not guard.leased):
            if guard.broken:
                if guard._retake() is not None:
                    return False
                continue
            st = fstat(guard.fd)
            if st.st_mtime_ns != guard._mtime_ns or st.st_size != guard.size:
                return False
    return True
