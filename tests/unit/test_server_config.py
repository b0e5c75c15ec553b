"""Server flags: the caps, the fixed ports; defaults, validation, --help."""

from __future__ import annotations

import pytest

from dataflow.errors import ConfigError
from dataflow.server import ServerConfig
from dataflow.server.flags import build_parser, parse_args
from dataflow.server.ports import Claim, claims


def test_caps_have_defaults_that_fit_together() -> None:
    config = parse_args(["--data", "x"])
    assert config.max_sessions == 256 and config.session_idle_timeout == 300.0
    assert config.max_inbound_bytes >= 24 * config.max_request_samples
    assert config.max_connections == 2 * 256 + 64
    assert config.max_inbound_total >= config.max_inbound_bytes
    assert (config.address_sessions, config.address_connections) == (32, 2 * 32 + 16)
    assert config.address_unsent_bytes == config.max_unsent_bytes * 32 // 256
    assert config.session_start_timeout < config.session_idle_timeout
    assert config.tcp_timeout_s == 10.0


def test_per_address_caps_follow_the_flags() -> None:
    config = parse_args(["--data", "x", "--max-sessions", "8", "--max-sessions-per-address",
                         "100", "--max-unsent-bytes", "1000", "--client-ttl", "20",
                         "--session-start-timeout", "5", "--max-window-samples", "64",
                         "--max-inbound-total", str(16 << 20)])
    assert config.address_sessions == 8 and config.address_unsent_bytes == 1000
    assert config.tcp_timeout_s == 20.0 and config.session_start_timeout == 5.0
    assert config.max_window_samples == 64 and config.max_inbound_total == 16 << 20


