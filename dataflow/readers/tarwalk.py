"""A streaming walk over the headers of an uncompressed tar held in memory (or a memory map).

Handles POSIX ustar (name prefix), PAX extended headers (``path``, ``size``, ``linkpath``;
webdataset's ``TarWriter`` writes one per member), GNU long names and long link names, hard
links, and both unsigned and signed header checksums. Every error names the byte offset of
the header involved.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import NamedTuple

from dataflow.errors import ShardReadError

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")
_USTAR_POSIX = b"ustar\x0000"


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
        total -= 256 * sum(1 for b in block if b >= 0x80)
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


def walk(url: str, data: bytes | mmap.mmap) -> Iterator[Member]:
    """Yield the regular-file members of an uncompressed tar held in ``data``.

    Directories and PAX global headers are passed over; a hard link yields the data of the
    earlier member it names. Zero bytes are an empty archive (as GNU tar reads them).

    Raises:
        ShardReadError: a header is corrupt (bad checksum or number), a member type is not
            supported, data runs past the end, or the end-of-archive marker is missing; the
            error names the byte offset of the header involved.
    """
    total = len(data)
    if total == 0:
        return
    pos = 0
    extended: dict[str, str] = {}
    files: dict[str, tuple[int, int]] = {}
    pending = False
    first = 0
    while True:
        if pos + BLOCK > total:
            if pos < total and any(data[pos:total]):
                raise ShardReadError(url, "truncated tar header", offset=pos)
            if pos >= total:
                raise ShardReadError(url, "truncated tar: no end-of-archive marker", offset=pos)
            return
        block = data[pos : pos + BLOCK]
        if block == _ZERO_BLOCK:
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
            raise ShardReadError(url, f"corrupt tar header: {e}", offset=first) from e
        if stored != _checksum(block) and stored != _checksum(block, signed=True):
            raise ShardReadError(url, "corrupt tar header (checksum mismatch)", offset=pos)
        start = pos + BLOCK
        if start + size > total:
            raise ShardReadError(
                url, f"truncated tar: member needs {size} bytes, {total - start} left", offset=pos
            )
        pos = start + -(-size // BLOCK) * BLOCK
        if kind == b"x":
            try:
                extended.update(_pax_records(data[start : start + size]))
            except ValueError as e:
                raise ShardReadError(url, f"corrupt PAX header: {e}", offset=first) from e
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
            files[name] = (start, size)
            yield Member(name, first, start, size)
        elif kind == b"1":
            if link not in files:
                raise ShardReadError(url, f"member {name!r}: hard link to {link!r}, which is "
                                     "not an earlier member", offset=first)
            yield Member(name, first, *files[link])
        elif kind != b"5":
            raise ShardReadError(
                url, f"member {name!r}: unsupported tar member type {kind!r}", offset=first
            )
