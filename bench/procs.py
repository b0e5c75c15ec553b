"""Per-process figures read from ``/proc``: peak RSS, CPU time, process trees (Linux only)."""

from __future__ import annotations

import os
from collections.abc import Iterable

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def peak_rss_bytes(pid: int) -> int | None:
    """Peak resident set size (``VmHWM``) of a live process in bytes; None if it is gone."""
    kib = _status_kib(pid, "VmHWM")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0).

    Returns:
        Whether the kernel accepted the reset (False in restricted sandboxes).
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (all its threads), seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return parents


def descendants(roots: Iterable[int]) -> list[int]:
    """Every live process below ``roots`` (children, grandchildren, ...), sorted.

    Args:
        roots: process ids whose subtrees to walk; the roots themselves are not included.
    """
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def total_peak_rss(pids: Iterable[int]) -> int:
    """Sum of the peak RSS of live processes, bytes (shared pages count once per process)."""
    return sum(rss for rss in map(peak_rss_bytes, pids) if rss is not None)


def cpu_snapshot(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds of each live process in ``pids``."""
    return {pid: cpu for pid in pids if (cpu := cpu_seconds(pid)) is not None}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots; processes born in between count in full."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _listening_inodes() -> dict[str, str]:
    """Socket inode -> ``host:port`` of every listening TCP socket (hex as in /proc/net)."""
    found: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A":
                found[cols[9]] = cols[1]
    return found


def _is_loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:
        return bytes.fromhex(host)[::-1][0] == 127
    return host in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def non_loopback_listeners(pids: Iterable[int]) -> list[int]:
    """Processes among ``pids`` with a listening TCP socket not bound to loopback."""
    listening = _listening_inodes()
    bad = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else None
            if inode in listening and not _is_loopback(listening[inode]):
                bad.append(pid)
                break
    return bad
