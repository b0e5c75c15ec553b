"""How many CPUs this process may use: its CPU affinity (``taskset``, ``docker run
--cpuset-cpus``, a Kubernetes static CPU policy) and its cgroup's CPU quota (``docker run
--cpus``, a Kubernetes CPU limit), whichever is smaller. ``os.cpu_count()`` counts the host's.

The quota is read from cgroup v2's ``cpu.max`` (``"200000 100000"``: 2 CPUs; ``"max 100000"``:
none) or cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota ``-1``: none), under
the cgroup mount a container sees as its own (``/sys/fs/cgroup``). A quota of 1.5 CPUs counts
as 2.
"""

from __future__ import annotations

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"
V1_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def quota_cpus(quota: str, period: str) -> int | None:
    """CPUs a cgroup quota allows, rounded up; None when unlimited or unreadable.

    Args:
        quota: microseconds per period (``"max"`` or a negative number: no quota).
        period: the period's microseconds.
    """
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, math.ceil(q / p))


def cgroup_cpus(root: str = CGROUP_ROOT) -> int | None:
    """CPUs the CPU quota of the cgroup mounted at ``root`` allows (v2 first, then v1); None
    when there is none."""
    v2 = _read(os.path.join(root, "cpu.max"))
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return quota_cpus(quota, period)
    for sub in V1_DIRS:
        v1_quota = _read(os.path.join(root, sub, "cpu.cfs_quota_us"))
        v1_period = _read(os.path.join(root, sub, "cpu.cfs_period_us"))
        if v1_quota is not None and v1_period is not None:
            return quota_cpus(v1_quota, v1_period)
    return None


def usable_cpus(root: str = CGROUP_ROOT) -> int:
    """CPUs this process may run on: its affinity, capped by its cgroup's quota; at least 1."""
    affinity = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    quota = cgroup_cpus(root)
    return max(1, affinity if quota is None else min(affinity, quota))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
