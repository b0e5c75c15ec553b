"""The member index of a WebDataset tar: where every field of every sample lies.

Built once by walking the tar headers (:mod:`dataflow.readers.tarwalk`), then
saved as a small ``.npz`` file (loaded with ``allow_pickle=False``) with a SHA-256 digest of
its content, and reused while the shard's identity (size, mtime or ETag) is unchanged, the
digest matches, and the index fits the tar (:meth:`TarIndex.problem`).

Under ``on_error="skip"``, damage to the tar's structure does not end the walk: it resumes at
the next valid header, so only the samples whose members were damaged are lost. Those
samples, like samples with bad fields and repeated keys, are dropped from the index and
counted, one per occurrence.

Samples are runs of consecutive members sharing a key: the member path up to the first dot
of its base name (``dir/000017.image.npy`` -> key ``dir/000017``, extension ``image.npy``).
A field's name and codec come from its extension: when the last dot-part is a codec
(``npy``; ``cls cls2 index inx id label`` for ASCII integers; ``txt text`` for UTF-8 text)
it decides the decoding, and the field is named by the extension without it if anything is
left (``image.npy`` -> ``image``); any other extension is a raw-bytes field named by the whole
extension (``jpg``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import mmap
import zipfile
from collections import Counter
from dataclasses import dataclass
from typing import IO, NamedTuple

import numpy as np

from dataflow.batch import FieldSpec, Schema, schema_from_json, schema_to_json
from dataflow.errors import ShardReadError
from dataflow.readers.base import MAX_SKIP_LOG, SkipRecord
from dataflow.readers.tarwalk import Damage, Member, valid_header, walk

log = logging.getLogger(__name__)

INDEX_VERSION = 2
VERIFY_HEADERS = 64
"""Sample headers checked when a cached index is loaded (see :meth:`TarIndex.problem`)."""
INT_CODECS = frozenset({"cls", "cls2", "index", "inx", "id", "label"})
TEXT_CODECS = frozenset({"txt", "text"})
MISSING_FIELD = ("error", "skip", "fill")
"""What becomes of a sample lacking some of the shard's fields (see :meth:`_Builder.fits`)."""
FILL_INT = -1
"""The value of an integer field a sample lacks, under ``missing_field="fill"``."""


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
        schema: the fields, in member order.
        codecs: per field, ``npy:<stored dtype>`` (e.g. ``npy:<f4``), ``int``, ``str`` or
            ``bytes``.
        offsets: int64 ``(samples, fields)``: byte offset of each field's data (for ``npy``
            fields, of the array payload after the ``.npy`` header).
        sizes: int64 ``(samples, fields)``: byte length at ``offsets``.
        ints: int64 ``(samples, fields)``: decoded values of ``int`` fields (0 elsewhere).
        headers: int64 ``(samples,)``: byte offset of each sample's first tar header.
        skipped: samples dropped while building with ``on_error="skip"``, one per occurrence
            (a bad sample, a sample that lost members to damage, a repeated key, a keyless
            member).
        skips: what was dropped, the latest :data:`~dataflow.readers.base.MAX_SKIP_LOG`.
        identity: identity of the shard the index was built from.
    """

    schema: Schema
    codecs: tuple[str, ...]
    offsets: np.ndarray
    sizes: np.ndarray
    ints: np.ndarray
    headers: np.ndarray
    skipped: int
    skips: tuple[SkipRecord, ...]
    identity: str

    def __len__(self) -> int:
        return len(self.offsets)

    def problem(self, data: bytes | mmap.mmap) -> str | None:
        """Why this index does not fit the tar ``data``, or ``None`` if it does.

        Checks the array shapes, that every field lies within the tar, that sample headers
        ascend, and that the headers of up to :data:`VERIFY_HEADERS` samples (evenly spread,
        first and last included) are valid tar headers (magic and checksum).
        """
        n, nbytes = len(self.offsets), len(data)
        if not (self.offsets.shape == self.sizes.shape == self.ints.shape
                == (n, len(self.schema)) and self.headers.shape == (n,)
                and len(self.codecs) == len(self.schema)):
            return "array shapes do not agree with the schema"
        if not n:
            return None
        if self.offsets.min() < 0 or (self.offsets + self.sizes).max() > nbytes:
            return f"a field lies outside the tar's {nbytes} bytes"
        if (np.diff(self.headers) <= 0).any() or self.headers[0] < 0:
            return "sample headers do not ascend"
        for i in np.unique(np.linspace(0, n - 1, min(n, VERIFY_HEADERS)).astype(np.int64)):
            if not valid_header(data, int(self.headers[i])):
                return f"no valid tar header at byte offset {self.headers[i]} (sample {i})"
        return None

    def _digest(self) -> str:
        """SHA-256 over everything the index holds."""
        h = hashlib.sha256(json.dumps(
            [INDEX_VERSION, schema_to_json(self.schema), self.codecs, self.skipped,
             _skips_to_json(self.skips), self.identity]).encode("utf-8"))
        for a in (self.offsets, self.sizes, self.ints, self.headers):
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def save(self, f: IO[bytes]) -> None:
        """Write the index as an ``.npz`` file (no pickled objects), with its digest."""
        np.savez(
            f,
            version=np.int64(INDEX_VERSION),
            schema=np.array(schema_to_json(self.schema)),
            codecs=np.array(",".join(self.codecs)),
            offsets=self.offsets,
            sizes=self.sizes,
            ints=self.ints,
            headers=self.headers,
            skipped=np.int64(self.skipped),
            skips=np.array(_skips_to_json(self.skips)),
            identity=np.array(self.identity),
            digest=np.array(self._digest()),
        )

    @classmethod
    def load(cls, path: str, url: str) -> TarIndex:
        """Read an index saved by :meth:`save` for shard ``url``.

        Raises:
            FileNotFoundError: there is no index at ``path``.
            OutdatedIndex: the index is of another :data:`INDEX_VERSION`.
            ValueError: the file is unreadable, or its content does not match its digest
                (the message says which).
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["version"]) != INDEX_VERSION:
                    raise OutdatedIndex(f"index version {int(z['version'])}, not {INDEX_VERSION}")
                codecs = str(z["codecs"])
                index = cls(
                    schema=schema_from_json(str(z["schema"])),
                    codecs=tuple(codecs.split(",")) if codecs else (),
                    offsets=z["offsets"],
                    sizes=z["sizes"],
                    ints=z["ints"],
                    headers=z["headers"],
                    skipped=int(z["skipped"]),
                    skips=_skips_from_json(url, str(z["skips"])),
                    identity=str(z["identity"]),
                )
                digest = str(z["digest"])
        except FileNotFoundError:
            raise
        except (OSError, KeyError, TypeError, zipfile.BadZipFile) as e:
            raise ValueError(f"unreadable: {type(e).__name__}: {e}") from e
        if index._digest() != digest:
            raise ValueError("content does not match its digest (modified after it was saved)")
        return index