def test_byte_caps_take_sizes_like_the_cache_flags(capsys) -> None:
    config = parse_args(["--data", "x", "--max-reply-bytes", "100M", "--max-unsent-bytes",
                         "1G", "--max-inbound-bytes", "2M", "--max-inbound-total", "1.5GiB"])
    assert (config.max_reply_bytes, config.max_unsent_bytes, config.max_inbound_bytes,
            config.max_inbound_total) == (100 << 20, 1 << 30, 2 << 20, 3 << 29)
    with pytest.raises(SystemExit):
        parse_args(["--data", "x", "--max-reply-bytes", "100 apples"])
    assert "--max-reply-bytes: not a size in bytes (like 512M or 8G)" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    ({"max_request_samples": 1 << 20, "max_inbound_bytes": 1 << 20}, "`max_inbound_bytes`"),
    ({"client_ttl": 10, "session_idle_timeout": 5}, "`session_idle_timeout` must be greater"),
    ({"max_sessions": 0}, "`max_sessions` must be an integer in"),
    ({"max_request_samples": 0}, "`max_request_samples` must be an integer in"),
    ({"max_reply_bytes": 0}, "`max_reply_bytes` must be an integer in"),
    ({"max_inbound_total": 1 << 20}, r"`max_inbound_total` must be in \[`max_inbound_bytes` "
                                     r"\(8388608\), .*Found: 1048576"),
    ({"max_sessions_per_address": 0}, "`max_sessions_per_address` must be an integer in .* "
                                       "Found: 0"),
    ({"session_start_timeout": 0}, "`session_start_timeout` must be > 0 seconds. Found: 0"),
    ({"max_window_samples": 0}, "`max_window_samples` must be an integer in .* Found: 0"),
    ({"max_unsent_bytes": 0}, "`max_unsent_bytes` must be an integer in .* Found: 0"),
    ({"workers": True}, r"`workers` must be an integer in \[1, 256\]. Found: True"),
    ({"max_credits": 8.0}, r"`max_credits` must be an integer in \[1, 4096\]. Found: 8.0"),
])
def test_caps_are_validated_with_the_value_found(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ServerConfig(("x",), **kwargs)


def test_help_documents_every_cap() -> None:
    text = build_parser().format_help()
    for flag in ("--max-sessions", "--session-idle-timeout", "--max-request-samples",
                 "--max-reply-bytes", "--max-inbound-bytes", "--max-inbound-total",
                 "--max-sessions-per-address", "--session-start-timeout",
                 "--max-window-samples", "--max-unsent-bytes"):
        assert flag in text


def test_transform_path_defaults_to_the_start_directory_and_must_exist(tmp_path,
                                                                      monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_args(["--data", "x", "--transform", "m:f"]).transform_path == str(tmp_path)
    assert parse_args(["--data", "x"]).transform_path is None
    given = parse_args(["--data", "x", "--transform", "m:f", "--transform-path", "/"])
    assert given.transform_path == "/"
    with pytest.raises(ConfigError, match="`transform_path` must be an existing directory. "
                                          "Found: '/nonexistent'"):
        ServerConfig(("x",), transform="m:f", transform_path="/nonexistent")


def test_webdataset_flags() -> None:
    config = parse_args(["--data", "x", "--key-field", "--missing-field", "fill"])
    assert config.tar.keys and config.tar.missing_field == "fill"
    default = parse_args(["--data", "x"]).tar
    assert not default.keys and default.missing_field == "error"
    with pytest.raises(SystemExit):
        parse_args(["--data", "x", "--missing-field", "ignore"])
    text = build_parser().format_help()
    for flag in ("--transform-path", "--key-field", "--missing-field"):
        assert flag in text
def test_startup_flags() -> None:
    config = parse_args(["--data", "x"])
    assert (config.index_workers, config.progress) == (8, "auto")
    config = parse_args(["--data", "x", "--index-workers", "32", "--progress", "off"])
    assert (config.index_workers, config.progress) == (32, "off")
    with pytest.raises(ConfigError,
                       match=r"`index_workers` must be an integer in \[1, 256\]. Found: 0"):
        ServerConfig(("x",), index_workers=0)
    with pytest.raises(ConfigError, match=r"`progress` must be one of .* Found: 'yes'"):
        ServerConfig(("x",), progress="yes")
    text = build_parser().format_help()
    assert "--index-workers" in text and "--progress" in text


def test_shared_memory_is_allowed_unless_refused() -> None:
    assert parse_args(["--data", "x"]).shared_memory is True
    assert parse_args(["--data", "x", "--shared-memory", "refuse"]).shared_memory is False
    assert "--shared-memory" in build_parser().format_help()


def test_data_ports_give_each_reader_its_port() -> None:
    config = parse_args(["--data", "x", "--bind", "tcp://0.0.0.0:5555", "--workers", "3",
                         "--data-ports", "5556"])
    assert [config.data_bind(i) for i in range(3)] == [
        "tcp://0.0.0.0:5556", "tcp://0.0.0.0:5557", "tcp://0.0.0.0:5558"]
    free = parse_args(["--data", "x", "--bind", "tcp://0.0.0.0:5555"])
    assert free.data_ports is None and free.data_bind(1) == "tcp://0.0.0.0:*"
    assert parse_args(["--data", "x", "--bind", "ipc:///tmp/s"]).data_bind(1) == "ipc:///tmp/s.w1"
    assert "--data-ports" in build_parser().format_help()


@pytest.mark.parametrize("kwargs, match", [
    ({"bind": "ipc:///tmp/s", "data_ports": 5556}, "`data_ports` needs a tcp:// `bind`"),
    ({"data_ports": 0}, r"`data_ports` must be an integer in \[1, 65533\]. Found: 0"),
    ({"data_ports": 65534}, r"`data_ports` must be an integer in \[1, 65533\]. Found: 65534"),
    ({"data_ports": 5554, "bind": "tcp://0.0.0.0:5555"},
     r"`data_ports` \(5554-5556: one port per reader\) must not include the `bind` port. "
     "Found: 5555"),
    ({"data_ports": 9098, "metrics_port": 9100},
     r"`data_ports` \(9098-9100.*must not include the `metrics_port` port. Found: 9100"),
    ({"data_ports": True}, r"`data_ports` must be an integer in .* Found: True"),
])
def test_data_ports_are_validated_with_the_value_found(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ServerConfig(("x",), workers=3, **kwargs)


def test_fixed_ports_are_claimed_in_bind_order() -> None:
    config = parse_args(["--data", "x", "--bind", "tcp://*:5555", "--workers", "2",
                         "--data-ports", "5556", "--metrics-port", "9100", "--metrics-bind",
                         "0.0.0.0"])
    assert claims(config) == [Claim("--bind", "*", 5555),
                              Claim("--data-ports (reader 0)", "*", 5556),
                              Claim("--data-ports (reader 1)", "*", 5557),
                              Claim("--metrics-port", "0.0.0.0", 9100)]
    assert claims(parse_args(["--data", "x", "--metrics-port", "0"])) == []
    assert claims(parse_args(["--data", "x", "--bind", "ipc:///tmp/s"])) == []


def test_max_open_shards_is_auto_by_default_or_a_number_that_asks_for_descriptors() -> None:
    assert parse_args(["--data", "x"]).max_open_shards is None
    assert parse_args(["--data", "x", "--max-open-shards", "auto"]).max_open_shards is None
    base = parse_args(["--data", "x"]).descriptors
    plain = parse_args(["--data", "x"])  # connections, a segment a session, its own
    assert base == plain.max_connections + 2 * plain.max_sessions + 256
    config = parse_args(["--data", "x", "--max-open-shards", "8"])
    assert config.max_open_shards == 8
    assert config.descriptors == base + 2 * 8  # a shard's guard and its map hold one each
    with pytest.raises(ConfigError, match=r"`max_open_shards` must be an integer in \[1, 65536\]"):
        ServerConfig(("x",), max_open_shards=0)
    with pytest.raises(SystemExit):
        parse_args(["--data", "x", "--max-open-shards", "all"])
    assert "--max-open-shards N|auto" in build_parser().format_help()


def test_cache_memory_is_a_size_shared_by_the_readers_and_off_by_default() -> None:
    config = parse_args(["--data", "x"])
    assert config.cache_memory == 0 == config.reader_cache_memory
    config = parse_args(["--data", "x", "--cache-memory", "1G", "--workers", "4"])
    assert config.cache_memory == 1 << 30 and config.reader_cache_memory == 1 << 28
    with pytest.raises(ConfigError, match=r"`cache_memory` must be an integer in \[0, "):
        ServerConfig(("x",), cache_memory=-1)
    assert "--cache-memory" in build_parser().format_help()


def test_cache_disk_needs_a_memory_tier_and_an_existing_directory(tmp_path) -> None:
    config = parse_args(["--data", "x", "--cache-memory", "1M", "--cache-disk", str(tmp_path),
                         "--cache-disk-bytes", "2G", "--workers", "2"])
    assert config.cache_disk == str(tmp_path) and config.reader_cache_disk_bytes == 1 << 30
    assert parse_args(["--data", "x"]).cache_disk_bytes == 10 << 30
    with pytest.raises(ConfigError, match="`cache_disk` needs `cache_memory`"):
        ServerConfig(("x",), cache_disk=str(tmp_path))
    with pytest.raises(ConfigError, match="`cache_disk` must be an existing directory"):
        ServerConfig(("x",), cache_memory=1, cache_disk=str(tmp_path / "nowhere"))
    help_text = build_parser().format_help()
    assert "--cache-disk DIR" in help_text and "--cache-disk-bytes" in help_text
