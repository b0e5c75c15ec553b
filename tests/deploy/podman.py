"""Build and run the loader image with podman, as /work/shared/CONTAINERS.md describes for a host
without a Docker daemon or a reachable registry: runc and raised-but-allowed ulimits through a
``CONTAINERS_CONF`` file, and a base image made locally with debootstrap when none is named.

Opt-in: :func:`unavailable` says why the tests using it skip (``DATAFLOW_TEST_PODMAN=1`` not
set, no podman, not root). ``DATAFLOW_TEST_PODMAN_BASE`` names the base image to build on (e.g.
``python:3.12.8-slim-bookworm`` where a registry is reachable); by default the local base
:data:`LOCAL_BASE` is used, made once with debootstrap (about a minute) and kept for later
runs. Everything else a test starts (containers, volumes, the image) is removed after it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

OPT_IN = "DATAFLOW_TEST_PODMAN"
BASE_ENV = "DATAFLOW_TEST_PODMAN_BASE"
LOCAL_BASE = "localhost/dataflow-test-base:bookworm"
CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
"""
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def unavailable() -> str | None:
    """Why the podman tests cannot run here (a skip reason), or None."""
    if os.environ.get(OPT_IN) != "1":
        return (f"builds and runs the loader image with podman (a minute or two): opt in with "
                f"{OPT_IN}=1")
    if shutil.which("podman") is None:
        return ("podman is not installed (apt-get install -y podman buildah debootstrap runc; "
                "see /work/shared/CONTAINERS.md)")
    if os.geteuid() != 0:
        return "needs root (rootful podman: bridge networking the host can reach)"
    return None


class Podman:
    """Runs ``podman`` with this module's ``CONTAINERS_CONF`` (written under ``workdir``)."""

    def __init__(self, workdir: Path) -> None:
        conf = workdir / "containers.conf"
        conf.write_text(CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, timeout: float = 120,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True,
                              timeout=timeout, text=True)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited with {done.returncode}: "
                                 f"{done.stderr[-3000:]}")
        return done

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def base(self, workdir: Path) -> str:
        """The base image to build on (see the module), made first when it is the local one."""
        named = os.environ.get(BASE_ENV)
        if named:
            return named
        if not self.exists(LOCAL_BASE):
            self._make_local_base(workdir)
        return LOCAL_BASE

    def _make_local_base(self, workdir: Path) -> None:
        """Debian bookworm with python3 and pip (debootstrap), the host's extra CA certificates
        and no EXTERNALLY-MANAGED marker, as ``python:*-slim`` has none."""
        if shutil.which("debootstrap") is None:
            raise AssertionError(f"no base image: install debootstrap, or name one in {BASE_ENV}")
        rootfs = workdir / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=python3,python3-venv,python3-pip,ca-certificates", "bookworm",
                        str(rootfs), debian_mirror()], check=True, capture_output=True,
                       timeout=600)
        (rootfs / "etc" / "resolv.conf").unlink(missing_ok=True)
        raw = LOCAL_BASE + "-raw"
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True,
                             capture_output=True, timeout=300).stdout
        subprocess.run(["podman", "import", "-", raw], input=tar, env=self.env, check=True,
                       capture_output=True, timeout=300)
        shutil.rmtree(rootfs)
        context = workdir / "base"
        context.mkdir()
        for crt in glob.glob("/usr/local/share/ca-certificates/*.crt"):
            shutil.copy(crt, context)
        (context / "Containerfile").write_text(
            f"FROM {raw}\n"
            + ("COPY *.crt /usr/local/share/ca-certificates/\n"
               if any(context.glob("*.crt")) else "")
            + "RUN update-ca-certificates && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED\n")
        self("build", "--format", "docker", "-t", LOCAL_BASE, str(context), timeout=300)
        self("rmi", raw)

    def run_detached(self, *args: str) -> str:
        """``podman run -d ARGS``; returns the container id."""
        return self("run", "-d", *args).stdout.strip()

    def ready_line(self, container: str, timeout: float = 120) -> dict:
        """The server's ready line (its first stdout line), once printed.

        Raises:
            AssertionError: the container exited first, or ``timeout`` passed; with its log.
        """
        deadline = time.monotonic() + timeout
        while True:
            logs = self("logs", container, check=False)
            for line in logs.stdout.splitlines():
                if line.startswith("{"):
                    return json.loads(line)
            state = self("inspect", "-f", "{{.State.Status}}", container).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                raise AssertionError(f"container {state}, no ready line: {logs.stderr[-3000:]}")
            time.sleep(0.2)

    def host_port(self, container: str, port: int) -> int:
        """The host port ``container``'s TCP ``port`` is published on."""
        return int(self("port", container, f"{port}/tcp").stdout.split()[0].rsplit(":", 1)[1])

    def address(self, container: str) -> str:
        return self("inspect", "-f", "{{.NetworkSettings.IPAddress}}", container).stdout.strip()

    def remove(self, containers: Sequence[str] = (), volumes: Sequence[str] = (),
               images: Sequence[str] = ()) -> None:
        """Remove what a test made (what is already gone is fine)."""
        for c in containers:  # -v: with its anonymous volumes (the image's /cache)
            self("rm", "-f", "-v", "-t", "5", c, check=False)
        for v in volumes:
            self("volume", "rm", "-f", v, check=False)
        for i in images:
            self("rmi", "-f", i, check=False)


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses (its sources), else deb.debian.org."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*")) + ["/etc/apt/sources.list"]:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for pattern in (r"^URIs:\s*(\S+/debian)\s*$", r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s"):
            found = re.search(pattern, text, re.MULTILINE)
            if found:
                return found.group(1)
    return DEFAULT_MIRROR
