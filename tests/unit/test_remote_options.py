"""Storage options, sizes, the remote config and one-line error descriptions."""

from __future__ import annotations

import pytest

from dataflow.errors import ConfigError
from dataflow.server.flags import parse_args
from dataflow.storage.remote import RemoteConfig, parse_size, parse_storage_options
from dataflow.storage.remoteerrors import describe, endpoint_of, is_throttle


def test_flags_override_the_environment_and_values_are_json_when_they_parse() -> None:
    opts = parse_storage_options(
        ["endpoint_url=http://127.0.0.1:9000", "anon=true", "client_kwargs.region_name=eu",
         "token=abc"], '{"anon": false, "key": "k", "client_kwargs": {"verify": false}}')
    assert opts == {"endpoint_url": "http://127.0.0.1:9000", "anon": True, "key": "k",
                    "token": "abc", "client_kwargs": {"verify": False, "region_name": "eu"}}


@pytest.mark.parametrize("pair", ["novalue", "=x", "a..b=1"])
def test_malformed_pairs_are_refused(pair: str) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_storage_options([pair])


def test_bad_environment_json_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="DATAFLOW_STORAGE_OPTIONS"):
        parse_storage_options([], "{nope")
    with pytest.raises(ConfigError, match="JSON object"):
        parse_storage_options([], "[1]")


def test_sizes() -> None:
    assert parse_size("1000") == 1000
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("8g") == 8 << 30
    with pytest.raises(ConfigError, match="like 512M"):
        parse_size("lots")


def test_config_is_validated_and_hashable() -> None:
    cfg = RemoteConfig.of({"anon": True})
    assert cfg.options == {"anon": True} and hash(cfg) == hash(RemoteConfig.of({"anon": True}))
    with pytest.raises(ConfigError, match="cache_bytes"):
        RemoteConfig(cache_bytes=10)
    with pytest.raises(ConfigError, match="JSON object"):
        RemoteConfig(storage_options="[]")


def test_server_flags_and_environment_reach_the_config() -> None:
    cfg = parse_args(["--data", "s3://b/x", "--storage-option", "endpoint_url=http://h:1",
                      "--cache-size", "64M"], {"DATAFLOW_STORAGE_OPTIONS": '{"anon": true}'})
    assert cfg.remote.options == {"anon": True, "endpoint_url": "http://h:1"}
    assert cfg.remote.cache_bytes == 64 << 20


def test_endpoints_and_descriptions_are_one_line() -> None:
    assert endpoint_of("s3://b/k", {"endpoint_url": "http://h:1"}) == "http://h:1"
    assert endpoint_of("s3://b/k", {"client_kwargs": {"endpoint_url": "http://h:2"}}) == \
        "http://h:2"
    assert endpoint_of("https://host:8/a/b.tar", {}) == "https://host:8"

    class Denied(Exception):
        response = {"Error": {"Code": "InvalidAccessKeyId"},
                    "ResponseMetadata": {"HTTPStatusCode": 403}}

    text = describe(Denied("multi\nline"), "s3://bkt/k", {})
    assert "access denied" in text and "'bkt'" in text and "\n" not in text
    other = describe(ValueError("first\nsecond"), "s3://bkt/k", {})
    assert other == "ValueError: first"
    assert not is_throttle(FileNotFoundError("s3://b/shard-503.tar"))
