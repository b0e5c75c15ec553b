"""CurveZMQ keys and the policy applied to every server<->client socket (no torch import).

Keys use the ZeroMQ certificate files of :mod:`zmq.auth`: ``NAME.key`` holds a public key,
``NAME.key_secret`` the public and the secret key (mode 0600). A server holds a secret key
file and a directory of the public keys of the clients it accepts; a client holds its own
secret key file and the server's public key file.

With a policy, every socket of a server<->client link (the frontend's client-facing ROUTER,
each reader's data ROUTER, each client DEALER) runs CURVE: encrypted and authenticated; a
ZAP handler (:mod:`dataflow.server.auth`) in each server process that binds admits only the
allowed keys. Without one, links run ZeroMQ's NULL mechanism (clear text).

Key files are checked as ssh checks its own (:func:`check_secret_mode`,
:func:`check_not_writable`): a secret key file open to others, or an allowed-keys directory
(or key in it) that others may write, is refused with the ``chmod`` that fixes it; every key
must be 40 characters of valid Z85, and a secret key file's public key must be its secret
key's.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from dataflow.errors import ConfigError, ServerUnavailable

ZAP_DOMAIN = "dataflow"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
KEY_CHARS = 40


def check_secret_mode(path: str, what: str, st: os.stat_result) -> None:
    """Refuse a secret key file that others may read or change (as ssh refuses a private key).

    A file of this process's user must have no group or other permission bit (``0600`` or
    ``0400``). A file of another user (root on a Kubernetes Secret volume, read through the
    pod's ``fsGroup``) may be read by its group (``0440``), nothing more. Bits for others are
    always refused.

    Raises:
        ConfigError: naming ``what``, the file, its mode and the ``chmod`` that fixes it.
    """
    mine = st.st_uid == os.geteuid()
    if stat.S_IMODE(st.st_mode) & (0o077 if mine else 0o027):
        fix = "chmod 600" if mine else "chmod 440"
        raise ConfigError(f"`{what}`: {path} is open to other users (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); a secret key file must be readable "
                          f"by its owner only: run `{fix} {path}`")


def check_not_writable(path: str, what: str, st: os.stat_result, read_only: bool) -> None:
    """Refuse a file or directory that group or others may write, unless its file system is
    mounted read-only (``read_only``: a Kubernetes Secret volume, whose mode bits grant nothing
    then).

    Raises:
        ConfigError: naming ``what``, the path, its mode and the ``chmod`` that fixes it.
    """
    if stat.S_IMODE(st.st_mode) & 0o022 and not read_only:
        raise ConfigError(f"`{what}`: {path} is writable by other users (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); whoever can write there can "
                          f"change which clients are allowed: run `chmod go-w {path}`")


def _on_read_only_mount(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def z85_key(value: bytes | None, path: str, what: str, which: str) -> bytes:
    """``value`` when it is a CURVE key in Z85 (40 characters of the Z85 alphabet encoding 32
    bytes).

    Raises:
        ConfigError: naming ``what``, the file and which key (``public`` or ``secret``).
    """
    if value is None or len(value) != KEY_CHARS:
        found = "none" if value is None else f"{len(value)} characters"
        raise ConfigError(f"`{what}`: {path} holds no Z85 {which} key ({KEY_CHARS} characters; "
                          f"found {found})")
    try:
        z85.decode(value)
    except (KeyError, ValueError, struct.error):
        raise ConfigError(f"`{what}`: {path}: its {which} key is not valid Z85 (characters "
                          "outside the Z85 alphabet, or a group of 5 over 32 bits)") from None
    return value


def _load(path: str, what: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    """``(public, secret)`` keys of a certificate file (``secret`` None in a public file).

    Raises:
        ConfigError: the file is missing, unreadable, malformed, open to others (a secret key
            file), or lacks a secret key where ``secret`` is required.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"`{what}` must be an existing key file. Found: {path!r}")
    try:
        public, secret_key = zmq.auth.load_certificate(p)
    except (OSError, ValueError, zmq.ZMQError) as e:
        raise ConfigError(f"`{what}`: {path} is not a ZeroMQ certificate file: {e}") from e
    public = z85_key(public, path, what, "public")
    if not secret:
        return public, secret_key
    if not secret_key:
        raise ConfigError(f"`{what}`: {path} holds no secret key (give the `{SECRET_SUFFIX}` "
                          "file, not the public one)")
    check_secret_mode(path, what, p.stat())
    secret_key = z85_key(secret_key, path, what, "secret")
    if zmq.curve_public(secret_key) != public:
        raise ConfigError(f"`{what}`: {path}: its public key is not the one of its secret key "
                          "(a damaged or hand-edited file: generate a new pair)")
    return public, secret_key


def generate_keys(directory: str, name: str) -> tuple[Path, Path]:
    """Write a new key pair ``directory/NAME.key`` (public) and ``NAME.key_secret`` (0600).

    Returns:
        ``(public_file, secret_file)``.

    Raises:
        ConfigError: ``name`` is not a plain file name, or either file already exists.
    """
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"`name` must be a plain file name. Found: {name!r}")
    out = Path(directory)
    public, secret = out / f"{name}{PUBLIC_SUFFIX}", out / f"{name}{SECRET_SUFFIX}"
    for f in (public, secret):
        if f.exists():
            raise ConfigError(f"{f} already exists; remove it or pick another --name")
    out.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        zmq.auth.create_certificates(out, name)
    finally:
        os.umask(old)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return public, secret


