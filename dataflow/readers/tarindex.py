"""The member index of a WebDataset tar: where every field of every sample lies.

Built once by walking the tar headers (:mod:`dataflow.readers.tarwalk`), then
saved as a small ``.npz`` file (loaded with ``allow_pickle=False``) and reused until the
shard's identity (size, mtime or ETag) changes.

Samples are runs of consecutive members sharing a key: the member path up to the first dot
of its base name (``dir/000017.image.npy`` -> key ``dir/000017``, extension ``image.npy``).
A field's name and codec come from its extension: when the last dot-part is a codec
(``npy``; ``cls cls2 index inx id label`` for ASCII integers; ``txt text`` for UTF-8 text)
it decides the decoding, and the field is named by the extension without it if anything is
left (``image.npy`` -> ``image``); any other extension is a raw-bytes field named by the whole
extension (``jpg``).
"""

from __future__ import annotations

import io
import logging
import math
import mmap
from dataclasses import dataclass
from typing import IO, NamedTuple

import numpy as np

from dataflow.batch import FieldSpec, Schema, schema_from_json, schema_to_json
from dataflow.errors import ShardReadError
from dataflow.readers.tarwalk import Member, walk

log = logging.getLogger(__name__)

INDEX_VERSION = 1
INT_CODECS = frozenset({"cls", "cls2", "index", "inx", "id", "label"})
TEXT_CODECS = frozenset({"txt", "text"})


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member path by webdataset's rule; ``None`` if it has no key.

    The key is the path up to the first dot of the base name; the base name must have at
    least one character before that dot and something after it.
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot <= slash or dot == len(name) - 1:
        return None
    return name[:dot], name[dot + 1 :].lower()


def field_of(ext: str) -> tuple[str, str]:
    """``(field name, codec)`` of an extension; codec is ``npy``, ``int``, ``str`` or ``bytes``."""
    head, _, last = ext.rpartition(".")
    if last == "npy":
        codec = "npy"
    elif last in INT_CODECS:
        codec = "int"
    elif last in TEXT_CODECS:
        codec = "str"
    else:
        return ext, "bytes"
    return (head or ext), codec


