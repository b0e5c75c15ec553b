"""Read leases on local shards: while a reader process holds one, the kernel lets no process
open the shard for writing, or truncate it, until the reader lets go. The checks of a leased
shard (:class:`~dataflow.readers.guard.FileGuard`) then need no system call.

A guard checks its shard with ``fstat`` before and after every read, about a microsecond
each; a batch of the default sample-level shuffle reads from hundreds of shards, and those
checks were about a fifth of its readers' CPU. A read lease (Linux ``fcntl(F_SETLEASE,
F_RDLCK)``) turns them around: a process that opens the leased file for writing, or truncates
it, waits in the kernel (up to ``/proc/sys/fs/lease-break-time`` seconds, 45 by default) while
the holder is sent ``SIGIO``; the file cannot change before the holder releases its lease.

Leases are taken only in a process that armed them (:func:`arm`: a reader worker, whose main
thread makes every read), only on a filesystem of :data:`LOCAL_FS` (a network or FUSE
filesystem's writers on other hosts break no local lease), only where the kernel gives a
holder at least :data:`MIN_BREAK_S` to let go, and only where the kernel grants them (the
process owns the file or has ``CAP_LEASE``, leases are enabled, no one has the file open for
writing). Anywhere else a guard checks with ``fstat`` as before.

The signal's handler only notes that a lease broke (:func:`take_pending`); until the reader
settles, its checks use ``fstat`` again (a lease the kernel takes back after
``lease-break-time`` lets the writer in). The reader's serving loop, at its next turn between
tasks (:func:`dataflow.readers.guard.settle`), finds which leases broke and releases them: a
writer waits for the task being read (an idle loop is woken by the signal: :func:`wakeup_fd`),
and is never let in while a read uses a map (a file cut short under a read is a SIGBUS). A
guard whose lease broke reads its file again only once it has taken the lease again, which
the kernel refuses (:attr:`Taken.BUSY`) while any process has the file open for writing or
any lease on it is breaking, and then checks it with ``fstat``: a reader that let go first is
not let read while another holder still keeps the writer waiting, and so is never reading
when the writer gets in.

Thread invariant: leases are armed, taken, released and settled on the process's main thread.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import fcntl
import functools
import logging
import os
import signal
import struct
from types import FrameType

LOCAL_FS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
            0xF2F52010: "f2fs", 0x2FC12FC1: "zfs"}
"""Filesystems (``statfs`` ``f_type``) whose files change only through this host's kernel,
so that every writer breaks a lease."""
MIN_BREAK_S = 1
"""Seconds the kernel must let a holder take to release a broken lease
(``/proc/sys/fs/lease-break-time``) for leases to be taken: with less, a writer could go on
before the reader noted the break."""
BREAK_TIME = "/proc/sys/fs/lease-break-time"
_STATFS = ctypes.create_string_buffer(128)  # struct statfs: 120 bytes on 64-bit Linux
_F_TYPE = struct.Struct("L")  # its first member, a long

REFUSED = {errno.EACCES: "the process neither owns the shard nor has CAP_LEASE",
           errno.EINVAL: "its filesystem grants no leases (or leases are disabled: "
                         "/proc/sys/fs/leases-enable)"}
"""Why the kernel refused a lease, by ``errno`` (``EAGAIN``, the file open for writing right
now, concerns that file alone and is not told)."""

log = logging.getLogger(__name__)
_armed = False
_pending = False
_wakeup = -1  # the read end of the pipe every signal with a handler writes to
_told: set[str] = set()


def _broke(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True


def arm() -> str | None:
    """Take leases in this process from now on; call on its main thread.

    Also makes every signal write to a pipe (:func:`signal.set_wakeup_fd`) whose read end
    :func:`wakeup_fd` gives: a loop that polls it wakes as a lease breaks, even in a system
    call, and a writer waits for an idle reader only that long.

    Returns:
        Why no lease will be taken here, or ``None`` when leases are armed.
    """
    global _armed, _wakeup
    if not hasattr(fcntl, "F_SETLEASE"):
        return "this platform has no file leases"
    try:
        with open(BREAK_TIME) as f:
            break_s = int(f.read())
    except (OSError, ValueError) as e:
        return f"cannot read {BREAK_TIME}: {e}"
    if break_s < MIN_BREAK_S:
        return f"{BREAK_TIME} is {break_s}, below {MIN_BREAK_S}"
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    signal.signal(signal.SIGIO, _broke)
    _wakeup, _armed = read, True
    return None


def armed() -> bool:
    """Whether this process takes leases (:func:`arm`)."""
    return _armed


def wakeup_fd() -> int | None:
    """The descriptor that becomes readable when a signal came (:func:`arm`), or ``None``
    when leases are not armed; :func:`drain` it once woken."""
    return _wakeup if _armed else None


def drain() -> None:
    """Empty :func:`wakeup_fd`."""
    try:
        while os.read(_wakeup, 4096):
            pass
    except BlockingIOError:
        pass


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def filesystem(fd: int) -> int | None:
    """The ``statfs`` type of the filesystem file ``fd`` is on, or ``None`` if unknown."""
    if _libc().fstatfs(fd, _STATFS) != 0:
        return None
    return int(_F_TYPE.unpack_from(_STATFS)[0])


class Taken(enum.Enum):
    """What :func:`take` got."""

    HELD = "held"
    """The lease is held."""
    BUSY = "busy"
    """Refused for now: a process has the file open for writing, or a lease on it is being
    broken (a writer waits for it)."""
    NONE = "none"
    """No lease here: not armed, or leases on this file do not mean it is unchanged, or the
    kernel will not grant them (logged once per reason)."""


def take(fd: int, url: str) -> Taken:
    """Take a read lease on ``fd`` (shard ``url``, a regular file opened read-only) where
    leases mean that the file is unchanged while held (see the module). The first refusal
    for each reason in an armed process is logged, naming the shard."""
    if not _armed:
        return Taken.NONE
    fs = filesystem(fd)
    if fs not in LOCAL_FS:
        kind = "unknown" if fs is None else f"{fs:#x}"
        _tell(url, f"its filesystem (statfs type {kind}) is none of "
                   f"{', '.join(LOCAL_FS.values())}, whose writers all break a local lease")
        return Taken.NONE
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, 0)  # SIGIO; the kernel resets it with a released lease
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        if e.errno == errno.EAGAIN:
            return Taken.BUSY
        _tell(url, REFUSED.get(e.errno or 0, str(e)))
        return Taken.NONE
    return Taken.HELD


def _tell(url: str, why: str) -> None:
    if why not in _told:
        _told.add(why)
        log.info("no read lease on %s: %s; shards like it are checked with fstat before and "
                 "after every read (more reader CPU for the default shuffle), tar indexes like "
                 "it read into each reader", url, why)


def held(fd: int) -> bool:
    """Whether ``fd`` still holds its lease (a lease being broken is not held)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
    except OSError:
        return False


def release(fd: int) -> None:
    """Let go of ``fd``'s lease: the writers waiting for it go on."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass  # none held: broken and removed by the kernel, or never granted


def take_pending() -> bool:
    """Whether a lease may have broken since the last call (a signal came)."""
    global _pending
    was, _pending = _pending, False
    return was


def pending() -> bool:
    """Whether a signal came since :func:`take_pending` last looked, without clearing it."""
    return _pending
