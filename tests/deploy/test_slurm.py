"""The SLURM heterogeneous-job recipe: bash syntax, its #SBATCH directives (two components,
before the first command), and the DATAFLOW_SERVERS list it builds, run by bash."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from manifests import DEPLOY

from dataflow.server.health import build_parser as health_parser

SCRIPT = DEPLOY / "slurm" / "loaders_trainers.sbatch"


def _bash() -> str:
    found = shutil.which("bash")
    if found is None:
        pytest.skip("bash is not installed")
    return found


def _components() -> list[list[str]]:
    """The #SBATCH options of each hetjob component; sbatch reads directives only until the
    first line that is neither a comment nor blank, so later ones are an error here."""
    components: list[list[str]] = [[]]
    body = False
    for line in SCRIPT.read_text().splitlines()[1:]:
        if line.startswith("#SBATCH"):
            assert not body, f"#SBATCH after the first command is ignored by sbatch: {line}"
            option = line.removeprefix("#SBATCH").strip()
            if option == "hetjob":
                components.append([])
            else:
                components[-1].extend(option.split())
        elif line.strip() and not line.startswith("#"):
            body = True
    return components


def test_bash_accepts_the_syntax() -> None:
    done = subprocess.run([_bash(), "-n", str(SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


def test_two_components_loaders_then_gpu_trainers() -> None:
    loaders, trainers = _components()
    assert all(re.fullmatch(r"--[a-z-]+=\S+", o) for o in loaders + trainers)
    options = [dict(o.removeprefix("--").split("=", 1) for o in c) for c in (loaders, trainers)]
    assert "gpus-per-node" not in options[0] and "gpus-per-node" in options[1]
    for c in options:
        assert {"nodes", "ntasks-per-node", "partition"} <= set(c)
    assert options[0]["ntasks-per-node"] == "1", "one loader server per node"


def test_steps_run_in_their_components() -> None:
    text = SCRIPT.read_text()
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0"' in text
    steps = re.findall(r"srun --het-group=(\d)[^\n]*\n(?:[^\n]*\\\n)*[^\n]*", text)
    assert steps == ["0", "1"]
    loader_step = text[text.index("srun --het-group=0"):text.index("srun --het-group=1")]
    assert "exec dataflow-server --data" in loader_step


def test_health_wait_uses_the_real_flags() -> None:
    (line,) = [s for s in SCRIPT.read_text().splitlines() if "dataflow-server health" in s]
    args = re.search(r"health (.*); then", line).group(1).split()
    parsed = health_parser().parse_args([a.strip('"') for a in args])
    assert parsed.endpoint == "tcp://${host}:${PORT}"


@pytest.mark.parametrize(("hosts", "expected"), [
    (["cpu-001"], "tcp://cpu-001:5555"),
    (["cpu-001", "cpu-002", "big-a17"], "tcp://cpu-001:5555,tcp://cpu-002:5555,"
                                        "tcp://big-a17:5555"),
])
def test_servers_list_from_the_loader_hosts(hosts: list[str], expected: str) -> None:
    done = subprocess.run([_bash(), "-c", f'source "{SCRIPT}" && dataflow_servers "$@"', "t",
                           "5555", *hosts], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected + "\n"


def test_usage_error_without_a_training_command() -> None:
    done = subprocess.run([_bash(), str(SCRIPT), "/data/train"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: sbatch ")
