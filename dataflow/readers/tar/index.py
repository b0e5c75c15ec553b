"""The member index of a WebDataset tar: where every field of every sample lies.

Built once by walking the tar headers (:mod:`dataflow.readers.tar.build`), then saved as one
flat binary file with a SHA-256 digest of its content (:mod:`dataflow.readers.tar.indexfile`),
and reused while the shard's identity (size, mtime or ETag) is unchanged, the digest matches,
and the index fits the tar (:meth:`TarIndex.problem`).

Samples are runs of consecutive members sharing a key: the member path up to the first dot
of its base name (``dir/000017.image.npy`` -> key ``dir/000017``, extension ``image.npy``).
A field's name and codec come from its extension: when the last dot-part is a codec
(``npy``; ``cls cls2 index inx id label`` for ASCII integers; ``txt text`` for UTF-8 text)
it decides the decoding, and the field is named by the extension without it if anything is
left (``image.npy`` -> ``image``); any other extension is a raw-bytes field named by the whole
extension (``jpg``).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from dataflow.batch import Ragged, Schema
from dataflow.errors import ShardReadError
from dataflow.readers.damage import SkipRecord
from dataflow.readers.tar.walk import member_name, valid_header

VERIFY_HEADERS = 64
"""Sample headers checked when a cached index is loaded (see :meth:`TarIndex.problem`)."""
INT_CODECS = frozenset({"cls", "cls2", "index", "inx", "id", "label"})
TEXT_CODECS = frozenset({"txt", "text"})
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
        skips: what was dropped, the latest :data:`~dataflow.readers.damage.MAX_SKIP_LOG`.
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


def copy_fixed(buf: np.ndarray, offsets: np.ndarray, size: int, out: np.ndarray) -> None:
    """Copy ``size`` bytes at each of ``offsets`` out of ``buf`` into the rows of ``out``, one
    slice assignment a row (about half a microsecond each, no temporary: for rows written
    into a batch shared with other shards, where :func:`gather_fixed` would need a copy more).

    Args:
        buf: uint8 array of shape ``(nbytes,)``.
        offsets: int64 array of shape ``(n,)``; every ``offsets[i] + size <= nbytes``.
        size: bytes per row.
        out: C-contiguous array of ``n`` rows of ``size`` bytes each (any dtype).
    """
    if not len(offsets):
        return
    src = buf.data
    dst = out.reshape(len(offsets), -1).view(np.uint8).data.cast("B")
    for i, at in enumerate(offsets.tolist()):
        dst[i * size : (i + 1) * size] = src[at : at + size]


def gather_ragged(buf: np.ndarray, offs: np.ndarray, sizes: np.ndarray, kind: str) -> Ragged:
    """Rows ``buf[offs[i]:offs[i] + sizes[i]]`` copied back to back (one ``np.concatenate``
    of views)."""
    bounds = np.zeros(len(offs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    values = np.concatenate(
        [buf[o : o + s] for o, s in zip(offs.tolist(), sizes.tolist(), strict=True)]
        or [np.empty(0, dtype=np.uint8)]
    )
    return Ragged(values, bounds, kind)


def sample_keys(url: str, data: bytes | mmap.mmap, headers: np.ndarray) -> Ragged:
    """The WebDataset key of every sample, read from its first member's tar header.

    Args:
        url: the shard, for messages.
        data: the tar, or what gives its slices (a remote tar's
            :class:`~dataflow.readers.tar.remote.HeaderProbe`, the headers prefetched).
        headers: int64 of shape ``(n,)``: where each sample's first header lies.

    Returns:
        ``n`` rows of ``str``.

    Raises:
        ShardReadError: a header whose member name cannot be read or holds no key, naming
            the sample and the header's offset.
    """
    raw = []
    for i, pos in enumerate(headers.tolist()):
        try:
            parts = split_name(member_name(data, pos))
        except ValueError as e:
            raise ShardReadError(url, f"sample key: {e}", offset=pos, index=i) from e
        if parts is None:
            raise ShardReadError(url, "sample key: the member has none", offset=pos, index=i)
        raw.append(parts[0].encode("utf-8", "surrogateescape"))
    bounds = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in raw], out=bounds[1:])
    return Ragged(np.frombuffer(b"".join(raw), dtype=np.uint8), bounds, "str")
