"""The loader image's Dockerfile: hadolint clean, pinned base, non-root, exec-form entrypoint,
a HEALTHCHECK running the health subcommand, the project's version, no torch."""

from __future__ import annotations

import json
import re
import subprocess

from manifests import DEPLOY, project_version, tool

from dataflow.server.health import build_parser as health_parser

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _args(name: str) -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in _instructions()
                if word == "ARG" and rest.startswith(name))


def test_hadolint_finds_nothing() -> None:
    done = subprocess.run([tool("hadolint"), "--failure-threshold", "info", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_base_image_is_a_pinned_python_slim() -> None:
    (base,) = set(_args("PYTHON_IMAGE").values())
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+", base), base
    assert {rest.split()[0] for word, rest in _instructions() if word == "FROM"} == {
        "${PYTHON_IMAGE}"}


def test_installs_this_release_without_torch() -> None:
    assert set(_args("DATAFLOW_VERSION").values()) == {project_version()}
    text = DOCKERFILE.read_text()
    assert "torch" not in text.replace("no torch", "")
    assert '"dataflow[s3]==${DATAFLOW_VERSION}"' in text


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for word, rest in _instructions() if word == "USER"]
    uid, _, gid = users[-1].partition(":")
    assert int(uid) > 0 and int(gid) > 0


def test_exec_form_entrypoint_and_health_check() -> None:
    final = _instructions()
    entry = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    assert entry == [["dataflow-server"]]
    (check,) = [rest for word, rest in final if word == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert "--start-period=" in options
    probe = json.loads(command)
    assert probe[:2] == ["dataflow-server", "health"]
    parsed = health_parser().parse_args(probe[2:])
    exposed = [int(p) for word, rest in final if word == "EXPOSE" for p in rest.split()]
    assert parsed.endpoint == f"tcp://127.0.0.1:{exposed[0]}"


def test_build_context_ignores_all_but_the_package() -> None:
    lines = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[:7] == ["*", "!pyproject.toml", "!README.md", "!dataflow/", "!server/",
                         "!client/", "!bench/"]
    copied = {rest.split()[0] for word, rest in _instructions() if word == "COPY"
              and not rest.startswith("--")}
    assert copied == {"pyproject.toml", "dataflow", "server", "client", "bench"}