@dataclass(frozen=True)
class ServerCurve:
    """A server's CURVE policy, validated (files read) on construction.

    Attributes:
        secret_key_file: the server's ``.key_secret`` file.
        allowed_dir: directory whose ``*.key`` files are the client public keys accepted
            (read once at start: restart the server to change them).
        public: the server's public key (Z85, 40 bytes).
        secret: the server's secret key (Z85, 40 bytes); never printed.
    """

    secret_key_file: str
    allowed_dir: str
    public: bytes = field(init=False, repr=False)
    secret: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        public, secret = _load(self.secret_key_file, "curve_secret_key", secret=True)
        object.__setattr__(self, "public", public)
        object.__setattr__(self, "secret", secret)
        d = Path(self.allowed_dir)
        if not d.is_dir():
            raise ConfigError(f"`curve_allowed_keys` must be a directory. "
                              f"Found: {self.allowed_dir!r}")
        check_not_writable(self.allowed_dir, "curve_allowed_keys", d.stat(),
                           _on_read_only_mount(self.allowed_dir))
        keys = sorted(d.glob(f"*{PUBLIC_SUFFIX}"))
        if not keys:
            raise ConfigError(f"`curve_allowed_keys`: {self.allowed_dir} holds no "
                              f"`*{PUBLIC_SUFFIX}` public key file; no client could connect")
        for k in keys:
            if k.is_file():
                check_not_writable(str(k), "curve_allowed_keys", k.stat(),
                                   _on_read_only_mount(str(k)))
            _load(str(k), "curve_allowed_keys", secret=False)


@dataclass(frozen=True)
class ClientCurve:
    """A client's CURVE keys, validated (files read) on construction.

    Attributes:
        secret_key_file: the client's ``.key_secret`` file (its public key must be in the
            server's allowed directory).
        server_key_file: the server's public ``.key`` file.
        public: the client's public key (Z85).
        secret: the client's secret key (Z85); never printed.
        server: the server's public key (Z85).
    """

    secret_key_file: str
    server_key_file: str
    public: bytes = field(init=False, repr=False)
    secret: bytes = field(init=False, repr=False)
    server: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        public, secret = _load(self.secret_key_file, "curve_key", secret=True)
        server, _ = _load(self.server_key_file, "server_key", secret=False)
        object.__setattr__(self, "public", public)
        object.__setattr__(self, "secret", secret)
        object.__setattr__(self, "server", server)


def server_curve(secret_key_file: str | None, allowed_dir: str | None) -> ServerCurve | None:
    """The policy for both flags, None for neither.

    Raises:
        ConfigError: only one is given, or a file is invalid.
    """
    if secret_key_file is None and allowed_dir is None:
        return None
    if secret_key_file is None or allowed_dir is None:
        raise ConfigError("`curve_secret_key` and `curve_allowed_keys` go together. Found: "
                          f"{secret_key_file!r} and {allowed_dir!r}")
    return ServerCurve(secret_key_file, allowed_dir)


def client_curve(curve_key: str | os.PathLike | None,
                 server_key: str | os.PathLike | None) -> ClientCurve | None:
    """The client's keys for both arguments, None for neither.

    Raises:
        ConfigError: only one is given, or a file is invalid.
    """
    if curve_key is None and server_key is None:
        return None
    if curve_key is None or server_key is None:
        raise ConfigError("`curve_key` and `server_key` go together. Found: "
                          f"{curve_key!r} and {server_key!r}")
    return ClientCurve(os.fspath(curve_key), os.fspath(server_key))


def secure_server(sock: zmq.Socket, curve: ServerCurve | None) -> None:
    """Make ``sock`` (before it binds) a CURVE server checked by ZAP; nothing without policy."""
    if curve is None:
        return
    sock.curve_server = True
    sock.curve_secretkey = curve.secret
    sock.curve_publickey = curve.public
    sock.zap_domain = ZAP_DOMAIN.encode()


def secure_client(sock: zmq.Socket, curve: ClientCurve | None) -> None:
    """Make ``sock`` (before it connects) a CURVE client; nothing without keys."""
    if curve is None:
        return
    sock.curve_serverkey = curve.server
    sock.curve_publickey = curve.public
    sock.curve_secretkey = curve.secret


# Monitor events of a handshake that will fail again on every retry.
HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


def handshake_failure(event: int, value: int, endpoint: str) -> ServerUnavailable | None:
    """The error a client raises for a monitor event, or None when the event is no refusal.

    Args:
        event: the monitor event.
        value: its value (the ZAP status code, or the protocol error code).
        endpoint: the server's endpoint.
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return ServerUnavailable(endpoint, f"authentication refused (CURVE): the server's "
                                           f"ZAP handler answered {value}; is this client's "
                                           "public key in the server's --curve-allowed-keys?")
    if (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
        return ServerUnavailable(endpoint, "authentication refused (CURVE): security mechanism "
                                           "mismatch; the server and this client disagree on "
                                           "CURVE (give both or neither curve_key/server_key)")
    return None
