"""Dataset specs -> shard lists, and opening shard files wherever they live.

A dataset spec is a string naming one or more shards:

* a local path to a shard file, or a directory (every shard file below it);
* a glob (``data/*.parquet``);
* WebDataset-style braces (:func:`expand_braces`): ranges ``train-{000000..000127}.tar``
  (zero-padded width kept), with steps ``{0..100..10}``, lists ``{train,val}-0.tar``, nested;
* an fsspec URL (``file://``, ``memory://``, ``s3://`` with s3fs, ``http(s)://``), with the
  same globs, braces and directories.

:func:`resolve` turns one or more specs into a deterministic shard list: sorted within each
spec, specs kept in the order given, duplicates dropped. Local shards come back as plain
absolute paths so readers can memory-map them.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import IO

from braceexpand import braceexpand

from dataflow.errors import ConfigError, RemoteFailure, SpecError
from dataflow.storage.remote import Remote, RemoteConfig, session

SHARD_EXTENSIONS = (".arrow", ".feather", ".ipc", ".parquet", ".tar", ".tar.gz", ".tgz")
INDEX_SUFFIX = ".dfidx"
"""Suffix of the tar member indexes cached beside shards; such files are never shards."""

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
    """Expand ``spec``'s braces as WebDataset does (the ``braceexpand`` package, bash rules).

    Ranges keep the zero-padded width of their bounds (``{008..010}`` -> ``008 009 010``), may
    step (``{0..10..5}`` -> ``0 5 10``) or descend (``{3..1}``); lists may nest
    (``{a,b{1..2}}`` -> ``a b1 b2``); ``{}`` and a group without a comma or range stay
    literal; a backslash escapes a brace.

    Raises:
        SpecError: the braces are unbalanced.
    """
    try:
        return list(braceexpand(spec))
    except ValueError as e:  # braceexpand.UnbalancedBracesError, not in its type stubs
        raise SpecError(f"{spec!r}: unbalanced braces") from e


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
