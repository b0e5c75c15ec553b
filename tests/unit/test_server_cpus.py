"""The CPUs a server may use: affinity capped by the cgroup's CPU quota, read from cgroup files
written here (v2's cpu.max, v1's cfs quota and period)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataflow.server.config import default_workers
from dataflow.server.cpus import cgroup_cpus, quota_cpus, usable_cpus


@pytest.mark.parametrize("quota, period, cpus", [
    ("200000", "100000", 2), ("150000", "100000", 2), ("50000", "100000", 1),
    ("max", "100000", None), ("-1", "100000", None), ("100000", "0", None), ("x", "1", None),
])
def test_a_quota_counts_whole_cpus_rounded_up(quota: str, period: str, cpus: int | None) -> None:
    assert quota_cpus(quota, period) == cpus


def test_cgroup_v2_and_v1_quotas_are_read(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("300000 100000\n")
    assert cgroup_cpus(str(v2)) == 3
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(str(v2)) is None
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(str(tmp_path / "v1")) == 1
    assert cgroup_cpus(str(tmp_path / "none")) is None


def test_usable_cpus_is_the_affinity_capped_by_the_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(str(tmp_path)) == affinity  # no quota files: the affinity
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text(f"{(affinity + 4) * 100000} 100000\n")
    assert usable_cpus(str(tmp_path)) == affinity


def test_default_readers_follow_this_process_s_affinity() -> None:
    """One reader per CPU of the affinity (the quota of this test's own cgroup may lower it)."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert default_workers() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert 1 <= default_workers() <= min(len(before), 32)
