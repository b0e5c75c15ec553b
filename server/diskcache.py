"""The disk tier of a reader's decoded-sample cache (``--cache-disk DIR``): every sample the
reader decodes, written through, in files its sibling readers read too.

Layout: the server makes ``DIR/dataflow-cache-<server pid>/`` at start, empty, and removes it
when it stops (:func:`server_directory`, :func:`remove_server_directory`); each reader writes
its files in its own ``reader-<pid>/`` below it, one file per sample named by its key, made at
its start and removed at its exit. A reader that starts removes the directories of readers that
are gone (one that was killed leaves its files), so the files of live readers only are on disk:
at most their shares of ``--cache-disk-bytes``, each reader evicting only its own files. Entries
never outlive the server: a server started with another transform, version or dataset starts
with none.

Sharing between a server's readers: a sample is looked for in the reader's own files, then in
each sibling's directory (listed again at most once a second). That is safe without locks: a
file is written under a temporary name and renamed into place, so a name always holds a whole
file, and a file its writer removes while another reader opens it is either read whole (the
open descriptor keeps it) or not found (a miss). So one server decodes a sample about once,
whichever reader serves it (two readers missing it at the same moment both decode it).

A file is the sample's fields as one JSON header (name, dtype, shape, ragged kind) and the
arrays' bytes; it is read back with :func:`numpy.frombuffer`, nothing is unpickled. A file that
cannot be read or does not match its header is a miss (and is removed). On a memory filesystem
(``/dev/shm``) a file is read as a mapping (:mod:`~dataflow.server.filemap`): the sample's
arrays are the file's own pages, shared by every reader that holds it, neither copied nor
allocated again; a file is never truncated nor written in place (written under a temporary name
and renamed, removed by an unlink), which keeps such a mapping whole.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import struct
import time
from collections import OrderedDict

import numpy as np

from dataflow.errors import ConfigError
from dataflow.server.filemap import MAX_MAPPINGS, MEMORY_FILESYSTEMS, FileMaps, filesystem_type
from dataflow.server.samplecache import Key, Sample

SERVER_PREFIX = "dataflow-cache-"
READER_PREFIX = "reader-"
TEMP_PREFIX = ".tmp-"
PEERS_EVERY_S = 1.0
_LEN = struct.Struct("<Q")


def server_directory(root: str, pid: int) -> str:
    """``root/dataflow-cache-<pid>``, made empty (a server of the same pid left it).

    Raises:
        OSError: it cannot be made.
    """
    path = os.path.join(root, f"{SERVER_PREFIX}{pid}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def remove_server_directory(path: str) -> None:
    """Remove a server's cache directory and every reader's files in it."""
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def encode_sample(sample: Sample) -> list[memoryview]:
    """A sample as the pieces of a file's bytes, in order, its arrays not copied (see the
    module docstring).

    Raises:
        TypeError, ValueError: a field's dtype has no bytes of its own (Python objects).
    """
    head = json.dumps([[name, values.dtype.str, list(values.shape), kind]
                       for name, values, kind in sample]).encode()
    return [memoryview(_LEN.pack(len(head))), memoryview(head),
            *(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data
              for _, values, _ in sample)]


def decode_sample(data: bytes | memoryview) -> Sample:
    """The sample of :func:`encode_sample`'s bytes (its arrays view ``data``).

    Raises:
        ValueError: they are not such bytes (cut short, or not matching their header).
    """
    (size,) = _LEN.unpack_from(data)
    at = _LEN.size + size
    out = []
    for name, dt, shape, count, kind in _fields(bytes(data[_LEN.size:at])):
        values = np.frombuffer(data, dt, count, at).reshape(shape)
        at += values.nbytes
        out.append((name, values, kind))
    if at != len(data):
        raise ValueError(f"{len(data) - at} bytes after the last field")
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _fields(head: bytes) -> tuple[tuple[str, np.dtype, tuple[int, ...], int, str | None], ...]:
    """The fields a file's JSON header describes: (name, dtype, shape, values, ragged kind).
    Parsed once per distinct header (the samples of a decode stage with fixed fields share
    one).

    Raises:
        ValueError: the header is not such JSON.
    """
    out = []
    for name, dtype, shape, kind in json.loads(head):
        dims = tuple(int(n) for n in shape)
        out.append((str(name), np.dtype(dtype), dims, math.prod(dims), kind))
    return tuple(out)


class DiskTier:
    """One reader's files of decoded samples, at most ``bound`` bytes (file sizes), the least
    recently used removed first, over its siblings' files (read only). Not thread-safe.

    Args:
        server_dir: the server's cache directory (:func:`server_directory`).
        bound: most bytes of this reader's files.
        max_mappings: files read as mappings at once, on a memory filesystem
            (:class:`~dataflow.server.filemap.FileMaps`); past it they are read with ``read``.

    Raises:
        ConfigError: ``bound`` is not positive.
        OSError: the reader's directory cannot be made.
    """

    def __init__(self, server_dir: str, bound: int, max_mappings: int = MAX_MAPPINGS) -> None:
        if not isinstance(bound, int) or bound < 1:
            raise ConfigError(f"`cache_disk_bytes` must be a positive number of bytes. Found: "
                              f"{bound!r}")
        for name in os.listdir(server_dir):
            pid = name.removeprefix(READER_PREFIX)
            if name.startswith(READER_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(server_dir, name), ignore_errors=True)
        self.bound = bound
        self.server_dir = server_dir
        self.directory = os.path.join(server_dir, f"{READER_PREFIX}{os.getpid()}")
        shutil.rmtree(self.directory, ignore_errors=True)
        os.makedirs(self.directory)
        self._files: OrderedDict[Key, int] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.evictions = 0
        self._peers: list[str] = []
        self._listed = float("-inf")
        self.maps = (FileMaps(max_mappings)
                     if filesystem_type(server_dir) in MEMORY_FILESYSTEMS else None)

    def _path(self, key: Key, directory: str | None = None) -> str:
        return os.path.join(directory or self.directory, f"{key[0]}-{key[1]}")

    def get(self, key: Key) -> Sample | None:
        """The sample of ``key`` read from this reader's file (now its most recently used) or
        from a sibling's, or None."""
        if key in self._files:
            try:
                sample = decode_sample(self._read(self._path(key)))
            except (OSError, ValueError):
                self._drop(key)
                return None
            self._files.move_to_end(key)
            self.hits += 1
            return sample
        for peer in self._peer_dirs():
            try:
                sample = decode_sample(self._read(self._path(key, peer)))
            except (OSError, ValueError):
                continue
            self.hits += 1
            return sample
        return None

    def mapped(self, key: Key) -> Sample | None:
        """The sample of this reader's file of ``key`` as a mapping of it (not counted as a
        hit), or None: the tier does not map its files (not a memory filesystem), none is
        free, or the file cannot be read."""
        if self.maps is None or key not in self._files:
            return None
        try:
            with open(self._path(key), "rb") as f:
                data = self.maps.map(f.fileno(), os.fstat(f.fileno()).st_size)
            return None if data is None else decode_sample(data)
        except (OSError, ValueError):
            return None

    def _read(self, path: str) -> bytes | memoryview:
        """The bytes of the file ``path``: mapped on a memory filesystem (while fewer than
        ``max_mappings`` are), else read.

        Raises:
            OSError: it cannot be opened or read.
        """
        with open(path, "rb") as f:
            if self.maps is not None:
                mapped = self.maps.map(f.fileno(), os.fstat(f.fileno()).st_size)
                if mapped is not None:
                    return mapped
            return f.read()

    def _peer_dirs(self) -> list[str]:
        """The sibling readers' directories, listed again at most every ``PEERS_EVERY_S``."""
        now = time.monotonic()
        if now - self._listed >= PEERS_EVERY_S:
            self._listed = now
            try:
                names = os.listdir(self.server_dir)
            except OSError:
                names = []
            self._peers = [os.path.join(self.server_dir, n) for n in sorted(names)
                           if n.startswith(READER_PREFIX)
                           and os.path.join(self.server_dir, n) != self.directory]
        return self._peers

    def put(self, key: Key, sample: Sample) -> bool:
        """Write ``sample``'s file, removing the least recently used first so the bound holds;
        one larger than the bound is not written.

        Returns:
            Whether it is written.
        """
        if key in self._files:
            self._drop(key)
        try:
            pieces = encode_sample(sample)
        except (TypeError, ValueError):
            return False
        size = sum(piece.nbytes for piece in pieces)
        if size > self.bound:
            return False
        while self.bytes + size > self.bound:
            self._drop(next(iter(self._files)))
            self.evictions += 1
        path = self._path(key)
        temp = os.path.join(self.directory, TEMP_PREFIX + os.path.basename(path))
        try:
            with open(temp, "wb") as f:
                f.writelines(pieces)
            os.replace(temp, path)
        except OSError:
            self._drop(key)
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            return False
        self._files[key] = size
        self.bytes += size
        return True

    def _drop(self, key: Key) -> None:
        self.bytes -= self._files.pop(key, 0)
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Remove this reader's files (idempotent)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self._files.clear()
        self.bytes = 0