@dataclass(frozen=True)
class TarIndex:
    """Where every field of every sample of one tar lies.

    Attributes:
        schema: the fields, in the first sample's member order.
        codecs: per field, ``npy:<stored dtype>`` (e.g. ``npy:<f4``), ``int``, ``str`` or
            ``bytes``.
        offsets: int64 ``(samples, fields)``: byte offset of each field's data (for ``npy``
            fields, of the array payload after the ``.npy`` header).
        sizes: int64 ``(samples, fields)``: byte length at ``offsets``.
        ints: int64 ``(samples, fields)``: decoded values of ``int`` fields (0 elsewhere).
        skipped: samples (and keyless members) dropped while building with ``on_error="skip"``.
        identity: identity of the shard the index was built from.
    """

    schema: Schema
    codecs: tuple[str, ...]
    offsets: np.ndarray
    sizes: np.ndarray
    ints: np.ndarray
    skipped: int
    identity: str

    def __len__(self) -> int:
        return len(self.offsets)

    def fits(self, nbytes: int) -> bool:
        """Whether the arrays agree with the schema and every field lies within ``nbytes``."""
        shape = (len(self.offsets), len(self.schema))
        if not (self.offsets.shape == self.sizes.shape == self.ints.shape == shape
                and len(self.codecs) == len(self.schema)):
            return False
        return not self.offsets.size or bool(
            self.offsets.min() >= 0 and (self.offsets + self.sizes).max() <= nbytes
        )

    def save(self, f: IO[bytes]) -> None:
        """Write the index as an ``.npz`` file (no pickled objects)."""
        np.savez(
            f,
            version=np.int64(INDEX_VERSION),
            schema=np.array(schema_to_json(self.schema)),
            codecs=np.array(",".join(self.codecs)),
            offsets=self.offsets,
            sizes=self.sizes,
            ints=self.ints,
            skipped=np.int64(self.skipped),
            identity=np.array(self.identity),
        )

    @classmethod
    def load(cls, path: str) -> TarIndex | None:
        """Read an index saved by :meth:`save`; ``None`` if it is unreadable or outdated."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["version"]) != INDEX_VERSION:
                    return None
                codecs = str(z["codecs"])
                return cls(
                    schema=schema_from_json(str(z["schema"])),
                    codecs=tuple(codecs.split(",")) if codecs else (),
                    offsets=z["offsets"],
                    sizes=z["sizes"],
                    ints=z["ints"],
                    skipped=int(z["skipped"]),
                    identity=str(z["identity"]),
                )
        except (OSError, ValueError, KeyError):
            return None


def gather_fixed(buf: np.ndarray, offsets: np.ndarray, size: int) -> np.ndarray:
    """Copy ``size`` bytes at each of ``offsets`` out of ``buf``, in one numpy pass.

    Args:
        buf: uint8 array of shape ``(nbytes,)`` (typically a memory map of the tar).
        offsets: int64 array of shape ``(n,)``, in any order; every
            ``offsets[i] + size <= nbytes``.
        size: bytes per row.

    Returns:
        A new uint8 array of shape ``(n, size)``: row ``i`` is ``buf[offsets[i]:][:size]``.
        The rows are taken by fancy indexing a read-only view of ``buf`` that has one
        ``size``-byte row starting at every byte between the lowest and the highest offset.
    """
    if len(offsets) == 0:
        return np.empty((0, size), dtype=np.uint8)
    lo = int(offsets.min())
    view = np.lib.stride_tricks.as_strided(
        buf[lo:], shape=(int(offsets.max()) - lo + 1, size), strides=(1, 1), writeable=False
    )
    return view[offsets - lo]


class _NpyHeader(NamedTuple):
    dtype: np.dtype
    shape: tuple[int, ...]
    length: int


def _npy_header(raw: bytes) -> _NpyHeader:
    """Parse the header of a ``.npy`` member (versions 1 and 2); ValueError if invalid."""
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if fortran and len(shape) > 1:
        raise ValueError("Fortran-ordered arrays are not supported")
    if dtype.hasobject:
        raise ValueError("object arrays are not supported")
    return _NpyHeader(dtype, tuple(shape), f.tell())


_NPY_PREFIX = 12


def _read_npy_header(mm: bytes | mmap.mmap, offset: int, size: int) -> _NpyHeader:
    head = mm[offset : offset + min(size, _NPY_PREFIX)]
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise ValueError("not a .npy file")
    hlen = int.from_bytes(head[8:10] if head[6] == 1 else head[8:12], "little")
    total = (10 if head[6] == 1 else 12) + hlen
    if total > size:
        raise ValueError(".npy header runs past the member")
    return _npy_header(mm[offset : offset + total])


class _Builder:
    """Groups members into samples and decodes/validates fields, honouring ``on_error``."""

    def __init__(self, url: str, mm: bytes | mmap.mmap, on_error: str) -> None:
        self.url = url
        self.mm = mm
        self.buf = np.frombuffer(mm, dtype=np.uint8)
        self.skip = on_error == "skip"
        self.skipped = 0

    def bad(self, err: ShardReadError) -> None:
        if not self.skip:
            raise err
        log.warning("skipping: %s", err)
        self.skipped += 1

    def members(self) -> list[tuple[str, str, Member]]:
        out = []
        try:
            for m in walk(self.url, self.mm):
                parts = split_name(m.name)
                if parts is None:
                    self.bad(ShardReadError(
                        self.url, f"tar member {m.name!r} has no key/extension", offset=m.header
                    ))
                    continue
                out.append((parts[0], parts[1], m))
        except ShardReadError as e:
            if not self.skip:
                raise
            log.warning("skipping the rest of the shard: %s", e)
        return out

    def samples(self) -> list[tuple[int, dict[str, Member]]]:
        """``(sample index, {extension: member})`` per sample."""
        groups: list[tuple[int, dict[str, Member]]] = []
        key = None
        dup = False
        count = 0
        for k, ext, m in self.members():
            if k != key:
                if dup:
                    groups.pop()
                groups.append((count, {}))
                count += 1
                key, dup = k, False
            fields = groups[-1][1]
            if ext in fields and not dup:
                self.bad(ShardReadError(self.url, f"duplicate member {m.name!r}",
                                        offset=m.header, index=groups[-1][0]))
                dup = True
            fields[ext] = m
        if dup:
            groups.pop()
        return groups

    def build(self, ident: str) -> TarIndex:
        samples = self.samples()
        if not samples:
            empty = np.zeros((0, 0), dtype=np.int64)
            return TarIndex((), (), empty, empty, empty, self.skipped, ident)
        exts = list(samples[0][1])
        names = [field_of(e) for e in exts]
        seen: dict[str, str] = {}
        for ext, (name, _) in zip(exts, names, strict=True):
            if name in seen:
                raise ShardReadError(
                    self.url, f"extensions {seen[name]!r} and {ext!r} both map to field {name!r}",
                    index=samples[0][0],
                )
            seen[name] = ext
        kept = []
        want = samples[0][1].keys()
        for index, fields in samples:
            if fields.keys() != want:
                self.bad(ShardReadError(
                    self.url, f"sample has members {sorted(fields)}, the shard's first sample "
                    f"has {sorted(want)}",
                    offset=min(m.header for m in fields.values()), index=index,
                ))
                continue
            kept.append((index, fields))
        n, nf = len(kept), len(exts)
        where = np.array([i for i, _ in kept], dtype=np.int64)
        offsets = np.array([[f[e].data for e in exts] for _, f in kept], dtype=np.int64)
        sizes = np.array([[f[e].size for e in exts] for _, f in kept], dtype=np.int64)
        offsets, sizes = offsets.reshape(n, nf), sizes.reshape(n, nf)
        ints = np.zeros((n, nf), dtype=np.int64)
        ok = np.ones(n, dtype=bool)
        schema: list[FieldSpec] = []
        codecs = [c for _, c in names]
        for j, (name, codec) in enumerate(names):
            if codec == "npy":
                dtype, spec = self._npy(name, offsets[:, j], sizes[:, j], where, ok)
                schema.append(spec)
                codecs[j] = f"npy:{dtype.str}"
            elif codec == "int":
                self._ints(name, offsets[:, j], sizes[:, j], where, ok, ints[:, j])
                schema.append(FieldSpec(name, "int64"))
            else:
                schema.append(FieldSpec(name, "uint8", ragged=codec))
        return TarIndex(
            tuple(schema), tuple(codecs), offsets[ok], sizes[ok], ints[ok],
            self.skipped, ident,
        )

    def _npy(self, name: str, offs: np.ndarray, sizes: np.ndarray, where: np.ndarray,
             ok: np.ndarray) -> tuple[np.dtype, FieldSpec]:
        """Check every sample's ``.npy`` header against the first; point offsets at payloads.

        Returns:
            The stored dtype (byte order included) and the field's spec.
        """
        try:
            first = _read_npy_header(self.mm, int(offs[0]), int(sizes[0]))
        except ValueError as e:
            raise ShardReadError(self.url, f"field {name!r}: {e}", index=int(where[0])) from e
        payload = first.dtype.itemsize * math.prod(first.shape)
        if first.length + payload != sizes[0]:
            raise ShardReadError(self.url, f"field {name!r}: .npy size does not match its header",
                                 index=int(where[0]))
        head = np.frombuffer(self.mm[int(offs[0]) : int(offs[0]) + first.length], np.uint8)
        same = sizes == sizes[0]
        same[same] = (gather_fixed(self.buf, offs[same], first.length) == head).all(axis=1)
        for i in np.flatnonzero(~same & ok).tolist():
            try:
                h = _read_npy_header(self.mm, int(offs[i]), int(sizes[i]))
                if (h.dtype, h.shape) != (first.dtype, first.shape):
                    raise ValueError(f"dtype {h.dtype} shape {h.shape}, the shard's first sample "
                                     f"has dtype {first.dtype} shape {first.shape}")
                if h.length + payload != sizes[i]:
                    raise ValueError(".npy size does not match its header")
            except ValueError as e:
                self.bad(ShardReadError(self.url, f"field {name!r}: {e}", offset=int(offs[i]),
                                        index=int(where[i])))
                ok[i] = False
                continue
            offs[i] += h.length
        offs[same] += first.length
        sizes[:] = payload
        return first.dtype, FieldSpec(name, first.dtype.newbyteorder("=").name, first.shape)

    def _ints(self, name: str, offs: np.ndarray, sizes: np.ndarray, where: np.ndarray,
              ok: np.ndarray, out: np.ndarray) -> None:
        mm = self.mm
        for i, (o, s) in enumerate(zip(offs.tolist(), sizes.tolist(), strict=True)):
            try:
                out[i] = int(mm[o : o + s])
            except (ValueError, OverflowError):
                if ok[i]:
                    self.bad(ShardReadError(
                        self.url, f"field {name!r}: {mm[o:o + min(s, 32)]!r} is not an "
                        "ASCII integer", offset=o, index=int(where[i]),
                    ))
                    ok[i] = False


def build_index(url: str, mm: bytes | mmap.mmap, ident: str, on_error: str) -> TarIndex:
    """Walk the tar in ``mm`` once and index its samples.

    Args:
        url: the shard, for error messages.
        mm: the whole uncompressed tar (usually a memory map).
        ident: the shard's identity, stored in the index.
        on_error: ``"raise"``, or ``"skip"`` to drop bad samples (counted in ``skipped``).

    Raises:
        ShardReadError: bad input with ``on_error="raise"``, naming offset and/or sample index;
            also, in either mode, a first sample that cannot define the schema.
    """
    return _Builder(url, mm, on_error).build(ident)
