"""Raw ZMTP 3.x on a TCP socket, for tests and the fuzzer: a peer that says exactly what it is
told, including what no ZeroMQ library would say.

ZMTP 3.0 (rfc.zeromq.org/spec/23): a 64-byte greeting (signature ``FF 8x00 7F``, version,
mechanism name padded to 20 bytes, as-server flag, 31 bytes of filler), then the mechanism's
handshake (NULL: a READY command with the socket type), then frames: a flags byte (``0x01``
more, ``0x02`` long size, ``0x04`` command), the size (1 byte, or 8 bytes big-endian when long)
and the body. ZMTP 3.1 adds the PING/PONG commands (TTL and a context of at most 16 bytes).

:func:`zmtp_connect` and :func:`frame` build valid traffic; the ``*_mutated`` functions build
traffic that is wrong in one structured way, each returning a label for the report.
"""

from __future__ import annotations

import socket
import struct
from typing import TypeVar

import numpy as np

T = TypeVar("T")

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
MECHANISMS = (b"NULL", b"PLAIN", b"CURVE", b"GSSAPI", b"", b"null", b"NULL\0X", b"\xff" * 20)
SOCKET_TYPES = (b"DEALER", b"ROUTER", b"REQ", b"REP", b"PUB", b"SUB", b"PAIR", b"STREAM",
                b"", b"dealer", b"\0" * 8)
COMMANDS = (b"PING", b"PONG", b"READY", b"ERROR", b"SUBSCRIBE", b"CANCEL", b"HELLO",
            b"WELCOME", b"INITIATE", b"", b"\xff" * 255)


def greeting(version: tuple[int, int] = (3, 0), mechanism: bytes = b"NULL",
             as_server: int = 0) -> bytes:
    """A 64-byte ZMTP 3 greeting."""
    return (b"\xff" + b"\0" * 8 + b"\x7f" + bytes(version) + mechanism[:20].ljust(20, b"\0")
            + bytes([as_server]) + b"\0" * 31)


def frame(body: bytes, *, more: bool = False, command: bool = False,
          long: bool = False) -> bytes:
    """One frame carrying ``body`` (long form when ``long``, or when the body needs it)."""
    long = len(body) > 255 or bool(long)
    flags = (MORE if more else 0) | (COMMAND if command else 0) | (LONG if long else 0)
    size = len(body).to_bytes(8, "big") if long else bytes([len(body)])
    return bytes([flags]) + size + body


def zmtp_frame(payload: bytes, *, more: bool) -> bytes:
    """One ZMTP 3.0 message frame (long form) carrying ``payload``."""
    return frame(payload, more=more, long=True)


def command(name: bytes, data: bytes = b"") -> bytes:
    """A command frame: ``name`` (at most 255 bytes) and its data."""
    return frame(bytes([len(name)]) + name + data, command=True)


