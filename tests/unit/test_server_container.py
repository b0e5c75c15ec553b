"""The loader image's entrypoint, ``dataflow-server container``: a container's defaults for the
flags not given, every flag overriding its default, and a clear error when nothing is mounted
at the default data directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataflow.errors import ConfigError
from dataflow.server import container
from dataflow.server.config import default_workers


def test_with_no_flag_the_container_serves_data_on_every_interface_on_fixed_ports(
        tmp_path: Path) -> None:
    ns = container.build_parser().parse_args([])
    assert ns.data == ["/data"]
    config = container.parse_args(["--data", str(tmp_path)])  # /data is not mounted here
    assert config.bind == "tcp://0.0.0.0:5555"
    assert config.data_ports == 5556 and config.workers == default_workers()
    assert [config.data_bind(i) for i in range(2)] == ["tcp://0.0.0.0:5556",
                                                       "tcp://0.0.0.0:5557"]
    assert (config.metrics_port, config.metrics_bind) == (9100, "0.0.0.0")
    assert config.cache_dir == "/cache"


def test_every_flag_overrides_its_container_default(tmp_path: Path) -> None:
    config = container.parse_args(["--data", str(tmp_path), "--bind=tcp://127.0.0.1:6000",
                                   "--data-ports", "6001", "--workers", "3", "--metrics-port",
                                   "0", "--metrics-bind", "127.0.0.1", "--cache-dir", "/x",
                                   "--max-sessions", "8"])
    assert (config.bind, config.data_ports, config.workers) == ("tcp://127.0.0.1:6000", 6001, 3)
    assert (config.metrics_port, config.metrics_bind, config.cache_dir) == (0, "127.0.0.1", "/x")
    assert config.max_sessions == 8


def test_container_defaults_are_validated_as_flags_are(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:  # 5555 is the container's control port
        container.parse_args(["--data", str(tmp_path), "--data-ports", "5554"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dataflow-server container")
    assert "must not include the `bind` port. Found: 5555" in err


def test_the_default_data_directory_must_hold_something(tmp_path: Path) -> None:
    missing = str(tmp_path / "data")
    expected = (f"nothing to serve in {missing} \\(missing or empty\\): mount the shards "
                f"there \\(docker run -v /path/to/shards:{missing}:ro")
    with pytest.raises(ConfigError, match=expected):
        container.check_data([missing], missing)
    os.mkdir(missing)
    with pytest.raises(ConfigError, match=expected):
        container.check_data([missing], missing)
    (tmp_path / "data" / "train-0.tar").write_bytes(b"")
    container.check_data([missing], missing)
    container.check_data(["s3://bucket/x-*.tar"], missing)  # named data is not checked here
    container.check_data([missing, "s3://b/y.tar"], missing)


@pytest.mark.skipif(os.path.isdir("/data") and bool(os.listdir("/data")),
                    reason="this machine has a /data with files in it")
def test_nothing_mounted_at_data_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        container.parse_args([])
    assert e.value.code == 2
    assert "error: nothing to serve in /data (missing or empty)" in capsys.readouterr().err


def test_help_names_the_container_defaults() -> None:
    text = " ".join(container.build_parser().format_help().split())
    assert text.startswith("usage: dataflow-server container")
    for default in ("--data /data", "--bind tcp://0.0.0.0:5555", "--data-ports 5556",
                    "--metrics-port 9100 --metrics-bind 0.0.0.0", "--cache-dir /cache"):
        assert default in text