class OutdatedIndex(ValueError):
    """A cached index written by another version of this module (rebuilt, no harm done)."""


def _skips_to_json(skips: tuple[SkipRecord, ...]) -> str:
    return json.dumps([[r.index, r.offset, r.count, r.message] for r in skips])


def _skips_from_json(url: str, text: str) -> tuple[SkipRecord, ...]:
    return tuple(SkipRecord(url, i, o, int(c), str(m)) for i, o, c, m in json.loads(text))


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


class _Sample(NamedTuple):
    number: int
    key: str
    fields: dict[str, Member]


class _Builder:
    """Groups members into samples and decodes/validates fields, honouring ``on_error``."""

    def __init__(self, url: str, mm: bytes | mmap.mmap, on_error: str, resync: bool,
                 missing_field: str = "error") -> None:
        self.url = url
        self.missing_field = missing_field
        self.mm = mm
        self.buf = np.frombuffer(mm, dtype=np.uint8)
        self.resync = resync
        self.skip = on_error == "skip"
        self.skipped = 0
        self.skips: list[SkipRecord] = []

    def bad(self, err: ShardReadError, count: int = 1) -> None:
        """Raise ``err``, or under ``on_error="skip"`` log it and count ``count`` samples."""
        if not self.skip:
            raise err
        log.warning("skipping: %s", err)
        self.skipped += count
        self.skips.append(SkipRecord.of(err, count))

    def members(self) -> list[tuple[str, str, Member]]:
        """``(key, extension, member)`` of every intact member with a key, in tar order."""
        out: list[tuple[str, str, Member]] = []
        last: Member | None = None
        for m in walk(self.mm):
            if isinstance(m, Damage):
                self.damage(m, out, last)
                if m.resume is None or not self.resync:
                    break
                continue
            last = m
            parts = split_name(m.name)
            if parts is None:
                self.bad(ShardReadError(
                    self.url, f"tar member {m.name!r} has no key/extension", offset=m.header
                ))
                continue
            out.append((parts[0], parts[1], m))
        return out

    def damage(self, d: Damage, out: list[tuple[str, str, Member]], last: Member | None) -> None:
        """Raise damage, or under ``on_error="skip"`` record it (count 0: the samples it leaves
        incomplete are counted when they are dropped) and drop the member it retracts."""
        if not self.skip:
            raise ShardReadError(self.url, d.message, offset=d.offset)
        if d.resume is None or not self.resync:
            what = "the rest of the tar is lost (samples wholly in it cannot be counted)"
        else:
            what = f"resumed at the next valid header, byte offset {d.resume}"
        if d.retract and last is not None:
            what += (f"; member {last.name!r} before it looks cut short (its data runs into a "
                     "header, or the next header is off its 512-byte grid), dropped")
            if out and out[-1][2] is last:
                out.pop()
        self.bad(ShardReadError(self.url, f"{d.message}; {what}", offset=d.offset), count=0)

    def samples(self) -> list[_Sample]:
        """Runs of consecutive members sharing a key, numbered in tar order; a run repeating
        a member, or repeating the key of an earlier run, is dropped (counted)."""
        groups: list[_Sample] = []
        repeated: dict[int, Member] = {}
        for k, ext, m in self.members():
            if not groups or k != groups[-1].key:
                groups.append(_Sample(len(groups), k, {}))
            fields = groups[-1].fields
            if ext in fields:
                repeated.setdefault(len(groups) - 1, m)
            fields[ext] = m
        kept = []
        seen: dict[str, int] = {}
        for g in groups:
            head = min(m.header for m in g.fields.values())
            if g.number in repeated:
                m = repeated[g.number]
                self.bad(ShardReadError(self.url, f"duplicate member {m.name!r}",
                                        offset=m.header, index=g.number))
            elif g.key in seen:
                self.bad(ShardReadError(
                    self.url, f"key {g.key!r} repeats: first at byte offset {seen[g.key]}, "
                    f"again at byte offset {head}, not adjacent", offset=head, index=g.number,
                ))
            else:
                seen[g.key] = head
                kept.append(g)
        return kept

    def fits(self, sample: _Sample, want: frozenset[str], all_others: bool) -> bool:
        """Whether ``sample`` is indexed: its members are the shard's ``want``, or, under
        ``missing_field="fill"``, some of them; a sample with other members is bad, one
        missing some is bad (``"error"``) or left out and counted (``"skip"``)."""
        have = sample.fields.keys()
        if have == want:
            return True
        missing, extra = sorted(want - have), sorted(have - want)
        if not extra and self.missing_field == "fill":
            return True
        err = ShardReadError(
            self.url, f"sample {sample.key!r} has members {sorted(have)}, "
            f"{'all other' if all_others else 'most'} samples have {sorted(want)}"
            + (f" (missing {missing})" if missing and not extra else ""),
            offset=min(m.header for m in sample.fields.values()), index=sample.number)
        if extra or self.missing_field == "error":
            self.bad(err)
        else:
            log.info("skipping (--missing-field skip): %s", err)
            self.skipped += 1
            self.skips.append(SkipRecord.of(err, 1))
        return False

    def build(self, ident: str) -> TarIndex:
        samples = self.samples()
        if not samples:
            empty = np.zeros((0, 0), dtype=np.int64)
            return TarIndex((), (), empty, empty, empty, np.zeros(0, dtype=np.int64),
                            self.skipped, tuple(self.skips[-MAX_SKIP_LOG:]), ident)
        counts = Counter(frozenset(s.fields) for s in samples)
        want = counts.most_common(1)[0][0]
        exts = list(next(s.fields for s in samples if s.fields.keys() == want))
        names = [field_of(e) for e in exts]
        seen: dict[str, str] = {}
        for ext, (name, _) in zip(exts, names, strict=True):
            if name in seen:
                raise ShardReadError(
                    self.url, f"extensions {seen[name]!r} and {ext!r} both map to field {name!r}",
                    index=samples[0].number,
                )
            seen[name] = ext
        kept = [s for s in samples if self.fits(s, want, counts[want] == len(samples) - 1)]
        n, nf = len(kept), len(exts)
        where = np.array([s.number for s in kept], dtype=np.int64)
        headers = np.array([min(m.header for m in s.fields.values()) for s in kept],
                           dtype=np.int64)
        # A field the sample lacks (kept under missing_field="fill") has size -1.
        offsets = np.array([[s.fields[e].data if e in s.fields else 0 for e in exts]
                            for s in kept], dtype=np.int64)
        sizes = np.array([[s.fields[e].size if e in s.fields else -1 for e in exts]
                          for s in kept], dtype=np.int64)
        offsets, sizes = offsets.reshape(n, nf), sizes.reshape(n, nf)
        filled = sizes < 0
        ints = np.where(filled, FILL_INT, 0).astype(np.int64)
        ok = np.ones(n, dtype=bool)
        schema: list[FieldSpec] = []
        codecs = [c for _, c in names]
        for j, (name, codec) in enumerate(names):
            have = ~filled[:, j]
            offs, szs, good, vals = offsets[have, j], sizes[have, j], ok[have], ints[have, j]
            if codec == "npy":
                dtype, spec = self._npy(name, offs, szs, where[have], good)
                offsets[~have, j] = offs[0]  # a filled cell's read stays inside the tar
                schema.append(spec)
                codecs[j] = f"npy:{dtype.str}"
            elif codec == "int":
                self._ints(name, offs, szs, where[have], good, vals)
                schema.append(FieldSpec(name, "int64"))
            else:
                schema.append(FieldSpec(name, "uint8", ragged=codec))
            offsets[have, j], sizes[have, j], ok[have], ints[have, j] = offs, szs, good, vals
        return TarIndex(
            tuple(schema), tuple(codecs), offsets[ok], sizes[ok], ints[ok], headers[ok],
            self.skipped, tuple(self.skips[-MAX_SKIP_LOG:]), ident,
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


def build_index(url: str, mm: bytes | mmap.mmap, ident: str, on_error: str, *,
                resync: bool = True, missing_field: str = "error") -> TarIndex:
    """Walk the tar in ``mm`` once and index its samples.

    Args:
        url: the shard, for error messages.
        mm: the whole uncompressed tar (usually a memory map).
        ident: the shard's identity, stored in the index.
        on_error: ``"raise"``, or ``"skip"`` to drop bad samples (counted in ``skipped``).
        resync: after damage to the tar's structure, go on from the next valid header;
            ``False``: stop there (for a tar decompressed from a damaged gzip stream, where
            what follows the first damage cannot be trusted).
        missing_field: a sample lacking some of the shard's fields (those of most samples) is
            bad (``"error"``, handled per ``on_error``), left out and counted in ``skipped``
            whatever ``on_error`` (``"skip"``), or indexed with those fields' sizes -1
            (``"fill"``: the reader fills them; ``int`` values are :data:`FILL_INT`).

    Raises:
        ShardReadError: bad input with ``on_error="raise"``, naming offset and/or sample index;
            also, in either mode, a first sample that cannot define the schema.
    """
    return _Builder(url, mm, on_error, resync, missing_field).build(ident)
