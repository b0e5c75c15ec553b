"""The loader image's Dockerfile: hadolint clean, pinned base, non-root, exec-form entrypoint
(the server with a container's defaults) whose CMD parses, the exposed ports, the cache volume
and the HEALTHCHECK's /healthz agreeing with those defaults, the project's version, no torch.
The image built and run for real: test_container.py (opt-in)."""

from __future__ import annotations

import json
import re
import subprocess

from manifests import DEPLOY, project_version, tool

from dataflow.server import container
from dataflow.server.config import MAX_DEFAULT_WORKERS
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
    assert '"dataflow-loader[s3]==${DATAFLOW_VERSION}"' in text


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for word, rest in _instructions() if word == "USER"]
    uid, _, gid = users[-1].partition(":")
    assert int(uid) > 0 and int(gid) > 0


def _final_stage() -> list[tuple[str, str]]:
    found = _instructions()
    last_from = max(i for i, (word, _) in enumerate(found) if word == "FROM")
    return found[last_from:]


def _exposed() -> set[int]:
    ports = set()
    for word, rest in _final_stage():
        if word == "EXPOSE":
            for item in rest.split():
                low, _, high = item.partition("-")
                ports.update(range(int(low), int(high or low) + 1))
    return ports


def test_the_entrypoint_is_the_server_with_container_defaults_and_cmd_parses(tmp_path) -> None:
    final = _final_stage()
    entry = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    assert entry == [["dataflow-server", "container"]]
    (cmd,) = [json.loads(rest) for word, rest in final if word == "CMD"]
    assert cmd == ["--data", "/data"]
    ns = container.build_parser().parse_args(cmd)
    assert ns.data == ["/data"] and ns.bind == container.DEFAULTS["bind"]
    config = container.parse_args(["--data", str(tmp_path)])
    # Every port the entrypoint listens on by default is exposed: the client port, a data
    # port for each reader of the largest default count, the metrics port.
    readers = range(MAX_DEFAULT_WORKERS)
    assert _exposed() == {config.bind_port, *(config.data_ports + i for i in readers),
                          config.metrics_port}


def test_the_cache_is_a_volume_the_user_owns_and_home(tmp_path) -> None:
    final = _final_stage()
    config = container.parse_args(["--data", str(tmp_path)])
    volumes = [json.loads(rest) for word, rest in final if word == "VOLUME"]
    assert volumes == [[config.cache_dir]]
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert f"HOME={config.cache_dir}" in env.split()
    (run,) = [rest for word, rest in final if word == "RUN"]
    assert f"--home-dir {config.cache_dir}" in run
    assert f"chown 10001:10001 {config.cache_dir}" in run


def test_the_health_check_asks_healthz_on_the_default_metrics_port() -> None:
    (check,) = [rest for word, rest in _final_stage() if word == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert "--start-period=" in options
    probe = json.loads(command)
    assert probe[:2] == ["dataflow-server", "health"]
    parsed = health_parser().parse_args(probe[2:])
    assert parsed.http == f"http://127.0.0.1:{container.DEFAULTS['metrics_port']}/healthz"
    limit = re.search(r"--timeout=(\d+)s", options)
    assert limit is not None and int(limit.group(1)) > parsed.timeout


def test_build_context_ignores_all_but_the_package() -> None:
    lines = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[:7] == ["*", "!pyproject.toml", "!README.md", "!dataflow/", "!server/",
                         "!client/", "!bench/"]
    copied = {rest.split()[0] for word, rest in _instructions() if word == "COPY"
              and not rest.startswith("--")}
    assert copied == {"pyproject.toml", "dataflow", "server", "client", "bench"}
