"""Limits of the wire protocol, validators of header fields, and the parts of a kind's spec.

A validator takes a value parsed from the JSON header and returns the Python value of the
field, or raises :class:`~dataflow.errors.FieldError` with the reason (the codec adds the kind,
the field's name and the value found).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dataflow.checks import as_int, int_rule
from dataflow.errors import FieldError, ProtocolError

MAX_HEADER_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 2 * 1024**3
MAX_INDEX_BYTES = 256 * 1024 * 1024
MAX_ARRAYS = 1024
MAX_NDIM = 8
MAX_NAME = 256
MAX_TEXT = 16 * 1024
MAX_RANGES = 1 << 20
MAX_CREDITS = 1 << 16
MAX_WORKERS = 1 << 20
MAX_COUNTERS = 256
MAX_COUNTER_LIST = 4096
MAX_BATCH_SIZE = 1 << 24
MAX_COLUMNS = 1024
MAX_COLUMNS_BYTES = 32 * 1024
MAX_SHM_SLOTS = 4096
MAX_GROUP = 64
MAX_APART_PIECES = MAX_ARRAYS  # arrays x parts of a BATCH sent apart: its frames stay few
MAX_LEFT_OUT_RUNS = 1024
INT64_MAX = 2**63 - 1

Validator = Callable[[Any], Any]


def integer(lo: int, hi: int) -> Validator:
    """An integer in ``[lo, hi]`` (:func:`dataflow.checks.as_int`: a JSON ``true`` is not)."""
    def check(v: Any) -> int:
        n = as_int(v)
        if n is None or not lo <= n <= hi:
            raise FieldError(f"must be {int_rule(lo, hi)}")
        return n
    return check


def boolean(v: Any) -> bool:
    """``true`` or ``false``."""
    if not isinstance(v, bool):
        raise FieldError("must be true or false")
    return v


def routing_id(v: Any) -> bytes:
    """A ZeroMQ routing id (a session token): 1 to :data:`MAX_NAME` bytes, carried as a string
    of one character per byte (latin-1: any bytes travel)."""
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
        raise FieldError(f"must be a string of 1 to {MAX_NAME} characters")
    try:
        return v.encode("latin-1")
    except UnicodeEncodeError:
        raise FieldError("must be characters U+0000 to U+00FF (one per byte)") from None


def text(limit: int) -> Validator:
    """A string of at most ``limit`` characters."""
    def check(v: Any) -> str:
        if not isinstance(v, str) or len(v) > limit:
            raise FieldError(f"must be a string of at most {limit} characters")
        return v
    return check


def hex_text(length: int) -> Validator:
    """A string of exactly ``length`` lowercase hex digits."""
    def check(v: Any) -> str:
        if (not isinstance(v, str) or len(v) != length
                or v.strip("0123456789abcdef") != ""):
            raise FieldError(f"must be {length} lowercase hex digits")
        return v
    return check


def string_list(limit: int, item_limit: int) -> Validator:
    """A list of at most ``limit`` non-empty strings of at most ``item_limit`` characters."""
    def check(v: Any) -> tuple[str, ...]:
        if (not isinstance(v, list) or len(v) > limit
                or not all(isinstance(e, str) and 0 < len(e) <= item_limit for e in v)):
            raise FieldError(f"must be a list of at most {limit} non-empty strings of at most "
                             f"{item_limit} characters")
        return tuple(v)
    return check


def column_names(v: Any) -> tuple[str, ...]:
    """A column subset (HELLO ``columns``): a list of 1 to :data:`MAX_COLUMNS` distinct field
    names, each a non-empty string of at most :data:`MAX_NAME` characters, and at most
    :data:`MAX_COLUMNS_BYTES` bytes as JSON (so a HELLO header always fits its limit)."""
    if not isinstance(v, list) or not 0 < len(v) <= MAX_COLUMNS:
        raise FieldError(f"must be a list of 1 to {MAX_COLUMNS} field names")
    for name in v:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise FieldError(f"field names must be non-empty strings of at most {MAX_NAME} "
                             f"characters; {repr(name)[:80]} is not")
    seen: set[str] = set()
    for name in v:
        if name in seen:
            raise FieldError(f"names field {name!r} twice")
        seen.add(name)
    if len(json.dumps(v)) > MAX_COLUMNS_BYTES:
        raise FieldError(f"must take at most {MAX_COLUMNS_BYTES} bytes as JSON")
    return tuple(v)


def choice(values: dict[str, Any]) -> Validator:
    """One of the strings ``values`` maps; returns what it maps to."""
    def check(v: Any) -> Any:
        if not isinstance(v, str) or v not in values:
            raise FieldError(f"must be one of {sorted(values)}")
        return values[v]
    return check


def counters(v: Any) -> dict[str, int | list[int]]:
    """At most 256 ``name -> int`` or ``name -> list[int]`` entries."""
    if not isinstance(v, dict) or len(v) > MAX_COUNTERS:
        raise FieldError(f"must be an object of at most {MAX_COUNTERS} entries")
    for k, c in v.items():
        ok = as_int(c) is not None or (isinstance(c, list) and len(c) <= MAX_COUNTER_LIST
                                       and all(as_int(x) is not None for x in c))
        if not ok or len(k) > MAX_NAME:
            raise FieldError(f"counter {k[:MAX_NAME]!r} must be an integer or a list of at most "
                             f"{MAX_COUNTER_LIST} integers")
    return v


def _same(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class FieldSpec:
    """One header field of a message kind.

    Attributes:
        attr: the dataclass attribute it carries.
        check: validator of the JSON value (returns the attribute's value).
        key: its name in the header (``attr`` when empty).
        dump: attribute value -> JSON value.
        optional: the field may be missing (the dataclass default applies); it is left out of
            the header when the attribute equals ``omit``, so peers that predate the field
            read and write the same headers as before it existed.
        omit: the attribute value written as "missing" (only with ``optional``).
    """

    attr: str
    check: Validator
    key: str = ""
    dump: Callable[[Any], Any] = _same
    optional: bool = False
    omit: Any = None

    @property
    def name(self) -> str:
        return self.key or self.attr


class BodyCodec(ABC):
    """The buffer frames after the header of one kind, and the header fields describing them.

    Attributes:
        attr: the dataclass attribute the frames carry.
        empty: its value in a header-only decode.
        fields: header fields that describe the frames (e.g. their size).
    """

    attr: str
    empty: Any
    fields: tuple[FieldSpec, ...] = ()

    @abstractmethod
    def encode(self, msg: Any) -> tuple[dict[str, Any], list[Any]]:
        """JSON values of :attr:`fields`, and the frames carrying ``msg``'s payload."""

    @abstractmethod
    def decode(self, head: Any, described: dict[str, Any], frames: Sequence[Any]) -> Any:
        """The whole message: ``head`` with its payload from ``frames``, checked first (count and
        sizes with :func:`check_sizes`, and anything else the payload must satisfy).

        Raises:
            ProtocolError: the frames are not those announced, or the payload is invalid.
        """


def frame_sizes(frames: Sequence[Any]) -> list[int]:
    """Sizes in bytes of ``frames`` (anything with the buffer protocol)."""
    return [memoryview(f).nbytes for f in frames]


def check_sizes(what: str, announced: Sequence[int], sizes: Sequence[int]) -> None:
    """The check of the buffer frames after a header: as many as announced, each of its size.

    Args:
        what: the message, as errors name it (``"REQUEST"``, ``"BATCH 7"``).
        announced: the sizes in bytes its header announces, in frame order.
        sizes: the sizes in bytes of every frame that followed the header, in order.

    Raises:
        ProtocolError: a frame missing or in excess, or a frame of another size.
    """
    if len(sizes) != len(announced):
        raise ProtocolError(f"{what} message must have {len(announced)} buffer frame(s) after "
                            f"the header. Found: {len(sizes)}")
    for i, (got, n) in enumerate(zip(sizes, announced, strict=True)):
        if got != n:
            raise ProtocolError(f"{what} buffer frame {i} must be {n} bytes. Found: {got}")
