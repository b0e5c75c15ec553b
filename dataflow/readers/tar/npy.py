"""The header of a ``.npy`` tar member: dtype, shape and where the data starts."""

from __future__ import annotations

import io
import mmap
from typing import NamedTuple

import numpy as np

_NPY_PREFIX = 12


class NpyHeader(NamedTuple):
    """What a ``.npy`` header says.

    Attributes:
        dtype: the array's dtype.
        shape: the array's shape.
        length: bytes of the header: the data starts this far into the member.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    length: int


def read_npy_header(mm: bytes | mmap.mmap, offset: int, size: int) -> NpyHeader:
    """Parse the header of the ``.npy`` member of ``size`` bytes at ``offset`` in ``mm``
    (versions 1 and 2), reading no byte past the header.

    Raises:
        ValueError: no valid header, one running past the member, or an array this reader
            does not serve (Fortran order, objects).
    """
    head = mm[offset : offset + min(size, _NPY_PREFIX)]
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise ValueError("not a .npy file")
    hlen = int.from_bytes(head[8:10] if head[6] == 1 else head[8:12], "little")
    total = (10 if head[6] == 1 else 12) + hlen
    if total > size:
        raise ValueError(".npy header runs past the member")
    return _parse(mm[offset : offset + total])


def _parse(raw: bytes) -> NpyHeader:
    """Parse a whole ``.npy`` header (versions 1 and 2); ValueError if invalid."""
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
    return NpyHeader(dtype, tuple(shape), f.tell())
