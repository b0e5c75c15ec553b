"""A table of message kinds and its codec: the one way a message is defined and travels.

A message is one small JSON header frame followed by zero or more raw buffer frames::

    [header, buffer_0, buffer_1, ...]

The header is ``{"magic": "dataflow", "version": VERSION, "kind": K, ...}`` plus the fields the
kind's :class:`MessageSpec` lists, each checked by its validator. Nothing is pickled. A kind is
one entry in its table: its dataclass, its header fields, an optional rule between fields and
an optional :class:`~dataflow.wire.fields.BodyCodec` for its buffer frames. A :class:`Codec`
encodes and decodes the kinds of one table: the wire's (:data:`~dataflow.wire.codec.SPECS`)
and a server's internal messages (:data:`~dataflow.wire.internal.INTERNAL_SPECS`).

:meth:`Codec.decode` validates everything and raises :class:`~dataflow.errors.ProtocolError` on
anything malformed, truncated, oversized or of another version, also on what this module did
not foresee: a receiver never dies of a message. :meth:`Codec.parse_header` validates the header
alone, and its :meth:`Header.message` the rest: a receiver can decide from the header before it
reads the buffer frames, without parsing the header twice. A kind's ``varies`` field (BATCH's
``req_id``) lets a header that differs from one decoded shortly before only in that field's
value be decoded from that one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from dataflow.errors import FieldError, ProtocolError
from dataflow.wire.fields import (
    MAX_HEADER_BYTES,
    BodyCodec,
    FieldSpec,
    check_sizes,
    frame_sizes,
)
from dataflow.wire.messages import MAGIC, VERSION, Buffer


@dataclass(frozen=True)
class MessageSpec:
    """How one kind travels.

    Attributes:
        cls: its dataclass.
        fields: its header fields, in header order.
        body: codec of its buffer frames, or None for a header-only kind.
        check: rule between fields, run on the header-only message (raises ProtocolError).
        varies: an integer header field (of ``fields``) that no other field's validity and
            no ``check`` depend on, such as a request id, or "" (none): a header equal to
            one decoded shortly before but for that field's digits is decoded from that one
            (:meth:`Codec.parse_header`), its value alone validated anew.
    """

    cls: type
    fields: tuple[FieldSpec, ...] = ()
    body: BodyCodec | None = None
    check: Callable[[Any], None] | None = None
    varies: str = ""

    @property
    def described(self) -> tuple[FieldSpec, ...]:
        """The header fields that describe the buffer frames (the body's)."""
        return self.body.fields if self.body is not None else ()


def _guarded(parse: Callable[[Any], Any], data: Any) -> Any:
    """``parse(data)``, with any error it did not foresee turned into a ProtocolError."""
    try:
        return parse(data)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"malformed message: {type(e).__name__}: {e}"[:400]) from e


class _Entry(NamedTuple):
    """A kind's spec, laid out for the codec's loops."""

    kind: IntEnum
    spec: MessageSpec
    keys: frozenset[str]  # every key its header may have
    required: tuple[str, ...]  # the keys it must have
    fields: tuple[tuple[str, str, Callable[[Any], Any]], ...]  # (key, attr, check)
    described: tuple[tuple[str, str, Callable[[Any], Any]], ...]  # the body's
    dumps: tuple[tuple[str, str, Callable[[Any], Any], bool, Any], ...]  # key, attr, dump,
    # optional, omit
    varies: tuple[str, str, Callable[[Any], Any]] | None  # spec.varies: (key, attr, check)


def _entry(kind: IntEnum, spec: MessageSpec) -> _Entry:
    every = (*spec.fields, *spec.described)
    varies = [(f.name, f.attr, f.check) for f in spec.fields if f.name == spec.varies]
    if spec.varies and not varies:
        raise ValueError(f"{kind.name}: `varies` names no field: {spec.varies!r}")
    return _Entry(kind, spec, frozenset(("magic", "version", "kind", *(f.name for f in every))),
                  tuple(f.name for f in every if not f.optional),
                  tuple((f.name, f.attr, f.check) for f in spec.fields),
                  tuple((f.name, f.attr, f.check) for f in spec.described),
                  tuple((f.name, f.attr, f.dump, f.optional, f.omit) for f in spec.fields),
                  varies[0] if varies else None)


