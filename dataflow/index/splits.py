"""Hugging Face ``save_to_disk`` layouts: ``DatasetDict`` splits and ``state.json`` shard lists.

A ``DatasetDict`` root holds ``dataset_dict.json`` (``{"splits": [...]}``) and one directory
per split; serving the root would merge the splits, so a split must be chosen (``split=`` /
``--split``, or the spec ``root/train``). A split (or ``Dataset``) directory holds
``state.json`` whose ``_data_files`` list the shards in dataset order; that list is used
instead of a directory listing, so stray files are not served.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from functools import partial

import fsspec

from dataflow.errors import ConfigError, RemoteFailure, SpecError
from dataflow.storage.remote import RemoteConfig, session
from dataflow.storage.sources import is_local, local_path, resolve

DICT_FILE = "dataset_dict.json"
STATE_FILE = "state.json"


def _fs(spec: str, remote: RemoteConfig | None) -> tuple[fsspec.AbstractFileSystem, str]:
    if is_local(spec):
        return fsspec.filesystem("file"), os.path.abspath(local_path(spec))
    try:
        return session(remote or RemoteConfig()).fs(spec)
    except ConfigError as e:
        raise SpecError(str(e)) from e


def _probe(spec: str, remote: RemoteConfig | None, fn: Callable[[], bool]) -> bool:
    """``fn()`` (a metadata request), for a remote spec under the remote layer's retries and
    one-line errors."""
    if is_local(spec):
        return fn()
    try:
        return session(remote or RemoteConfig()).call(spec, fn)
    except RemoteFailure as e:
        raise SpecError(f"{spec}: cannot list: {e.reason}") from e


def _join(spec: str, name: str) -> str:
    return spec.rstrip("/") + "/" + name


def _read_json(fs: fsspec.AbstractFileSystem, path: str, what: str) -> dict:
    try:
        with fs.open(path, "rb") as f:
            obj = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise SpecError(f"{path}: not a readable {what}: {e}") from e
    if not isinstance(obj, dict):
        raise SpecError(f"{path}: not a readable {what}: not a JSON object")
    return obj


def _choose_split(spec: str, fs: fsspec.AbstractFileSystem, path: str,
                  split: str | None) -> str:
    obj = _read_json(fs, _join(path, DICT_FILE), DICT_FILE)
    splits = [str(s) for s in obj.get("splits", [])]
    if split is None:
        example = _join(spec, splits[0] if splits else "NAME")
        raise SpecError(f"{spec} is a Hugging Face DatasetDict with splits {splits}; choose "
                        f"one with --split NAME (or serve {example})")
    if split not in splits:
        raise SpecError(f"{spec}: no split {split!r}; its splits are {splits}")
    return _join(spec, split)


def _state_files(spec: str, fs: fsspec.AbstractFileSystem, path: str) -> list[str] | None:
    """The shards ``state.json`` lists, in its order, or ``None`` without one."""
    if not fs.isfile(_join(path, STATE_FILE)):
        return None
    obj = _read_json(fs, _join(path, STATE_FILE), STATE_FILE)
    files = obj.get("_data_files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(
            f.get("filename"), str) for f in files):
        raise SpecError(f"{_join(spec, STATE_FILE)}: `_data_files` is not a list of "
                        "{\"filename\": ...} entries")
    return [_join(spec, f["filename"]) for f in files]


def dataset_shards(specs: str | Sequence[str], split: str | None = None,
                   remote: RemoteConfig | None = None) -> tuple[list[str], str | None]:
    """Resolve specs like :func:`dataflow.storage.sources.resolve`, honouring HF layouts.

    Returns:
        The shards, and the directory a single directory spec names (the root hive
        partitions are read under), else ``None``.

    Raises:
        SpecError: a DatasetDict root without a (valid) split, ``split`` given but no spec is
            a DatasetDict root, or a malformed ``state.json``/``dataset_dict.json``.
    """
    specs = [specs] if isinstance(specs, str) else list(specs)
    out: list[str] = []
    used_split = False
    root = None
    for spec in specs:
        fs, path = _fs(spec, remote)
        if not _probe(spec, remote, partial(fs.isdir, path)):
            out.append(spec)
            continue
        if _probe(spec, remote, partial(fs.isfile, _join(path, DICT_FILE))):
            spec = _choose_split(spec, fs, path, split)
            used_split = True
            fs, path = _fs(spec, remote)
        files = _state_files(spec, fs, path)
        out.extend(files if files is not None else [spec])
        if len(specs) == 1:
            root = (path if is_local(spec) else spec).rstrip("/") + "/"
    if split is not None and not used_split:
        raise SpecError(f"--split {split!r} given, but no spec is a Hugging Face DatasetDict "
                        f"root (a directory with {DICT_FILE})")
    return resolve(out, remote), root
