"""The long fuzz (``python -m dataflow.bench fuzz``) on a tiny budget, so it does not rot: its
attacks, oracles, legitimate reader and report all run against real servers (clear text and
CURVE, every attack on each) and find nothing.
"""

from __future__ import annotations

import io

import pytest

from dataflow.bench.__main__ import build_parser
from dataflow.bench.fuzz import ATTACKS, FuzzConfig, run_fuzz
from dataflow.errors import ConfigError


@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["plain", "curve"])
def test_a_short_fuzz_finds_nothing(target: str) -> None:
    out = io.StringIO()
    cfg = FuzzConfig(minutes=0.05, targets=(target,), attacks=ATTACKS, flood_hold=0.5)
    ok = run_fuzz(cfg, out)
    report = out.getvalue()
    print(report)
    assert ok, report
    assert "violations: none" in report and report.rstrip().endswith("PASS (0 violation(s))")
    for attack in ATTACKS:
        assert f"\n  {attack} " in report, f"{attack} sent nothing"
    assert "every sample once" in report and "malformed predicted" in report


def test_the_command_and_its_settings() -> None:
    args = build_parser().parse_args(["fuzz", "--minutes", "2", "--attacks", "router,flood",
                                      "--targets", "curve", "--seeds", "3"])
    assert (args.minutes, args.attacks, args.targets, args.seeds) == (
        2.0, ("router", "flood"), ("curve",), 3)
    with pytest.raises(ConfigError, match="`attacks` must be some of"):
        FuzzConfig(attacks=("router", "nope"))
    with pytest.raises(ConfigError, match="`minutes`"):
        FuzzConfig(minutes=0)
