"""Dataset specs -> shard lists, and opening shard files wherever they live.

A dataset spec is a string naming one or more shards:

* a local path to a shard file, or a directory (every shard file below it);
* a glob (``data/*.parquet``);
* WebDataset-style braces: ranges ``train-{000000..000127}.tar`` (zero-padded width kept)
  and lists ``{train,val}-0.tar``;
* an fsspec URL (``file://``, ``memory://``, ``s3://`` with s3fs, ``http(s)://``), with the
  same globs, braces and directories.

:func:`resolve` turns one or more specs into a deterministic shard list: sorted within each
spec, specs kept in the order given, duplicates dropped. Local shards come back as plain
absolute paths so readers can memory-map them.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Sequence
from typing import IO

from dataflow.errors import ConfigError, SpecError
from dataflow.remote import Remote, RemoteConfig, RemoteFailure, session

SHARD_EXTENSIONS = (".arrow", ".feather", ".ipc", ".parquet", ".tar", ".tar.gz", ".tgz")
INDEX_SUFFIX = ".dfidx"
"""Suffix of the tar member indexes cached beside shards; such files are never shards."""

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_local(url: str) -> bool:
    """Whether ``url`` is a plain path or a ``file://`` URL."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The absolute filesystem path of a local ``url`` (a path or a ``file://`` URL)."""
    if url.startswith("file://"):
        url = url[len("file://") :]
    return os.path.abspath(os.path.expanduser(url))


def open_file(url: str, remote: RemoteConfig | None = None) -> IO[bytes]:
    """Open a shard for binary reading, locally or through fsspec.

    Args:
        url: a local path or any URL fsspec understands.
        remote: storage options for a remote URL.

    Returns:
        A seekable binary file object; the caller closes it.
    """
    if is_local(url):
        return open(local_path(url), "rb")
    fs, path = session(remote or RemoteConfig()).fs(url)
    return fs.open(path, "rb")


def is_shard_name(name: str) -> bool:
    """Whether a file name carries one of :data:`SHARD_EXTENSIONS`."""
    return name.lower().endswith(SHARD_EXTENSIONS)


def expand_braces(spec: str) -> list[str]:
    """Expand every ``{a..b}`` range and ``{x,y}`` list in ``spec``, in order.

    Ranges keep the zero-padded width of their first bound (``{008..010}`` -> ``008 009 010``).

    Raises:
        SpecError: a brace group is empty, unbalanced, or a descending range.
    """
    if spec.count("{") != spec.count("}"):
        raise SpecError(f"{spec!r}: unbalanced braces")
    parts: list[list[str]] = []
    pos = 0
    for m in _BRACE.finditer(spec):
        parts.append([spec[pos : m.start()]])
        parts.append(_brace_items(spec, m.group(1)))
        pos = m.end()
    parts.append([spec[pos:]])
    out = ["".join(p) for p in itertools.product(*parts)]
    if any("{" in o or "}" in o for o in out):
        raise SpecError(f"{spec!r}: nested braces are not supported")
    return out


def _brace_items(spec: str, body: str) -> list[str]:
    m = _RANGE.match(body)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise SpecError(f"{spec!r}: brace range {{{body}}} is descending")
        width = len(m.group(1)) if m.group(1).startswith("0") else 0
        return [str(i).zfill(width) for i in range(lo, hi + 1)]
    items = body.split(",")
    if body == "" or any(i == "" for i in items):
        raise SpecError(f"{spec!r}: empty item in brace group {{{body}}}")
    return items


def resolve(specs: str | Sequence[str], remote: RemoteConfig | None = None) -> list[str]:
    """Resolve dataset specs to a deterministic, de-duplicated list of shard URLs/paths.

    Remote specs are listed once here (a server lists its dataset once at start; reader
    processes and trainer ranks never list).

    Args:
        specs: one spec or a sequence of specs (see the module docstring).
        remote: storage options for remote specs.

    Returns:
        Shards sorted within each spec, specs in the order given, first occurrence kept.
        Local shards are absolute paths; remote ones are full URLs.

    Raises:
        SpecError: a spec matches no shard, or a brace expansion names a missing file, or a
            remote store cannot be listed (one line naming the endpoint or bucket).
    """
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise SpecError("no dataset spec given")
    seen: set[str] = set()
    out: list[str] = []
    for spec in specs:
        found = sorted(set(_resolve_one(spec, remote or RemoteConfig())))
        if not found:
            raise SpecError(f"{spec!r} matches no shard")
        for shard in found:
            if shard not in seen:
                seen.add(shard)
                out.append(shard)
    return out


def _resolve_one(spec: str, remote: RemoteConfig) -> list[str]:
    expanded = expand_braces(spec)
    braced = len(expanded) > 1
    found: list[str] = []
    for pattern in expanded:
        matches = (_local_matches(pattern) if is_local(pattern)
                   else _remote_matches(pattern, session(remote)))
        matches = [m for m in matches if not m.endswith(INDEX_SUFFIX)]
        if braced and not matches and not _GLOB_CHARS.search(pattern):
            raise SpecError(f"{spec!r}: {pattern} does not exist")
        found.extend(matches)
    return found


def _local_matches(pattern: str) -> list[str]:
    path = local_path(pattern)
    if _GLOB_CHARS.search(path):
        hits = glob.glob(path, recursive=True)
    else:
        hits = [path] if os.path.exists(path) else []
    out: list[str] = []
    for hit in hits:
        if os.path.isdir(hit):
            for root, _, files in os.walk(hit):
                out.extend(os.path.join(root, f) for f in files if is_shard_name(f))
        else:
            out.append(hit)
    return out


def _remote_matches(pattern: str, remote: Remote) -> list[str]:
    try:
        fs, path = remote.fs(pattern)
    except ConfigError as e:
        raise SpecError(str(e)) from e

    def listing() -> list[str]:
        hits = fs.glob(path) if _GLOB_CHARS.search(path) else ([path] if fs.exists(path) else [])
        out: list[str] = []
        for hit in hits:
            if fs.isdir(hit):
                out.extend(p for p in fs.find(hit) if is_shard_name(p))
            else:
                out.append(hit)
        if not out and not pattern.startswith(("http://", "https://")):
            fs.ls(path.split("/", 1)[0])  # nothing found: raises if the bucket is the cause
        return out

    try:
        found = remote.call(pattern, listing)
    except RemoteFailure as e:
        raise SpecError(f"{pattern}: cannot list: {e.reason}") from e
    return [fs.unstrip_protocol(p) for p in found]
