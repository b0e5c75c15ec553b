"""A streaming walk over the headers of an uncompressed tar held in memory (or a memory map).

Handles POSIX ustar (name prefix), PAX extended headers (``path``, ``size``, ``linkpath``;
webdataset's ``TarWriter`` writes one per member), GNU long names and long link names, hard
links, and both unsigned and signed header checksums.

Damage does not end the walk: it is reported as a :class:`Damage` naming the byte offset of
the header involved, and the walk resumes at the next valid header (see :func:`resync`) when
there is one.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import NamedTuple

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")
_USTAR_POSIX = b"ustar\x0000"
_HIGH_BYTES = bytes(range(0x80, 0x100))


class Damage(NamedTuple):
    """Damage found while walking.

    Attributes:
        offset: byte offset of the header involved.
        message: what is wrong.
        resume: byte offset of the next valid header, where the walk goes on; ``None`` when
            the rest of the tar is lost.
        retract: the member yielded just before is suspect, so must not be used: its data
            runs into a valid header, or the damage starts right after it and the next valid
            header is off its 512-byte grid (bytes lost or added there: a member cut short).
    """

    offset: int
    message: str
    resume: int | None
    retract: bool


class Member(NamedTuple):
    """One regular file in a tar.

    Attributes:
        name: full member path (after PAX / GNU long-name overrides).
        header: byte offset of the member's first header block (PAX or GNU headers included).
        data: byte offset of its data.
        size: data length in bytes.
    """

    name: str
    header: int
    data: int
    size: int


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:
        if field[0] != 0x80:
            raise ValueError("negative base-256 number")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum(block: bytes, signed: bool = False) -> int:
    """Header checksum: the byte sum with the checksum field read as 8 spaces.

    Some old writers summed signed chars; ``signed=True`` computes that variant.
    """
    total = sum(block) - sum(block[148:156]) + 8 * 0x20
    if signed:
        total -= 256 * (len(block) - len(bytes(block).translate(None, _HIGH_BYTES)))
    return total


def _pax_records(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n"):
            raise ValueError("malformed PAX record")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _name(block: bytes | mmap.mmap, start: int, length: int) -> str:
    return block[start : start + length].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def valid_header(data: bytes | mmap.mmap, pos: int) -> bool:
    """Whether a ustar/GNU/PAX header block starts at ``pos``: ``ustar`` magic and a valid
    checksum."""
    block = data[pos : pos + BLOCK]
    if len(block) < BLOCK or block[257:262] != b"ustar":
        return False
    try:
        stored = _octal(block[148:156])
    except ValueError:
        return False
    return stored == _checksum(block) or stored == _checksum(block, signed=True)


def resync(data: bytes | mmap.mmap, after: int) -> int | None:
    """Offset of the first valid header starting after byte ``after``, at any alignment (a
    member cut short moves the headers after it off the 512-byte grid); ``None`` if none.

    Found by searching the ``ustar`` magic, so a scan costs one pass of ``bytes.find``.
    """
    at = after + 1 + 257
    while (hit := data.find(b"ustar", at)) >= 0:
        if valid_header(data, hit - 257):
            return hit - 257
        at = hit + 1
    return None


class _Corrupt(Exception):
    """A header at ``offset`` is damaged."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def walk(data: bytes | mmap.mmap) -> Iterator[Member | Damage]:
    """Yield the regular-file members of an uncompressed tar held in ``data``, and the damage
    met on the way.

    Directories and PAX global headers are passed over; a hard link yields the data of the
    earlier member it names. Zero bytes are an empty archive (as GNU tar reads them).

    Damage (a corrupt header or number, data running past the end, a missing end-of-archive
    marker, an end-of-archive marker with members after it) is yielded as a
    :class:`Damage`, after which the walk resumes at the next valid header after the damaged
    one, if any. When the member yielded just before looks cut short (see
    :attr:`Damage.retract`), the :class:`Damage` retracts it. A member of an unsupported
    type, or a hard link to no earlier member, is passed over, also yielding a
    :class:`Damage`.
    """
    if len(data) == 0:
        return
    files: dict[str, tuple[int, int]] = {}
    pos = 0
    while True:
        last: Member | None = None
        try:
            for item in _members(data, pos, files):
                if isinstance(item, Member):
                    last = item
                yield item
            return
        except _Corrupt as e:
            resume, retract = resync(data, e.offset), False
            if last is not None and last.header < last.data < e.offset:  # not a hard link
                inside = resync(data, last.data - 1)
                end = last.data + -(-last.size // BLOCK) * BLOCK
                if inside is not None and inside < min(e.offset, last.data + last.size):
                    resume, retract = inside, True
                elif e.offset == end and resume is not None and (resume - end) % BLOCK:
                    retract = True
            yield Damage(e.offset, e.message, resume, retract)
            if resume is None:
                return
            pos = resume


def member_name(data: bytes | mmap.mmap, pos: int) -> str:
    """The full path of the member whose first header block (PAX or GNU headers included)
    is at byte offset ``pos``, such as a sample's header offset in a tar index.

    Raises:
        ValueError: no regular file or hard link starts at ``pos`` (the message says why).
    """
    try:
        for item in _members(data, pos, None):
            if isinstance(item, Member) and item.header == pos:
                return item.name
            break
    except _Corrupt as e:
        raise ValueError(f"byte offset {e.offset}: {e.message}") from e
    raise ValueError(f"no member starts at byte offset {pos}")


def _members(data: bytes | mmap.mmap, pos: int,
             files: dict[str, tuple[int, int]] | None) -> Iterator[Member | Damage]:
    """The walk from header offset ``pos`` until the end or the first damage; an
    unsupported member is passed over (yielding its :class:`Damage`).

    Args:
        files: ``(data offset, size)`` of the regular files met so far, by name (for hard
            links); updated. None: only names are wanted; a hard link is yielded with the
            (empty) data of its own header.

    Raises:
        _Corrupt: damage, at the offset of the header involved.
    """
    total = len(data)
    extended: dict[str, str] = {}
    pending = False
    first = pos
    while True:
        if pos + BLOCK > total:
            if pos < total and any(data[pos:total]):
                raise _Corrupt(pos, "truncated tar header")
            if pos >= total:
                raise _Corrupt(pos, "truncated tar: no end-of-archive marker")
            return
        block = data[pos : pos + BLOCK]
        if block == _ZERO_BLOCK:
            more = resync(data, pos)
            if more is not None:
                raise _Corrupt(pos, f"end-of-archive block, but a member header follows at "
                               f"byte offset {more}")
            return
        if not pending:
            first = pos
        kind = block[156:157]
        try:
            stored = _octal(block[148:156])
            size = _octal(block[124:136])
            if "size" in extended and kind in _FILE_TYPES:
                size = int(extended["size"])
        except ValueError as e:
            raise _Corrupt(first, f"corrupt tar header: {e}") from e
        if stored != _checksum(block) and stored != _checksum(block, signed=True):
            raise _Corrupt(pos, "corrupt tar header (checksum mismatch)")
        start = pos + BLOCK
        if start + size > total:
            raise _Corrupt(pos, f"truncated tar: member needs {size} bytes, {total - start} left")
        pos = start + -(-size // BLOCK) * BLOCK
        if kind == b"x":
            try:
                extended.update(_pax_records(data[start : start + size]))
            except ValueError as e:
                raise _Corrupt(first, f"corrupt PAX header: {e}") from e
            pending = True
            continue
        if kind in (b"L", b"K"):
            extended["path" if kind == b"L" else "linkpath"] = _name(data, start, size)
            pending = True
            continue
        if kind == b"g":
            continue
        name = extended.get("path") or _name(block, 0, 100)
        if "path" not in extended and block[257:265] == _USTAR_POSIX and block[345] != 0:
            name = _name(block, 345, 155) + "/" + name
        link = extended.get("linkpath") or _name(block, 157, 100)
        extended, pending = {}, False
        if kind in _FILE_TYPES:
            if files is not None:
                files[name] = (start, size)
            yield Member(name, first, start, size)
        elif kind == b"1":
            target = (start, size) if files is None else files.get(link)
            if target is not None:
                yield Member(name, first, *target)
            else:
                yield Damage(first, f"member {name!r}: hard link to {link!r}, which is not an "
                             "earlier member", pos, False)
        elif kind != b"5":
            yield Damage(first, f"member {name!r}: unsupported tar member type {kind!r}", pos,
                         False)
