"""Structure-aware mutations of wire messages, and the server's expected answer to each.

Every message kind is encoded, then mutated (header fields dropped, added or retyped, kinds and
versions changed, frames added, dropped, resized or filled with garbage, headers replaced by
garbage or nested JSON). :func:`router_outcome` and :func:`data_outcome` compute, with the wire
module itself, what the server does with a message, so a fuzzer can check the server's counters
and answers exactly. Used by the suite's short fuzz (``tests/integration/test_caps_fuzz.py``)
and by the long one (:mod:`dataflow.bench.fuzz`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np

from dataflow import wire
from dataflow.errors import ProtocolError
from dataflow.server.worker import MAX_DATA_INBOUND
from dataflow.subset import unmatched

MAX_FRAME = 48 * 1024  # below a reader's 64 KiB frame limit (a larger frame cuts the peer)
VALID_SHARE = 0.1  # of the messages, sent as encoded

VALUES: list[Callable[[np.random.Generator], object]] = [
    lambda r: None, lambda r: True, lambda r: -1, lambda r: 2**70, lambda r: 0.5,
    lambda r: int(r.integers(-10, 1 << 20)), lambda r: "x" * int(r.integers(0, 600)),
    lambda r: [], lambda r: {}, lambda r: [[0, 0, 1]] * 3, lambda r: ["a", "uint8", [1]],
    lambda r: {"k": [1, 2]},
]


def seeds() -> list[tuple[str, list[bytes]]]:
    """``(kind name, frames)`` of one valid message of every kind (both directions)."""
    msgs: list[wire.Message] = [
        wire.Hello(4, "fuzz"), wire.Hello(2, "fz", batch_size=16), wire.Request(1, ((0, 0, 4),)),
        wire.Hello(2, "fc", columns=("id", "text")), wire.Hello(1, "fu", columns=("id", "nope")),
        wire.Request(2, ((0, 0, 2), (1, 0, 3))), wire.Heartbeat(), wire.Bye(), wire.Stats(),
        wire.Index(1, 1, "{}", "tok", ("tcp://127.0.0.1:1",)),
        wire.batch_to_message(3, {"x": np.arange(4), "t": np.zeros((4, 2), np.uint8)}),
        wire.ErrorMsg(1, wire.ErrorKind.READ_FAILED, "x"), wire.StatsReply({"a": 1}),
    ]
    return [(wire.kind_of(m).name, [bytes(f) for f in wire.encode(m)]) for m in msgs]


def mutate_header(rng: np.random.Generator, raw: bytes) -> bytes:
    """``raw`` (a JSON header) with one field dropped, retyped or added, or its kind, version
    or magic changed.

    Raises:
        ValueError: ``raw`` is not a JSON object.
    """
    header = json.loads(raw)
    if not isinstance(header, dict) or not header:
        raise ValueError("not a JSON object")
    keys = list(header)
    op = int(rng.integers(0, 6))
    if op == 0:
        del header[keys[int(rng.integers(0, len(keys)))]]
    elif op == 1:
        header[keys[int(rng.integers(0, len(keys)))]] = VALUES[int(rng.integers(len(VALUES)))](rng)
    elif op == 2:
        header[("extra", "batch_size", "columns")[int(rng.integers(0, 3))]] = VALUES[
            int(rng.integers(len(VALUES)))](rng)
    elif op == 3:
        header["kind"] = int(rng.integers(-1, 12))
    elif op == 4:
        header["version"] = int(rng.integers(0, 3))
    else:
        header["magic"] = "dataflow"[: int(rng.integers(0, 9))]
    return json.dumps(header).encode()


def mutate(rng: np.random.Generator, frames: Sequence[bytes]) -> list[bytes]:
    """``frames`` with 1 to 3 structured mutations (header, frame count, frame sizes, bytes)."""
    out = list(frames)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 7))
        if op <= 1:
            try:
                out[0] = mutate_header(rng, out[0])
            except (ValueError, RecursionError):
                out[0] = rng.bytes(int(rng.integers(0, 64)))
        elif op == 2 and len(out) > 1:
            del out[int(rng.integers(1, len(out)))]
        elif op == 2 or op == 3:
            out += [rng.bytes(int(rng.integers(0, 256))) for _ in range(int(rng.integers(1, 6)))]
        elif op == 4 and len(out) > 1:
            i = int(rng.integers(1, len(out)))
            n = int(rng.integers(0, MAX_FRAME))
            out[i] = rng.bytes(n) if rng.random() < 0.5 else (out[i] * 2)[:n]
        elif op == 5:
            raw = bytearray(out[0])
            for _ in range(int(rng.integers(1, 4))):
                if raw:
                    raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
            out[0] = bytes(raw)
        else:
            out[0] = [rng.bytes(int(rng.integers(0, 200))), out[0][: len(out[0]) // 2],
                      b"[" * 40_000, b'{"magic": "dataflow", "version": 1, "kind": 1e999}',
                      b""][int(rng.integers(0, 5))]
    return out


def labelled_messages(rng: np.random.Generator, n: int) -> list[tuple[str, list[bytes]]]:
    """``n`` messages, each ``(label, frames)``: the kind it was made from, ``/valid`` (sent as
    encoded, :data:`VALID_SHARE` of them) or ``/mutated``."""
    made = seeds()
    out = []
    for _ in range(n):
        kind, frames = made[int(rng.integers(len(made)))]
        if rng.random() < VALID_SHARE:
            out.append((f"{kind}/valid", frames))
        else:
            out.append((f"{kind}/mutated", mutate(rng, frames)))
    return out


def messages(rng: np.random.Generator, n: int) -> list[list[bytes]]:
    """The frames of :func:`labelled_messages`."""
    return [frames for _, frames in labelled_messages(rng, n)]


def router_outcome(frames: Sequence[bytes], session: bool, fields: Sequence[str],
                   max_request_samples: int) -> tuple[bool, bool]:
    """``(counted malformed, has a session after)`` for one message to the client-facing
    socket of a server serving ``fields`` with ``--max-request-samples``, from a peer that has
    a session (``session``) or not, as the server decides it."""
    if len(frames) > 3:
        return True, session
    try:
        head = wire.decode_header(frames[0])
        if isinstance(head, wire.Request) and not session:
            return False, session
        msg = wire.decode(list(frames))
    except ProtocolError:
        return True, session
    if isinstance(msg, wire.Index | wire.BatchMsg | wire.ErrorMsg | wire.StatsReply):
        return True, session
    if isinstance(msg, wire.Hello):
        return False, session or ((msg.batch_size or 0) <= max_request_samples
                                  and not unmatched(msg.columns or (), list(fields)))
    return False, session and not isinstance(msg, wire.Bye)


def data_outcome(frames: Sequence[bytes]) -> bool:
    """Whether a reader answers this message on its data socket with an ERROR (else with a
    HEARTBEAT: the one message it accepts there)."""
    try:
        return len(frames) != 1 or not isinstance(wire.decode(list(frames)), wire.Heartbeat)
    except ProtocolError:
        return True


def data_may_cut(frames: Sequence[bytes]) -> bool:
    """Whether a reader may cut the connection a message came on instead of answering it: its
    frames, with ZMTP framing, pass the reader's inbound limit (a reader cuts a connection
    holding more than that not yet received as whole messages; whether it sees so much at
    once depends on timing)."""
    return sum(len(f) + 9 for f in frames) > MAX_DATA_INBOUND