class Header(NamedTuple):
    """A decoded and validated header frame.

    Attributes:
        kind: the message's kind.
        spec: how the kind travels.
        msg: the header-only message (no payload: see :meth:`Codec.decode_header`).
        described: the values of the body's header fields (e.g. its size), by attribute.
    """

    kind: IntEnum
    spec: MessageSpec
    msg: Any
    described: dict[str, Any]

    def message(self, frames: Sequence[Any]) -> Any:
        """The whole message, from the ``frames`` that followed the header.

        Raises:
            ProtocolError: the frames are not those the header announces, or are invalid.
        """
        return _guarded(self._message, frames)

    def _message(self, frames: Sequence[Any]) -> Any:
        if self.spec.body is None:
            check_sizes(self.kind.name, [], frame_sizes(frames))
            return self.msg
        return self.spec.body.decode(self.msg, self.described, frames)


_JSON = json.JSONEncoder(separators=(",", ":"))
# Headers remembered per codec for their `varies` field (all forgotten when full), and the
# largest remembered: at most 64 x 2 x 4 KiB.
SEEN = 64
SEEN_MAX_BYTES = 4096


class Codec:
    """Encoder and validating decoder of one table of message kinds.

    A message is a JSON header frame ``{"magic": "dataflow", "version": VERSION, "kind": K, ...}``
    with the fields the kind's :class:`MessageSpec` lists, then its body's buffer frames.

    Args:
        specs: how each kind (an ``IntEnum`` member: its value is the header's ``kind``)
            travels.
    """

    def __init__(self, specs: Mapping[Any, MessageSpec]) -> None:
        self._kind_of: dict[type, IntEnum] = {spec.cls: kind for kind, spec in specs.items()}
        self._entries = {int(kind): _entry(kind, spec) for kind, spec in specs.items()}
        varies = sorted({re.escape(spec.varies) for spec in specs.values() if spec.varies})
        # The first `varies` field of a header and its value, a JSON integer in canonical
        # form. Inside a JSON string a quote is escaped, so `"key":` matches a key only.
        self._varies = (re.compile(f'"({"|".join(varies)})":(0|[1-9][0-9]{{0,18}})[,}}]'
                                   .encode()) if varies else None)
        # (before, after) the value -> the header decoded, its `varies` (key, attr, check);
        # shared by the threads decoding with this codec (a dict's get, set and clear are
        # atomic)
        self._seen: dict[tuple[bytes, bytes],
                         tuple[Header, tuple[str, str, Callable[[Any], Any]]]] = {}

    def kind_of(self, msg: Any) -> IntEnum:
        """The kind of a message object."""
        kind = self._kind_of.get(type(msg))
        if kind is not None:
            return kind
        for cls in type(msg).__mro__:
            if cls in self._kind_of:
                return self._kind_of[cls]
        raise ProtocolError(f"not a message: {type(msg).__name__}")

    def encode(self, msg: Any) -> list[Buffer]:
        """Frames of ``msg``: the header, then raw buffers.

        Buffers of at least 64 KiB are memoryviews of the message's arrays (send them with
        ``copy=False``); smaller ones are ``bytes``.

        Raises:
            ProtocolError: the message cannot be represented (oversized, unsupported dtype).
        """
        kind = self.kind_of(msg)
        entry = self._entries[kind]
        header: dict[str, Any] = {"magic": MAGIC, "version": VERSION, "kind": int(kind)}
        for key, attr, dump, optional, omit in entry.dumps:
            value = getattr(msg, attr)
            if not (optional and value == omit):
                header[key] = dump(value)
        frames: list[Buffer] = []
        if entry.spec.body is not None:
            described, frames = entry.spec.body.encode(msg)
            header.update(described)
        data = _JSON.encode(header).encode("utf-8")
        if len(data) > MAX_HEADER_BYTES:
            raise ProtocolError(f"{kind.name} header is {len(data)} bytes; the limit is "
                                f"{MAX_HEADER_BYTES}")
        return [data, *frames]

    def parse_header(self, header: Any) -> Header:
        """Decode and validate a header frame alone.

        A header of a kind with ``varies`` that equals one of the latest :data:`SEEN` decoded
        (of at most :data:`SEEN_MAX_BYTES`) but for that field's value is that one's message
        with this value, validated: the same result as decoding it, without the JSON and the
        other fields' checks again (a stream's BATCH headers differ in their ``req_id``).

        Raises:
            ProtocolError: the header is malformed, oversized or of another version.
        """
        return _guarded(self._parse, header)

    def decode_header(self, header: Any) -> Any:
        """The header-only message of a header frame.

        For INDEX, REQUEST and BATCH the result carries no payload (empty ``index_json``, no
        ``ranges`` rows, empty ``data``); a BATCH's frames are described by
        :meth:`~dataflow.wire.layout.BatchLayout.of`.

        Raises:
            ProtocolError: the header is malformed, oversized or of another version.
        """
        return self.parse_header(header).msg

    def decode(self, frames: Sequence[Any]) -> Any:
        """Decode and validate a whole message (header frame + buffer frames).

        Arrays of a BATCH are fresh writable views of one buffer (never aliases of the frames).

        Raises:
            ProtocolError: anything malformed, truncated, oversized or of another version.
        """
        return _guarded(self._decode, frames)

    def _decode(self, frames: Sequence[Any]) -> Any:
        if not frames:
            raise ProtocolError("empty message")
        return self._parse(frames[0])._message(frames[1:])

    def _parse(self, header: Any) -> Header:
        n = memoryview(header).nbytes
        if n > MAX_HEADER_BYTES:
            raise ProtocolError(f"header is {n} bytes; the limit is {MAX_HEADER_BYTES}")
        raw = bytes(memoryview(header))
        found = (self._varies.search(raw)
                 if self._varies is not None and n <= SEEN_MAX_BYTES else None)
        if found is not None:
            place = (raw[:found.start(2)], raw[found.end(2):])
            seen = self._seen.get(place)
            if seen is not None:
                again = _again(*seen, int(found.group(2)))
                if again is not None:
                    return again
        parsed = self._decode_json(raw)
        if found is not None:
            self._remember(raw, found, place, parsed)
        return parsed

    def _remember(self, raw: bytes, found: re.Match[bytes], place: tuple[bytes, bytes],
                  parsed: Header) -> None:
        """Remember ``parsed`` (from ``raw``) for headers that differ from ``raw`` only in the
        digits ``found``: when those are its kind's `varies` field, its only one."""
        varies = self._entries[int(parsed.kind)].varies
        if (varies is None or found.group(1).decode() != varies[0]
                or raw.count(b'"%s":' % found.group(1)) != 1
                or getattr(parsed.msg, varies[1]) != int(found.group(2))):
            return
        if len(self._seen) >= SEEN:
            self._seen.clear()
        self._seen[place] = (parsed, varies)

    def _decode_json(self, raw: bytes) -> Header:
        try:
            h = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ProtocolError(f"header is not UTF-8 JSON: {e}") from e
        if not isinstance(h, dict):
            raise ProtocolError(f"header must be a JSON object. Found: {type(h).__name__}")
        if h.get("magic") != MAGIC:
            raise ProtocolError(f"header field `magic` must be {MAGIC!r}. Found: "
                                f"{h.get('magic')!r}"[:400])
        if type(h.get("version")) is not int or h["version"] != VERSION:
            raise ProtocolError(f"header field `version` (the protocol version) must be "
                                f"{VERSION}. Found: {h.get('version')!r}"[:400])
        raw_kind: Any = h.get("kind")
        entry = self._entries.get(raw_kind) if type(raw_kind) is int else None
        if entry is None:
            raise ProtocolError(f"header field `kind` must be one of {list(self._entries)}. "
                                f"Found: {raw_kind!r}"[:400])
        kind = entry.kind
        if not entry.keys.issuperset(h):
            key = next(k for k in h if k not in entry.keys)
            raise ProtocolError(f"{kind.name} header: unexpected field `{key}`"[:400])
        for key in entry.required:
            if key not in h:
                raise ProtocolError(f"{kind.name} header: missing field `{key}`")
        values = _checked(kind, entry.fields, h)
        described = _checked(kind, entry.described, h)
        spec = entry.spec
        if spec.body is not None:
            values[spec.body.attr] = spec.body.empty
        msg = spec.cls(**values)
        if spec.check is not None:
            spec.check(msg)
        return Header(kind, spec, msg, described)


def _again(seen: Header, varies: tuple[str, str, Callable[[Any], Any]],
           value: int) -> Header | None:
    """The header ``seen`` with its kind's `varies` field (``(key, attr, check)``) ``value``,
    validated; None when ``value`` is invalid (the caller then decodes the header, which
    raises)."""
    _, attr, check = varies
    try:
        checked = check(value)
    except FieldError:
        return None
    msg = object.__new__(type(seen.msg))  # a copy (messages are dataclasses without slots)
    msg.__dict__.update(seen.msg.__dict__)
    msg.__dict__[attr] = checked
    return Header(seen.kind, seen.spec, msg, dict(seen.described))


def _checked(kind: IntEnum, fields: tuple[tuple[str, str, Callable[[Any], Any]], ...],
             h: dict[str, Any]) -> dict[str, Any]:
    """The values of ``fields`` present in header ``h``, by attribute, each checked."""
    values = {}
    for key, attr, check in fields:
        if key in h:
            try:
                values[attr] = check(h[key])
            except FieldError as e:
                raise ProtocolError(f"{kind.name} header field `{key}`: {e}. Found: "
                                    f"{h[key]!r}"[:400]) from None
    return values
