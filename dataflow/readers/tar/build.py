"""Build the member index of a WebDataset tar (:class:`~dataflow.readers.tar.index.TarIndex`)
by walking its headers once (:mod:`dataflow.readers.tar.walk`).

Under ``on_error="skip"``, damage to the tar's structure does not end the walk: it resumes at
the next valid header, so only the samples whose members were damaged are lost. Those
samples, like samples with bad fields and repeated members, are dropped from the index and
counted, one per occurrence.
"""

from __future__ import annotations

import logging
import math
import mmap
from collections import Counter
from typing import NamedTuple

import numpy as np

from dataflow.batch import FieldSpec
from dataflow.errors import ShardReadError
from dataflow.readers.damage import MAX_SKIP_LOG, SkipRecord
from dataflow.readers.tar.index import FILL_INT, TarIndex, field_of, gather_fixed, split_name
from dataflow.readers.tar.npy import read_npy_header
from dataflow.readers.tar.walk import Damage, Member, walk

log = logging.getLogger(__name__)


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
        """Members grouped by key wherever they lie in the tar (the index keeps each member's
        offset, so a sample need not be contiguous: ``tar cf x.tar dir/`` stores a directory's
        files in the file system's order), numbered in the order of each key's first member;
        a sample with a member repeated (a key and extension twice) is dropped (counted)."""
        groups: dict[str, _Sample] = {}
        repeated: dict[str, tuple[Member, Member]] = {}
        for k, ext, m in self.members():
            g = groups.get(k)
            if g is None:
                g = groups[k] = _Sample(len(groups), k, {})
            if ext in g.fields:
                repeated.setdefault(k, (g.fields[ext], m))
            else:
                g.fields[ext] = m
        kept = []
        for g in groups.values():
            if g.key in repeated:
                first, again = repeated[g.key]
                self.bad(ShardReadError(
                    self.url, f"member {again.name!r} repeats: first at byte offset "
                    f"{first.header}, again at byte offset {again.header} (a sample's key and "
                    "extension must name one member: rewrite the shard without the repeat, "
                    "or serve it with --on-error skip to leave this sample out)",
                    offset=again.header, index=g.number))
            else:
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
        """Check every sample's ``.npy`` header against the first valid one (the samples
        before it are bad); point offsets at payloads.

        Returns:
            The stored dtype (byte order included) and the field's spec.

        Raises:
            ShardReadError: under ``on_error="raise"`` the first bad header; in either mode,
                no valid one.
        """
        ref = 0
        while True:
            try:
                first = read_npy_header(self.mm, int(offs[ref]), int(sizes[ref]))
                payload = first.dtype.itemsize * math.prod(first.shape)
                if first.length + payload != sizes[ref]:
                    raise ValueError(".npy size does not match its header")
                break
            except ValueError as e:
                err = ShardReadError(self.url, f"field {name!r}: {e}", offset=int(offs[ref]),
                                     index=int(where[ref]))
                if ref + 1 == len(offs):
                    raise ShardReadError(self.url, f"field {name!r}: no sample has a valid .npy "
                                         f"header, the last: {e}", index=int(where[ref])) from e
                if ok[ref]:
                    self.bad(err)
                    ok[ref] = False
                ref += 1
        head = np.frombuffer(self.mm[int(offs[ref]) : int(offs[ref]) + first.length], np.uint8)
        same = sizes == sizes[ref]
        same[same] = (gather_fixed(self.buf, offs[same], first.length) == head).all(axis=1)
        for i in np.flatnonzero(~same & ok).tolist():
            try:
                h = read_npy_header(self.mm, int(offs[i]), int(sizes[i]))
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
            also, in either mode, samples that cannot define the schema (two extensions
            naming one field, no valid ``.npy`` header in a field).
    """
    return _Builder(url, mm, on_error, resync, missing_field).build(ident)
