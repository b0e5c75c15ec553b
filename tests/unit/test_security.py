"""CURVE key files, their validation, the keygen command and refusal events."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest
import zmq

from dataflow.__main__ import main as cli
from dataflow.errors import ConfigError, ServerUnavailable
from dataflow.security import (
    ClientCurve,
    ServerCurve,
    check_not_writable,
    check_secret_mode,
    client_curve,
    generate_keys,
    handshake_failure,
    server_curve,
)
from dataflow.server.flags import parse_args


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keys(str(tmp_path / "keys"), "server")


def test_generate_writes_a_pair_with_a_private_secret(pair: tuple[Path, Path]) -> None:
    public, secret = pair
    assert public.name == "server.key" and secret.name == "server.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    pub, sec = zmq.auth.load_certificate(secret)
    assert sec is not None and len(pub) == 40 and zmq.auth.load_certificate(public)[0] == pub


def test_generate_never_overwrites(pair: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="already exists"):
        generate_keys(str(pair[0].parent), "server")


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_generate_refuses_odd_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="`name`"):
        generate_keys(str(tmp_path), name)


def test_keygen_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["keygen", str(tmp_path / "k"), "--name", "trainer"]) == 0
    assert (tmp_path / "k" / "trainer.key").is_file()
    assert "trainer.key_secret" in capsys.readouterr().out
    assert cli(["keygen", str(tmp_path / "k"), "--name", "trainer"]) == 1
    assert "already exists" in capsys.readouterr().err


def test_keygen_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli(["keygen", "--help"])
    out = capsys.readouterr().out
    assert "--curve-allowed-keys" in out and "0600" in out


def test_server_curve_loads_and_pickles(pair: tuple[Path, Path]) -> None:
    public, secret = pair
    curve = ServerCurve(str(secret), str(public.parent))
    assert curve.public == zmq.auth.load_certificate(public)[0]
    assert curve.secret.decode() not in repr(curve)
    again = pickle.loads(pickle.dumps(curve))  # a reader's spawn spec carries it
    assert again == curve and again.secret == curve.secret


def test_server_curve_errors_name_the_file(pair: tuple[Path, Path], tmp_path: Path) -> None:
    public, secret = pair
    with pytest.raises(ConfigError, match="no secret key"):
        ServerCurve(str(public), str(public.parent))
    with pytest.raises(ConfigError, match="missing.key_secret"):
        ServerCurve(str(tmp_path / "missing.key_secret"), str(public.parent))
    with pytest.raises(ConfigError, match="must be a directory"):
        ServerCurve(str(secret), str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no `\\*.key`"):
        ServerCurve(str(secret), str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.key").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="x.key"):
        ServerCurve(str(secret), str(tmp_path / "bad"))


def test_both_or_neither(pair: tuple[Path, Path]) -> None:
    public, secret = pair
    assert server_curve(None, None) is None and client_curve(None, None) is None
    with pytest.raises(ConfigError, match="go together"):
        server_curve(str(secret), None)
    with pytest.raises(ConfigError, match="go together"):
        client_curve(None, public)
    assert isinstance(client_curve(secret, public), ClientCurve)
    with pytest.raises(ConfigError, match="server.key"):
        client_curve(public, public)  # a public file where the secret one goes


def test_server_flags(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    public, secret = pair
    config = parse_args(["--data", "x", "--curve-secret-key", str(secret),
                         "--curve-allowed-keys", str(public.parent)])
    assert config.curve is not None and config.curve.allowed_dir == str(public.parent)
    assert parse_args(["--data", "x"]).curve is None
    with pytest.raises(SystemExit):
        parse_args(["--data", "x", "--curve-secret-key", str(secret)])
    assert "go together" in capsys.readouterr().err


def test_handshake_failure_events() -> None:
    err = handshake_failure(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, "tcp://h:1")
    assert isinstance(err, ServerUnavailable) and "authentication refused (CURVE)" in str(err)
    assert err.endpoint == "tcp://h:1"
    err = handshake_failure(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                            zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, "tcp://h:1")
    assert err is not None and "mechanism mismatch" in str(err)
    assert handshake_failure(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, "tcp://h:1") is None
    assert handshake_failure(zmq.EVENT_DISCONNECTED, 0, "tcp://h:1") is None


def _stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604, 0o660, 0o610])
def test_a_secret_key_open_to_others_is_refused_naming_the_fix(pair: tuple[Path, Path],
                                                                mode: int) -> None:
    public, secret = pair
    secret.chmod(mode)
    with pytest.raises(ConfigError, match=f"{secret}.*mode {mode:04o}.*`chmod 600 {secret}`"):
        ServerCurve(str(secret), str(public.parent))
    with pytest.raises(ConfigError, match=f"`curve_key`: {secret}"):
        ClientCurve(str(secret), str(public))


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_secret_key_of_its_owner_only_is_accepted(pair: tuple[Path, Path], mode: int) -> None:
    public, secret = pair
    secret.chmod(mode)
    assert ServerCurve(str(secret), str(public.parent)).public == ClientCurve(
        str(secret), str(public)).public


def test_another_users_secret_key_may_be_read_by_its_group_only() -> None:
    other = os.geteuid() + 1  # root's file on a Kubernetes Secret volume, read via fsGroup
    for mode in (0o440, 0o400, 0o640):
        check_secret_mode("k", "curve_key", _stat(mode, other))
    for mode in (0o444, 0o460, 0o404, 0o442):
        with pytest.raises(ConfigError, match="`chmod 440 k`"):
            check_secret_mode("k", "curve_key", _stat(mode, other))
    with pytest.raises(ConfigError, match="mode 0440.*`chmod 600 k`"):
        check_secret_mode("k", "curve_key", _stat(0o440, os.geteuid()))


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_an_allowed_keys_directory_others_may_write_is_refused(pair: tuple[Path, Path],
                                                                mode: int) -> None:
    public, secret = pair
    public.parent.chmod(mode)
    with pytest.raises(ConfigError, match=f"`curve_allowed_keys`: {public.parent} is writable "
                                          f".*`chmod go-w {public.parent}`"):
        ServerCurve(str(secret), str(public.parent))
    public.parent.chmod(0o755)
    public.chmod(0o666)
    with pytest.raises(ConfigError, match=f"{public} is writable.*`chmod go-w {public}`"):
        ServerCurve(str(secret), str(public.parent))
    public.chmod(0o644)
    assert ServerCurve(str(secret), str(public.parent)).public


def test_mode_bits_on_a_read_only_mount_grant_no_write() -> None:
    dir_stat = os.stat_result((stat.S_IFDIR | 0o1777, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    check_not_writable("/etc/dataflow/allowed", "curve_allowed_keys", dir_stat, read_only=True)
    with pytest.raises(ConfigError, match="mode 1777"):
        check_not_writable("/etc/dataflow/allowed", "curve_allowed_keys", dir_stat,
                           read_only=False)


def _replace_key(path: Path, which: str, value: str) -> None:
    lines = [f'    {which}-key = "{value}"' if line.strip().startswith(f"{which}-key") else line
             for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("which,value,why", [
    ("public", "~" * 40, "not valid Z85"),  # outside the alphabet
    ("public", "#" * 40, "not valid Z85"),  # 5 characters over 32 bits
    ("public", "a" * 39, "39 characters"),
    ("secret", "~" * 40, "its secret key is not valid Z85"),
    ("secret", "0" * 40, "not the one of its secret key"),  # valid Z85, not this pair
])
def test_keys_that_are_not_valid_z85_are_refused_naming_the_file(
        pair: tuple[Path, Path], which: str, value: str, why: str) -> None:
    public, secret = pair
    _replace_key(secret, which, value)
    with pytest.raises(ConfigError, match=f"{secret}.*{why}"):
        ClientCurve(str(secret), str(public))
    if which == "public":
        _replace_key(public, which, value)
        with pytest.raises(ConfigError, match=f"`server_key`: {public}.*{why}"):
            client_curve(str(generate_keys(str(public.parent), "c")[1]), public)