def ready(socket_type: bytes = b"DEALER", **extra: bytes) -> bytes:
    """A NULL mechanism's READY command with ``Socket-Type`` and ``extra`` properties."""
    props = {"Socket-Type": socket_type, **extra}
    data = b"".join(bytes([len(k)]) + k.encode() + struct.pack(">I", len(v)) + v
                    for k, v in props.items())
    return command(b"READY", data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``.

    Raises:
        ConnectionError: the peer closed first.
    """
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed during the ZMTP handshake")
        buf += chunk
    return buf


def zmtp_connect(endpoint: str, timeout: float = 10.0, *, identity: bytes = b"",
                 source: str | None = None) -> socket.socket:
    """A raw TCP connection to ``endpoint`` (``tcp://host:port``) past the ZMTP 3.0 NULL
    handshake as a DEALER with routing id ``identity`` (none: the server picks one), from
    local address ``source`` (e.g. another loopback address); what follows is up to the
    caller (see :func:`zmtp_frame`)."""
    sock = tcp_connect(endpoint, timeout, source=source)
    try:
        sock.sendall(greeting())
        recv_exact(sock, 64)
        sock.sendall(ready(Identity=identity) if identity else ready())
    except BaseException:
        sock.close()
        raise
    return sock


def tcp_connect(endpoint: str, timeout: float = 10.0, *,
                source: str | None = None) -> socket.socket:
    """A plain TCP connection to ``tcp://host:port``, from local address ``source``."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout,
                                    source_address=None if source is None else (source, 0))


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _pick(rng: np.random.Generator, options: tuple[T, ...]) -> T:
    return options[int(rng.integers(len(options)))]


def greeting_mutated(rng: np.random.Generator) -> tuple[str, bytes]:
    """A greeting wrong in one field, or random bytes, or cut short."""
    good = bytearray(greeting())
    op = int(rng.integers(0, 6))
    if op == 0:
        return "greeting-random", rng.bytes(int(rng.integers(0, 80)))
    if op == 1:
        return "greeting-truncated", bytes(good[: int(rng.integers(0, 64))])
    if op == 2:
        good[_pick(rng, (0, 9))] = int(rng.integers(0, 256))
        return "greeting-signature", bytes(good)
    if op == 3:
        version = (int(rng.integers(0, 256)), int(rng.integers(0, 256)))
        return "greeting-version", greeting(version=version)
    if op == 4:
        return "greeting-mechanism", greeting(mechanism=_pick(rng, MECHANISMS))
    return "greeting-as-server", greeting(as_server=int(rng.integers(1, 256)))


def ready_mutated(rng: np.random.Generator) -> tuple[str, bytes]:
    """A READY command wrong in one way: socket type, property sizes, names, size form."""
    op = int(rng.integers(0, 5))
    if op == 0:
        return "ready-socket-type", ready(_pick(rng, SOCKET_TYPES))
    if op == 1:
        body = bytearray(ready()[2:])  # name, then a property whose value size overflows
        body[-10:-6] = struct.pack(">I", int(rng.integers(7, 1 << 32)))
        return "ready-property-size", frame(bytes(body), command=True)
    if op == 2:
        return "ready-identity", ready(Identity=rng.bytes(int(rng.integers(0, 300))))
    if op == 3:
        return "ready-random", command(b"READY", rng.bytes(int(rng.integers(0, 200))))
    return "ready-as-message", frame(ready()[2:])  # READY's body without the command flag


def command_mutated(rng: np.random.Generator) -> tuple[str, bytes]:
    """A command after the handshake: PING/PONG with any TTL and context size, or another
    command name with random data, in short or long form."""
    op = int(rng.integers(0, 3))
    if op == 0:
        ttl = int(rng.integers(0, 1 << 16)).to_bytes(2, "big")
        return "command-ping", command(b"PING", ttl + rng.bytes(int(rng.integers(0, 40))))
    if op == 1:
        return "command-pong", command(b"PONG", rng.bytes(int(rng.integers(0, 40))))
    name = _pick(rng, COMMANDS)
    body = bytes([len(name)]) + name + rng.bytes(int(rng.integers(0, 300)))
    return "command-other", frame(body, command=True, long=bool(rng.integers(0, 2)))


def partial_frame(rng: np.random.Generator, max_size: int) -> tuple[str, bytes]:
    """A frame header announcing up to ``max_size`` bytes, followed by fewer; or a multipart
    message whose last frame never comes."""
    if rng.random() < 0.5:
        size = int(rng.integers(1, max_size))
        head = bytes([LONG | (MORE if rng.random() < 0.5 else 0)]) + size.to_bytes(8, "big")
        return "partial-frame", head + rng.bytes(int(rng.integers(0, min(size, 4096))))
    parts = [frame(rng.bytes(int(rng.integers(0, 512))), more=True)
             for _ in range(int(rng.integers(1, 20)))]
    return "multipart-unfinished", b"".join(parts)
