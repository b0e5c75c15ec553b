"""The long fuzzer's attacks: one seeded round each, against a running server.

* :func:`router_round`: structure-aware messages (:mod:`dataflow.bench.fuzz.gen`) on the
  client-facing socket from a fresh DEALER, the server's malformed count predicted per message;
  the round ends with a BYE, so it leaves no session behind.
* :func:`data_round`: the same on a reader's data socket, in lockstep: the reader must answer
  each message, with an ERROR or (for a HEARTBEAT) a HEARTBEAT, as predicted.
* :func:`zmtp_round`: raw ZMTP (:mod:`dataflow.bench.fuzz.zmtp`) on either socket: mutated
  greetings and READYs, commands (PING with any TTL and context), partial frames, unfinished
  multipart messages, wire messages framed by hand, connections reset mid-way; on a CURVE
  server also DEALERs whose keys it does not allow.
* :func:`flood_round`: many raw connections each sending thousands of empty messages at once,
  then silent (answering no ZMTP PING) for a while, then reset or closed.

Thread invariant: each round runs on one thread with its own sockets; what rounds share is the
:class:`Tally` (locked) and the read-only :class:`Target`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import zmq

from dataflow import wire
from dataflow.bench.fuzz import zmtp
from dataflow.bench.fuzz.gen import (
    data_may_cut,
    data_outcome,
    labelled_messages,
    router_outcome,
)
from dataflow.security import ClientCurve, secure_client

ROUTER_MESSAGES = 200
DATA_MESSAGES = 100
ZMTP_ATTEMPTS = 20
SEND_TIMEOUT_MS = 2000
RAW_TIMEOUT_S = 5.0
FLOOD_CONNECTIONS = (8, 64)
FLOOD_MESSAGES = (1000, 20_000)
EMPTY_MESSAGE = b"\x00\x00"  # one frame, short form, no body


@dataclass(frozen=True)
class Target:
    """A running server, as the attacks see it.

    Attributes:
        endpoint: its client-facing endpoint.
        data: its readers' data endpoints.
        fields: the fields it serves (for the HELLO oracle).
        max_request_samples: its ``--max-request-samples``.
        curve: the keys of a client it allows (None: clear text).
        answer_timeout: seconds a reader may take to answer one message.
    """

    endpoint: str
    data: tuple[str, ...]
    fields: tuple[str, ...]
    max_request_samples: int
    curve: ClientCurve | None
    answer_timeout: float


@dataclass
class Tally:
    """What the attacks sent and what the server must have counted, shared by their threads.

    Attributes:
        sent: messages or connections sent, by ``(attack, label)``.
        malformed_min: malformed messages the server must count (the oracle's, for messages
            surely delivered).
        malformed_extra: complete messages sent raw to the client-facing socket: the server
            may count up to that many more.
        violations: what went wrong, one line each.
    """

    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    malformed_min: int = 0
    malformed_extra: int = 0
    violations: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, attack: str, label: str, n: int = 1, *, malformed: int = 0,
              extra: int = 0) -> None:
        with self._lock:
            self.sent[(attack, label)] += n
            self.malformed_min += malformed
            self.malformed_extra += extra

    def violation(self, text: str) -> None:
        with self._lock:
            self.violations.append(text)


@dataclass(frozen=True)
class Round:
    """One round of one attack: where, with what randomness, reporting to what.

    Attributes:
        target: the server attacked.
        rng: this round's generator (from ``seed``).
        tally: where counts and violations go.
        stop: set when the fuzz ends (a round returns soon after).
        seed: this round's seed (named in its violations, to replay it).
        hold: most seconds a flood's connections stay silent.
    """

    target: Target
    rng: np.random.Generator
    tally: Tally
    stop: threading.Event
    seed: int
    hold: float = 0.0

    def violation(self, attack: str, text: str) -> None:
        self.tally.violation(f"{attack} (seed {self.seed}): {text}")


def _dealer(endpoint: str, routing_id: bytes, curve: ClientCurve | None) -> zmq.Socket:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    secure_client(sock, curve)
    sock.connect(endpoint)
    return sock


def _drain(sock: zmq.Socket) -> None:
    while sock.poll(0):
        sock.recv_multipart()


def _routing_id(rng: np.random.Generator, prefix: bytes) -> bytes:
    return prefix + b"-%016x" % int(rng.integers(0, 1 << 62))


def router_round(r: Round) -> None:
    """:data:`ROUTER_MESSAGES` mutated messages on the client-facing socket, then a BYE (no
    session is left behind) and a closing REQUEST: the server handles a connection's messages
    in order, so its answer (ERROR UnknownClient, the session gone) proves it has counted all
    the round's messages. A control answer to a client whose queue is full is dropped (STATS
    ``dropped_sends``), so the closing REQUEST is repeated, each a second apart, until one is
    answered."""
    t, rng, tally = r.target, r.rng, r.tally
    sock = _dealer(t.endpoint, _routing_id(rng, b"fz"), t.curve)
    session = False
    first_closing = int(rng.integers(1 << 61, 1 << 62))
    try:
        for label, frames in labelled_messages(rng, ROUTER_MESSAGES):
            if r.stop.is_set():
                break
            try:
                sock.send_multipart(frames)
            except zmq.Again:  # not sent: the server is not reading (counted, not predicted)
                tally.count("router", "send timed out")
                continue
            malformed, session = router_outcome(frames, session, t.fields,
                                                t.max_request_samples)
            tally.count("router", label, malformed=int(malformed))
            _drain(sock)
        sock.setsockopt(zmq.SNDTIMEO, int(t.answer_timeout * 1000))
        deadline = time.monotonic() + t.answer_timeout
        try:
            sock.send_multipart(wire.encode(wire.Bye()))
            tally.count("router", "BYE closing the round")
            closing = first_closing
            while time.monotonic() < deadline:
                sock.send_multipart(wire.encode(wire.Request(closing, ((0, 0, 1),))))
                tally.count("router", "closing REQUEST")
                until = time.monotonic() + 1.0
                while time.monotonic() < until:
                    if sock.poll(100):
                        reply = wire.decode(sock.recv_multipart())
                        if (isinstance(reply, wire.ErrorMsg)
                                and first_closing <= reply.req_id <= closing):
                            return
                closing += 1
        except zmq.Again:
            r.violation("router", f"the server took no message within {t.answer_timeout} s")
            return
        r.violation("router", f"no answer to the round's closing REQUESTs within "
                              f"{t.answer_timeout} s")
    finally:
        sock.close()


def data_round(r: Round) -> None:
    """:data:`DATA_MESSAGES` mutated messages on one reader's data socket, in lockstep: each
    answered as :func:`~dataflow.bench.fuzz.gen.data_outcome` predicts, except that a message
    over the reader's inbound limit may instead cut the connection (then the DEALER
    reconnects)."""
    t, rng = r.target, r.rng
    endpoint = t.data[int(rng.integers(len(t.data)))]
    sock = _dealer(endpoint, _routing_id(rng, b"dfz"), t.curve)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    try:
        for i, (label, frames) in enumerate(labelled_messages(rng, DATA_MESSAGES)):
            if r.stop.is_set():
                return
            what = f"{endpoint} message {i} ({label}, header {frames[0][:60]!r})"
            try:
                sock.send_multipart(frames)
            except zmq.Again:
                r.violation("data", f"{what} not taken within {SEND_TIMEOUT_MS} ms")
                return
            r.tally.count("data", label)
            events = dict(poller.poll(int(t.answer_timeout * 1000)))
            if sock in events:
                answer = wire.decode(sock.recv_multipart())
                error = isinstance(answer, wire.ErrorMsg)
                if error != data_outcome(frames) or not (error or isinstance(answer,
                                                                             wire.Heartbeat)):
                    r.violation("data", f"{what} answered with {wire.kind_of(answer).name}")
            elif monitor in events:
                monitor.recv_multipart()
                if not data_may_cut(frames):
                    r.violation("data", f"{what}: the reader cut the connection")
                    return
                r.tally.count("data", "connection cut (message over the limit)")
            else:
                r.violation("data", f"{what}: no answer within {t.answer_timeout} s")
                return
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def _endpoints(t: Target) -> tuple[str, ...]:
    return (t.endpoint, *t.data)


def _send(sock: socket.socket, data: bytes) -> int:
    """Bytes of ``data`` sent before the peer stopped taking them (or closed)."""
    sent = 0
    view = memoryview(data)
    try:
        while sent < len(data):
            sent += sock.send(view[sent:])
    except OSError:
        pass
    return sent


def _end(rng: np.random.Generator, sock: socket.socket) -> None:
    if rng.random() < 0.5:
        zmtp.reset(sock)
    else:
        sock.close()


def _framed(frames: list[bytes]) -> bytes:
    return b"".join(zmtp.frame(f, more=i < len(frames) - 1) for i, f in enumerate(frames))


def _raw_attempt(t: Target, rng: np.random.Generator, tally: Tally) -> None:
    endpoint = _endpoints(t)[int(rng.integers(len(_endpoints(t))))]
    op = int(rng.integers(0, 5))
    try:
        sock = zmtp.tcp_connect(endpoint, RAW_TIMEOUT_S)
    except OSError:
        tally.count("zmtp", "connect refused")
        return
    try:
        if op == 0:
            label, data = zmtp.greeting_mutated(rng)
            tally.count("zmtp", label)
            _send(sock, data)
            return
        sock.sendall(zmtp.greeting())
        zmtp.recv_exact(sock, 64)
        if op == 1:
            label, data = zmtp.ready_mutated(rng)
            tally.count("zmtp", label)
            _send(sock, data)
            return
        sock.sendall(zmtp.ready())
        if op == 2:
            for _ in range(int(rng.integers(1, 6))):
                label, data = zmtp.command_mutated(rng)
                tally.count("zmtp", label)
                _send(sock, data)
        elif op == 3:
            label, data = zmtp.partial_frame(rng, 1 << 20)
            tally.count("zmtp", label)
            _send(sock, data)
        else:
            batch = labelled_messages(rng, int(rng.integers(1, 6)))
            data = b"".join(_framed(frames) for _, frames in batch)
            tally.count("zmtp", "wire-messages", len(batch),
                        extra=len(batch) if endpoint == t.endpoint else 0)
            _send(sock, data)
    except OSError:
        tally.count("zmtp", "closed by the server")
    finally:
        _end(rng, sock)


def _stranger(server_key: bytes, t: Target, rng: np.random.Generator, tally: Tally) -> None:
    """A DEALER with a fresh key pair the server does not allow, saying HELLO."""
    public, secret = zmq.curve_keypair()
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = server_key
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.connect(_endpoints(t)[int(rng.integers(len(_endpoints(t))))])
        try:  # never blocks: a refused handshake leaves the DEALER without a pipe
            sock.send_multipart(wire.encode(wire.Hello(1, "stranger")), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        tally.count("zmtp", "curve-stranger")
        time.sleep(0.2)
    finally:
        sock.close()


def zmtp_round(r: Round) -> None:
    """:data:`ZMTP_ATTEMPTS` raw connections, each wrong in one structured way."""
    for _ in range(ZMTP_ATTEMPTS):
        if r.stop.is_set():
            return
        if r.target.curve is not None and r.rng.random() < 0.2:
            _stranger(r.target.curve.server, r.target, r.rng, r.tally)
        else:
            _raw_attempt(r.target, r.rng, r.tally)


def flood_round(r: Round) -> None:
    """Many connections past the handshake, each sending thousands of empty messages at once
    (half the time followed by a PING), then silent (no PONG to the server's PINGs) for up to
    ``r.hold`` seconds, then reset or closed."""
    t, rng, tally = r.target, r.rng, r.tally
    endpoint = t.endpoint if rng.random() < 0.7 else t.data[int(rng.integers(len(t.data)))]
    socks: list[socket.socket] = []
    try:
        for _ in range(int(rng.integers(*FLOOD_CONNECTIONS))):
            if r.stop.is_set():
                return
            try:
                socks.append(zmtp.zmtp_connect(endpoint, RAW_TIMEOUT_S))
            except OSError:
                tally.count("flood", "handshake refused")
        tally.count("flood", "connections", len(socks))
        burst = EMPTY_MESSAGE * int(rng.integers(*FLOOD_MESSAGES))
        if rng.random() < 0.5:  # a PING read once the queue is full and the peer gone
            burst += zmtp.command(b"PING", int(rng.integers(0, 1 << 16)).to_bytes(2, "big"))
            tally.count("flood", "bursts ending in a PING", len(socks))
        for sock in socks:
            sock.setblocking(False)  # what the kernel takes now: a stalled server stalls no one
            sent = _send(sock, burst) // len(EMPTY_MESSAGE)
            tally.count("flood", "empty messages", sent,
                        extra=sent if endpoint == t.endpoint else 0)
        r.stop.wait(float(rng.uniform(0, r.hold)))
    finally:
        for sock in socks:
            _end(rng, sock)
