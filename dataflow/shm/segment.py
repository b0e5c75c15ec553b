"""Shared-memory segments between a trainer client and a loader server on the same host.

A segment is a file in ``/dev/shm`` (tmpfs), created by the *client* only, mode 0600, with a
random name that carries its creator's uid, PID namespace and pid::

    dataflow-<uid>-<pidns>-<pid>-<32 hex>

Its first :data:`HEADER_BYTES` bytes are a header (magic, a random nonce, the creator's pid
and process start time, the slot count and slot size); then ``slots`` slots of ``slot_bytes``
bytes, slot ``i`` at :meth:`Geometry.offset`. The file is sparse: only the header is
allocated at creation, and memory is taken as slots are written, no more than the batches
need. Whoever writes a slot reserves the bytes first (``posix_fallocate``,
:meth:`Mapped.reserve`), so a write into a mapped slot never meets a full tmpfs (``SIGBUS``):
a full ``/dev/shm`` fails the reservation instead, and that batch travels in TCP frames. The
client reads only bytes a BATCH says were written, so it never touches a hole. Nobody punches
holes in a segment nor truncates it, so reserved bytes stay allocated while the file exists: a
mapping reserves a slot's bytes once, and again only for a batch that needs more.

The server never creates a segment: it opens one a client named (:func:`open_segment`), only
when the file is a regular file owned by the server's own effective uid with no permission for
group or others, of exactly the size the client announced, with the header the client wrote.
:func:`read_proof` returns the nonce, which the server reports back: a client that reads its
own nonce knows the server opened *its* file (same host, same user, same ``/dev/shm``).

Crash cleanup: the client unlinks its segment when it closes; a segment whose creator died
(SIGKILL) is removed by the next client start of the same user and PID namespace
(:func:`remove_stale`), judged by the pid *and* its start time (a reused pid is not its
creator). A server's mapping of an unlinked segment is released by :meth:`Mapped.gone`.

This module never imports torch.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import stat
import struct
from dataclasses import dataclass

from dataflow.errors import SegmentError

SHM_DIR = "/dev/shm"
HEADER_BYTES = 4096
MAGIC = b"dataflow-shm-v1\0"
NONCE_BYTES = 16
_HEADER = struct.Struct("<16s16sqqqq")  # magic, nonce, pid, start time, slots, slot_bytes
NAME_RE = re.compile(r"dataflow-(\d{1,10})-(\d{1,20})-(\d{1,10})-[0-9a-f]{32}\Z")
MAX_NAME = 96


@dataclass(frozen=True)
class Geometry:
    """Slot count and size of a segment.

    Attributes:
        slots: number of slots.
        slot_bytes: bytes of each slot (a multiple of 64, so every slot is 64-byte aligned).
    """

    slots: int
    slot_bytes: int

    @property
    def nbytes(self) -> int:
        """The segment's file size: the header and every slot."""
        return HEADER_BYTES + self.slots * self.slot_bytes

    def offset(self, slot: int) -> int:
        """Byte offset of ``slot`` in the segment."""
        return HEADER_BYTES + slot * self.slot_bytes


def pid_namespace() -> int:
    """The inode of this process's PID namespace (0 where ``/proc`` does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks after boot), or None: no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    try:
        return int(text[text.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def is_segment_name(name: str) -> bool:
    """Whether ``name`` has the form of a segment's name (no path, nothing else)."""
    return len(name) <= MAX_NAME and NAME_RE.match(name) is not None


