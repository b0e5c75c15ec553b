"""docs/security.md's keys on Kubernetes: its key commands make exactly the Secret the manifests
mount; docs/deploy.md: the paths and commands it names exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from manifests import DEPLOY, OVERLAYS, REPO, all_pods, render

from dataflow.__main__ import main as dataflow_cli


def _deploy_section() -> str:
    return (REPO / "docs" / "deploy.md").read_text()


def _secret_section() -> str:
    text = (REPO / "docs" / "security.md").read_text()
    return text[text.index("\n## On Kubernetes\n"):]


def _secret_keys(name: str) -> set[str]:
    keys = set()
    for overlay in OVERLAYS:
        for _, pod in all_pods(render(overlay)):
            for volume in pod["spec"].get("volumes", []):
                secret = volume.get("secret")
                if secret is not None and secret["secretName"] == name:
                    keys.update(item["key"] for item in secret["items"])
    return keys


def test_keygen_commands_make_every_key_the_manifests_mount(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = [line for line in _secret_section().splitlines()
                if line.startswith("python -m dataflow keygen ")]
    assert len(commands) == 2  # the server's key pair and the trainers'
    monkeypatch.chdir(tmp_path)
    for line in commands:
        assert dataflow_cli(shlex.split(line)[3:]) == 0, line
    (secret_line,) = [line for line in _secret_section().splitlines()
                      if "create secret generic dataflow-curve" in line]
    folder = re.search(r"--from-file=(\S+)", secret_line).group(1)
    made = {p.name for p in (tmp_path / folder).iterdir()}
    assert _secret_keys("dataflow-curve") == made


def test_named_paths_exist() -> None:
    section = _deploy_section()
    for overlay in set(re.findall(r"deploy/k8s/overlays/([a-z-]+)", section)):
        assert overlay in OVERLAYS
    for path in set(re.findall(r"`((?:deploy|tests)/[\w./-]+)`", section)):
        assert (REPO / path).exists(), path
    assert (DEPLOY / "docker" / "Dockerfile").is_file()
