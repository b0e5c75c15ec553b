"""The health probe's pure parts: its config and how it judges a server's answer."""

from __future__ import annotations

import pytest

from dataflow import wire
from dataflow.errors import ConfigError, ServerUnavailable
from dataflow.security import ClientCurve, generate_keys
from dataflow.server.health import HealthConfig, judge, parse_args
from dataflow.wire import ErrorKind

EP = "tcp://10.0.0.7:5555"


@pytest.mark.parametrize("endpoint", ["10.0.0.7:5555", "tcp://", "http://x:1", ""])
def test_config_rejects_endpoints_zeromq_cannot_reach(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="`endpoint` must be tcp://HOST:PORT or ipc://PATH"):
        HealthConfig(endpoint)


@pytest.mark.parametrize("timeout", [0.0, -1.0, 3601.0, float("nan")])
def test_config_rejects_timeouts_out_of_range(timeout: float) -> None:
    with pytest.raises(ConfigError, match=r"`timeout` must be in \(0, 3600\] seconds"):
        HealthConfig(EP, timeout)


def test_curve_flags_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--endpoint", EP, "--curve-server-key", "server.key"])
    assert e.value.code == 2
    assert "`curve_key` and `server_key` go together" in capsys.readouterr().err


def test_the_session_less_heartbeat_answer_is_health() -> None:
    judge(EP, wire.ErrorMsg(-1, ErrorKind.UNKNOWN_CLIENT, "send HELLO first"))


@pytest.mark.parametrize(("msg", "reason"), [
    (wire.ErrorMsg(-1, ErrorKind.SERVER_STOPPING, "bye"), "ERROR ServerStopping: bye"),
    (wire.ErrorMsg(-1, ErrorKind.PROTOCOL, "bad"), "ERROR ProtocolError: bad"),
    (wire.ErrorMsg(4, ErrorKind.UNKNOWN_CLIENT, "x"), "ERROR UnknownClient: x"),
    (wire.Heartbeat(), "with HEARTBEAT, not the ERROR UnknownClient"),
    (wire.StatsReply({}), "with STATS_REPLY"),
])
def test_any_other_answer_is_unhealthy(msg: wire.Message, reason: str) -> None:
    with pytest.raises(ServerUnavailable, match=reason) as e:
        judge(EP, msg)
    assert str(e.value).startswith(f"{EP}: answered the probe with ")


def test_a_bad_endpoint_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--endpoint", "127.0.0.1:5555"])
    assert e.value.code == 2
    assert ("`endpoint` must be tcp://HOST:PORT or ipc://PATH. Found: '127.0.0.1:5555'"
            in capsys.readouterr().err)


def test_the_http_probe_takes_an_http_url_and_no_keys(tmp_path) -> None:
    assert parse_args(["--http", "http://127.0.0.1:9100/healthz"]).http == (
        "http://127.0.0.1:9100/healthz")
    with pytest.raises(ConfigError, match="`http` must be an http:// URL"):
        HealthConfig(EP, http="127.0.0.1:9100/healthz")
    public, secret = generate_keys(str(tmp_path), "probe")
    with pytest.raises(ConfigError, match="without CURVE keys"):
        HealthConfig(EP, curve=ClientCurve(str(secret), str(public)), http="http://127.0.0.1:9100/healthz")
