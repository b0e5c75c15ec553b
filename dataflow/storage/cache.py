"""On-disk caches of derived shard data: member indexes and local uncompressed copies.

Every cached file is tied to its source shard by an *identity* (size plus mtime for local
files, size plus ETag or modification time for remote ones) and is rebuilt when the identity
changes. Files are written to a temporary name and renamed into place, so concurrent readers
never see a partial file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Mapping
from typing import IO, NamedTuple

from dataflow.errors import RemoteFailure, ShardReadError
from dataflow.storage.remote import RemoteConfig, session
from dataflow.storage.sources import is_local, local_path

_COPY_CHUNK = 8 << 20
_GUNZIP_STEP = 16 << 10
"""Compressed bytes decompressed per step: a damaged stream keeps what the steps before the
damage decoded."""
_FILE_MODE = 0o644


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> str:
    """``$XDG_CACHE_HOME/dataflow``, else ``~/.cache/dataflow``.

    The one place the readers consult the environment.
    """
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dataflow")


def identity(url: str, remote: RemoteConfig | None = None) -> str:
    """A string that changes whenever the shard's content may have changed.

    Args:
        url: the shard.
        remote: how remote shards are reached (default: no storage options).

    Raises:
        ShardReadError: the shard does not exist or cannot be queried.
    """
    if is_local(url):
        try:
            st = os.stat(local_path(url))
        except OSError as e:
            raise ShardReadError(url, f"cannot stat shard: {e}", offset=0) from e
        return stat_identity(st)
    try:
        info = session(remote or RemoteConfig()).info(url)
    except RemoteFailure as e:
        raise ShardReadError(url, f"cannot stat shard: {e.reason}", offset=0) from e
    return info_identity(info)


def stat_identity(st: os.stat_result) -> str:
    """The identity of a local file from its ``stat`` (or ``fstat``): size and mtime."""
    return f"size={st.st_size};mtime_ns={st.st_mtime_ns}"


def info_identity(info: Mapping[str, object]) -> str:
    """The identity of a remote shard from its fsspec ``info``: size plus ETag or time."""
    stamp = next(
        (info[k] for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created")
         if info.get(k) is not None),
        "",
    )
    return f"size={info.get('size')};stamp={stamp}"


def cache_name(url: str, suffix: str) -> str:
    """A file name unique to ``url``: a short hash of the URL (a local shard's absolute path)
    plus the shard's base name."""
    key = local_path(url) if is_local(url) else url
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    base = os.path.basename(url.rstrip("/"))[:80]
    return f"{digest}-{base}{suffix}"


def write_atomic(path: str, write: Callable[[IO[bytes]], object]) -> None:
    """Write a file through ``write(f)`` to a temporary name, then rename it to ``path``.

    Whatever ``write`` returns (e.g. a byte count) is ignored.

    The file is made readable by everyone (mode 0644), like the shards it is derived from.

    Raises:
        OSError: the directory is not writable (nothing is left behind).
    """
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class LocalCopy(NamedTuple):
    """A local copy of a shard.

    Attributes:
        path: where it is.
        damage: for a gzipped shard whose compressed stream is damaged, what is wrong and
            where (the copy then holds what was decompressed before the damage); else
            ``None``.
        identity: the identity of the shard it is a copy of.
    """

    path: str
    damage: str | None
    identity: str


def local_copy(url: str, cache_dir: str, *, gunzip: bool,
               remote: RemoteConfig | None = None) -> LocalCopy:
    """A local, uncompressed copy of a remote and/or gzipped shard, made once.

    The copy lives in ``cache_dir`` with a sidecar ``.id`` file holding the shard's identity,
    the copy's size and any damage to the gzip stream; a copy whose identity or size no
    longer matches is replaced.

    A gzip stream that ends early, or is damaged, yields the data decompressed so far (a
    damaged stream cannot be decoded past the damage): the tar reader then reports the
    truncation at its offset in the decompressed tar (and ``on_error="skip"`` keeps the
    complete samples before it). gzip's CRC covers a whole member, so damage that still
    decodes is only found at the member's end, after the damaged data was written.

    Args:
        url: the shard.
        cache_dir: directory for the copy (created if missing).
        gunzip: decompress while copying.
        remote: how a remote shard is reached.

    Raises:
        ShardReadError: the shard cannot be read.
    """
    ident = identity(url, remote)
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, cache_name(url, ".tar" if gunzip else ".copy"))
    id_path = path + ".id"
    stamp = f"{ident}\ncopy_size="
    try:
        with open(id_path, encoding="utf-8") as f:
            head, _, noted = f.read().partition("\ndamage=")
        if head == f"{stamp}{os.path.getsize(path)}":
            return LocalCopy(path, noted or None, ident)
    except OSError:
        pass
    found: list[str] = []

    def copy(dst: IO[bytes]) -> None:
        if is_local(url):
            opener = open(local_path(url), "rb")
        else:
            fs, path = session(remote or RemoteConfig()).fs(url)
            opener = fs.open(path, "rb")
        with opener as raw:
            if gunzip:
                bad = _gunzip(raw, dst)
                if bad is not None:
                    found.append(bad)
            else:
                shutil.copyfileobj(raw, dst, _COPY_CHUNK)

    try:
        write_atomic(path, copy)
    except OSError as e:
        what = "decompress" if gunzip else "copy"
        raise ShardReadError(url, f"cannot {what} shard into {cache_dir}: {e}") from e
    damage = found[0] if found else None
    stamp += str(os.path.getsize(path)) + (f"\ndamage={damage}" if damage else "")
    write_atomic(id_path, lambda f: f.write(stamp.encode("utf-8")))
    return LocalCopy(path, damage, ident)


def _gunzip(src: IO[bytes], dst: IO[bytes]) -> str | None:
    """Decompress every gzip member of ``src`` into ``dst``; stop quietly where input ends.

    Returns:
        ``None``, or where and how the compressed stream is damaged (decompression stops
        there).
    """
    dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
    read = written = 0
    while chunk := src.read(_GUNZIP_STEP):
        read += len(chunk)
        while chunk:
            try:
                out = dec.decompress(chunk)
            except zlib.error as e:
                return (f"gzip stream damaged (found within compressed bytes "
                        f"{read - len(chunk)}..{read - 1}, after {written} decompressed bytes; "
                        f"damage found only by the CRC lies anywhere before): {e}")
            dst.write(out)
            written += len(out)
            chunk = dec.unused_data if dec.eof else b""
            if dec.eof:
                dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
    dst.write(dec.flush())
    return None