class Segment:
    """A segment this process created and maps (the client's side).

    Attributes:
        name: its file name in the directory.
        geometry: its slots.
        nonce: the random bytes the server must read back.
        buf: the whole mapping (header and slots), writable.
    """

    def __init__(self, geometry: Geometry, directory: str = SHM_DIR) -> None:
        self.geometry = geometry
        self.name = (f"dataflow-{os.getuid()}-{pid_namespace()}-{os.getpid()}-"
                     f"{secrets.token_hex(16)}")
        self.path = os.path.join(directory, self.name)
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self._mm: mmap.mmap | None = None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise SegmentError(f"cannot create shared-memory segment {self.path}: {e}") from e
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.posix_fallocate(fd, 0, HEADER_BYTES)
            os.ftruncate(fd, geometry.nbytes)
            self._mm = mmap.mmap(fd, geometry.nbytes)
        except OSError as e:
            os.close(fd)
            self._unlink()
            raise SegmentError(f"cannot make a shared-memory segment of {geometry.nbytes} "
                               f"bytes in {directory} ({e}); is it full?") from e
        os.close(fd)
        me = os.getpid()
        self._mm[: _HEADER.size] = _HEADER.pack(MAGIC, self.nonce, me, start_time(me) or 0,
                                                geometry.slots, geometry.slot_bytes)
        self.buf = memoryview(self._mm)

    def slot(self, slot: int, nbytes: int) -> memoryview:
        """The first ``nbytes`` bytes of ``slot``."""
        start = self.geometry.offset(slot)
        return self.buf[start : start + nbytes]

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unlink the file and unmap it (idempotent). A server's mapping lives on until it
        notices (:meth:`Mapped.gone`); the memory is freed when the last mapping goes."""
        self._unlink()
        if self._mm is not None:
            try:
                self.buf.release()
                self._mm.close()
            except BufferError:  # a view of it is still alive: the mapping goes with it
                pass
            self._mm = None


def _open_checked(name: str, geometry: Geometry | None, directory: str,
                  flags: int) -> tuple[int, os.stat_result]:
    """An fd of segment ``name``, after every check of :func:`open_segment`."""
    if not is_segment_name(name):
        raise SegmentError(f"{name[:MAX_NAME]!r} is not a shared-memory segment name")
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SegmentError(f"cannot open {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SegmentError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise SegmentError(f"{path} belongs to uid {st.st_uid}, not this process's "
                               f"{os.geteuid()}")
        if st.st_mode & 0o077:
            raise SegmentError(f"{path} is readable or writable by others (mode "
                               f"{stat.S_IMODE(st.st_mode):o}); it must be 0600")
        if geometry is not None and st.st_size != geometry.nbytes:
            raise SegmentError(f"{path} is {st.st_size} bytes, not the {geometry.nbytes} of "
                               f"{geometry.slots} slot(s) of {geometry.slot_bytes} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _header(data: bytes, path: str, geometry: Geometry | None) -> tuple[bytes, int, int]:
    """The nonce, pid and start time of a header, checked against ``geometry``."""
    magic, nonce, pid, started, slots, slot_bytes = _HEADER.unpack(data[: _HEADER.size])
    if magic != MAGIC:
        raise SegmentError(f"{path} has no dataflow segment header")
    if geometry is not None and (slots, slot_bytes) != (geometry.slots, geometry.slot_bytes):
        raise SegmentError(f"{path} holds {slots} slot(s) of {slot_bytes} bytes, not "
                           f"{geometry.slots} of {geometry.slot_bytes}")
    return nonce, pid, started


def read_proof(name: str, geometry: Geometry, directory: str = SHM_DIR) -> bytes:
    """The nonce of segment ``name`` (the server's proof that it can open it).

    Raises:
        SegmentError: the name is malformed, the file cannot be opened, is not a regular file
            of this user with mode 0600 and the size of ``geometry``, or has no header.
    """
    fd, _ = _open_checked(name, geometry, directory, os.O_RDONLY)
    try:
        data = os.pread(fd, _HEADER.size, 0)
    finally:
        os.close(fd)
    if len(data) < _HEADER.size:
        raise SegmentError(f"{os.path.join(directory, name)} has no dataflow segment header")
    return _header(data, os.path.join(directory, name), geometry)[0]


class Mapped:
    """A segment a client named, mapped by a server's reader (writable). The fd is kept, so
    :meth:`gone` can tell when the client unlinked it.

    Raises:
        SegmentError: as :func:`read_proof`.
    """

    def __init__(self, name: str, geometry: Geometry, directory: str = SHM_DIR) -> None:
        self.name = name
        self.geometry = geometry
        self._fd, _ = _open_checked(name, geometry, directory, os.O_RDWR)
        try:
            self._mm = mmap.mmap(self._fd, geometry.nbytes)
        except OSError as e:
            os.close(self._fd)
            raise SegmentError(f"cannot map {name}: {e}") from e
        self.buf = memoryview(self._mm)
        self._reserved = [0] * geometry.slots

    def reserved(self, slot: int) -> int:
        """Bytes at the start of ``slot`` this mapping reserved (allocated) so far."""
        return self._reserved[slot]

    def reserve(self, slot: int, nbytes: int) -> None:
        """Allocate the first ``nbytes`` bytes of ``slot`` (before writing them); nothing to
        do when this mapping reserved as many already (see the module docstring).

        Raises:
            SegmentError: they do not fit the slot, or the filesystem is full.
        """
        if not 0 <= slot < self.geometry.slots or not 0 <= nbytes <= self.geometry.slot_bytes:
            raise SegmentError(f"{nbytes} bytes do not fit slot {slot} of {self.name}")
        if nbytes <= self._reserved[slot]:
            return
        try:
            os.posix_fallocate(self._fd, self.geometry.offset(slot), max(nbytes, 1))
        except OSError as e:
            raise SegmentError(f"cannot reserve {nbytes} bytes of shared memory for slot "
                               f"{slot} of {self.name}: {e}") from e
        self._reserved[slot] = nbytes

    def write(self, slot: int, offset: int, data: memoryview) -> None:
        """Write ``data`` at ``offset`` of ``slot``.

        Raises:
            SegmentError: it does not fit in the slot.
        """
        if not 0 <= slot < self.geometry.slots or offset + data.nbytes > self.geometry.slot_bytes:
            raise SegmentError(f"{data.nbytes} bytes at {offset} do not fit slot {slot} of "
                               f"{self.name}")
        start = self.geometry.offset(slot) + offset
        self.buf[start : start + data.nbytes] = data

    def gone(self) -> bool:
        """Whether the client unlinked the file (closed, or a stale one removed)."""
        try:
            return os.fstat(self._fd).st_nlink == 0
        except OSError:
            return True

    def close(self) -> None:
        """Unmap (idempotent)."""
        if self._fd >= 0:
            self.buf.release()
            self._mm.close()
            os.close(self._fd)
            self._fd = -1


def remove_stale(directory: str = SHM_DIR) -> list[str]:
    """Remove the segments of this user and PID namespace whose creator is dead; returns
    their names.

    A creator is alive when a process of its pid runs with the start time its header
    recorded (a header not written yet: the pid of the name runs); a file that cannot be
    opened as a segment (another user's) is left alone.
    """
    uid, ns = str(os.getuid()), str(pid_namespace())
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        m = NAME_RE.match(name)
        if m is None or m.group(1) != uid or m.group(2) != ns:
            continue
        path = os.path.join(directory, name)
        try:
            fd, _ = _open_checked(name, None, directory, os.O_RDONLY)
        except SegmentError:
            continue
        try:
            data = os.pread(fd, _HEADER.size, 0)
        finally:
            os.close(fd)
        pid, started = int(m.group(3)), None  # a header not written yet: the name's pid
        if len(data) == _HEADER.size:
            try:
                _, pid, started = _header(data, path, None)
            except SegmentError:
                pass
        alive = start_time(pid)
        if pid == os.getpid() or (alive is not None and started in (None, alive)):
            continue
        try:
            os.unlink(path)
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed
