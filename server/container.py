"""``dataflow-server container``: the loader image's entrypoint, a server with a container's
defaults (``ENTRYPOINT ["dataflow-server", "container"]`` in ``deploy/docker/Dockerfile``).

Inside a container the plain server's defaults do not serve: it would listen on loopback on a
random port, its readers on random ports no one can publish, metrics off, and cache under a
home directory the image's user does not have. So with no flag at all the image serves
``/data`` on every interface, on ports fixed and exposed by the image and named by the
Kubernetes manifests (:data:`DEFAULTS`), with ``/healthz`` for the health check and the cache
in the image's ``/cache`` volume; reader count: one per CPU the container may use (its cpuset
and CPU quota, :func:`~dataflow.server.cpus.usable_cpus`). Every flag of ``dataflow-server``
is taken and overrides its default here. ``health ...`` runs the probe
(:mod:`dataflow.server.health`), as ``dataflow-server health`` does.

Served from the default ``/data``, a missing or empty directory (nothing mounted there) is a
usage error that says how to mount it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from dataflow.errors import ConfigError
from dataflow.server import flags
from dataflow.server.config import ServerConfig

PROG = "dataflow-server container"
DATA_DIR = "/data"
CONTROL_PORT = 5555
DATA_PORTS = 5556
METRICS_PORT = 9100
DEFAULTS: Mapping[str, object] = {
    "data": [DATA_DIR],
    "bind": f"tcp://0.0.0.0:{CONTROL_PORT}",
    "data_ports": DATA_PORTS,
    "metrics_port": METRICS_PORT,
    "metrics_bind": "0.0.0.0",
    "cache_dir": "/cache",
}
"""What ``dataflow-server container`` gives the flags not given, by ``dest``."""

DESCRIPTION = (
    flags.SERVE_HELP + " The loader image's entrypoint: defaults for a container, which any "
    f"flag overrides: --data {DATA_DIR} (mount the shards there), --bind "
    f"tcp://0.0.0.0:{CONTROL_PORT}, --data-ports {DATA_PORTS} (reader i on {DATA_PORTS}+i: "
    f"publish them under the same numbers), --metrics-port {METRICS_PORT} --metrics-bind "
    "0.0.0.0 (/metrics and /healthz), --cache-dir /cache (the image's volume); one reader per "
    "CPU the container may use. Where a flag's help below names another default, these "
    "replace it."
)


def build_parser() -> argparse.ArgumentParser:
    """The server's flags with :data:`DEFAULTS`."""
    return flags.build_parser(DEFAULTS, prog=PROG, description=DESCRIPTION)


def check_data(data: Sequence[str], default: str = DATA_DIR) -> None:
    """Refuse to serve the default data directory when nothing is mounted there.

    Raises:
        ConfigError: ``data`` is just ``default``, and it is missing or empty.
    """
    if list(data) != [default]:
        return
    try:
        with os.scandir(default) as entries:
            empty = next(entries, None) is None
    except FileNotFoundError:
        empty = True
    if empty:
        raise ConfigError(f"nothing to serve in {default} (missing or empty): mount the shards "
                          f"there (docker run -v /path/to/shards:{default}:ro ...) or name them "
                          "with --data (e.g. --data 's3://bucket/train-*.tar')")


def parse_args(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> ServerConfig:
    """The config ``dataflow-server container ARGV`` serves; exits with a usage message (status
    2) on invalid input or when nothing is mounted at the default data directory."""
    parser = build_parser()
    config = flags.parse_args(argv, environ, parser)
    try:
        check_data(config.data)
    except ConfigError as e:
        parser.error(str(e))
    return config
