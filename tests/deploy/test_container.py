"""The loader image for real, with podman (opt-in: ``DATAFLOW_TEST_PODMAN=1``, see
:mod:`podman`): built from ``deploy/docker/Dockerfile``, then run

(a) with its defaults (no argument, shards mounted at ``/data``, a named volume at ``/cache``):
    it serves on every interface on the fixed ports, its health check passes, a client on the
    host reads an exact epoch (gzipped tar shards included: they are copied into the cache) at
    the container's address, and a second container on the same volume finds the index cached;
(b) with published ports (``-p``, bridge networking) and ``--cpuset-cpus 0``: one reader, its
    data port (``--data-ports``) published under the same number, the client and metrics ports
    on ports podman picks; a client on the host reads an exact epoch through the published
    ports, and ``/healthz`` answers through them;
(c) with nothing mounted at ``/data``: a usage error saying to mount the shards.

Times (build, each run) are printed (``pytest -s``)."""

from __future__ import annotations

import gzip
import os
import secrets
import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from manifests import REPO
from podman import Podman, unavailable

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo

pytestmark = [pytest.mark.podman,
              pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

SHARDS = 4
PER_SHARD = 30
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = podman.base(tmp_path_factory.mktemp("base"))
    tag = f"localhost/dataflow-loader:test-{secrets.token_hex(4)}"
    start = time.monotonic()
    # --no-cache: buildah 1.28 cannot bind-mount a cached stage (/work/shared/CONTAINERS.md);
    # --layers=false: no image is left of the wheels stage; --format docker keeps HEALTHCHECK.
    podman("build", "--no-cache", "--layers=false", "--format", "docker",
           "--build-arg", f"PYTHON_IMAGE={base}",
           "-f", str(REPO / "deploy" / "docker" / "Dockerfile"), "-t", tag, str(REPO),
           timeout=600)
    TIMES["build"] = time.monotonic() - start
    try:
        yield tag
    finally:
        podman.remove(images=[tag])
        print("podman times (s):", {k: round(v, 1) for k, v in TIMES.items()})


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Demo tar shards, one of them gzipped, readable by the image's user (uid 10001), and
    their sample count."""
    root = tmp_path_factory.mktemp("shards")
    demo = make_demo(str(root), DemoSpec(fmt="tar", shards=SHARDS, samples_per_shard=PER_SHARD,
                                         image_shape=(3, 8, 8)), progress=None)
    plain = demo.paths[1]
    with open(plain, "rb") as src, gzip.open(plain + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.unlink(plain)
    root.chmod(0o755)
    for path in root.iterdir():
        path.chmod(0o644)
    return root, demo.total


def _epoch(endpoint: str) -> list[int]:
    with DataLoader(endpoint, batch_size=10, rank=0, world_size=1, timeout=60) as dl:
        return [i for batch in dl for i in batch["id"].tolist()]


def _healthz(host: str, port: int) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{host}:{port}/healthz", timeout=10) as r:
        return r.status, r.read().decode()


@pytest.mark.timeout(600)
def test_with_its_defaults_the_image_serves_an_exact_epoch(podman: Podman, image: str,
                                                           shards: tuple[Path, int]) -> None:
    data, total = shards
    volume = f"dataflow-test-cache-{secrets.token_hex(4)}"
    made: list[str] = []
    try:
        start = time.monotonic()
        made.append(podman.run_detached("-v", f"{data}:/data:ro", "-v", f"{volume}:/cache",
                                        image))
        ready = podman.ready_line(made[-1])
        TIMES["start (defaults)"] = time.monotonic() - start
        assert ready["endpoint"] == "tcp://0.0.0.0:5555"
        assert ready["data_endpoints"] == [f"tcp://0.0.0.0:{5556 + i}"
                                           for i in range(ready["workers"])]
        assert ready["metrics_port"] == 9100 and ready["samples"] == total
        assert ready["index_cache"] == "miss"
        host = podman.address(made[-1])
        assert host, "the container has no address on podman's bridge"
        start = time.monotonic()
        ids = _epoch(f"tcp://{host}:5555")
        TIMES["epoch (defaults)"] = time.monotonic() - start
        assert sorted(ids) == list(range(total))
        assert _healthz(host, 9100) == (
            200, f"ok: serving with {ready['workers']} readers, 0 sessions\n")
        check = podman("healthcheck", "run", made[-1], check=False)
        assert check.returncode == 0, check.stdout + check.stderr

        podman("stop", "-t", "10", made[-1])
        made.append(podman.run_detached("-v", f"{data}:/data:ro", "-v", f"{volume}:/cache",
                                        image))
        assert podman.ready_line(made[-1])["index_cache"] == "hit"
    finally:
        podman.remove(containers=made, volumes=[volume])


@pytest.mark.timeout(600)
def test_through_published_ports_with_one_cpu_the_image_serves_an_exact_epoch(
        podman: Podman, image: str, shards: tuple[Path, int]) -> None:
    data, total = shards
    with socket.socket() as probe:  # a free host port for the one reader's data port
        probe.bind(("127.0.0.1", 0))
        data_port = probe.getsockname()[1]
    made: list[str] = []
    try:
        start = time.monotonic()
        made.append(podman.run_detached(
            "--cpuset-cpus", "0", "-p", "127.0.0.1::5555", "-p", "127.0.0.1::9100",
            "-p", f"127.0.0.1:{data_port}:{data_port}", "-v", f"{data}:/data:ro", image,
            "--data-ports", str(data_port)))
        ready = podman.ready_line(made[-1])
        TIMES["start (published)"] = time.monotonic() - start
        assert ready["workers"] == 1  # the CPUs it may use, not the host's
        assert ready["data_endpoints"] == [f"tcp://0.0.0.0:{data_port}"]
        control, metrics = (podman.host_port(made[-1], p) for p in (5555, 9100))
        start = time.monotonic()
        ids = _epoch(f"tcp://127.0.0.1:{control}")
        TIMES["epoch (published)"] = time.monotonic() - start
        assert sorted(ids) == list(range(total))
        assert _healthz("127.0.0.1", metrics) == (200, "ok: serving with 1 readers, 0 "
                                                       "sessions\n")
    finally:
        podman.remove(containers=made)


@pytest.mark.timeout(300)
def test_with_nothing_mounted_at_data_the_image_says_to_mount_it(podman: Podman,
                                                                 image: str) -> None:
    done = podman("run", "--rm", image, check=False)
    assert done.returncode == 2
    assert "nothing to serve in /data (missing or empty): mount the shards there" in done.stderr
